"""Doctor section ``environment``: versions, accelerator, DeepSpeed's op report, cores, memory, GPUs.

Rows are checks ``{"check", "value", "ok"}``; a row with ``ok`` False fails the section (the
command exits 1): a package training needs does not import (deepspeed, PyAV), or the chosen
recipe is refused on this device (:func:`tsm_ds.engine.config.checks.validate_config`'s message).
DeepSpeed's op report is the one ``ds_report`` prints (op, installed, JIT-compatible), read from
the same DeepSpeed objects; ops are informational (an op is built when a recipe needs it).
"""
from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata
from typing import Any

from tsm_ds.doctor.core import Context, section_result

__all__ = ["run", "memory_gb", "op_report"]


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def memory_gb() -> tuple[float | None, float | None]:
    """(total, available) host memory in GB (10^9 bytes) from /proc/meminfo, None where unknown."""
    vals: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("MemTotal", "MemAvailable"):
                    vals[k] = float(rest.split()[0]) * 1024 / 1e9
    except OSError:
        pass
    return vals.get("MemTotal"), vals.get("MemAvailable")


def op_report() -> list[dict[str, Any]]:
    """DeepSpeed's C++/CUDA op report as rows ``{"op", "installed", "compatible"}`` (what
    ``ds_report`` prints: installed = pre-built for this accelerator, compatible = can be
    JIT-built here). Source: deepspeed/env_report.py ``op_report``.

    Raises:
        ImportError: deepspeed is not installed.
    """
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    from deepspeed.ops.op_builder.builder import probe_is_compatible

    same = accelerator_name == get_accelerator()._name
    return [{"op": name, "installed": bool(installed_ops.get(name, False) and same),
             "compatible": bool(probe_is_compatible(builder, False))}
            for name, builder in ALL_OPS.items()]


def _recipe_check(ctx: Context, device: str) -> tuple[bool, str]:
    """(ok, message): the chosen recipe resolved for this world size and validated for ``device``."""
    from tsm_ds.engine.config.checks import validate_config
    from tsm_ds.engine.config.recipes import ConfigError, load_config
    from tsm_ds.engine.config.resolve import resolve_config

    try:
        raw = load_config(ctx.settings.recipe)
        ds, tsm, _, _ = resolve_config(raw, world_size=ctx.world, train_samples=10 ** 6, epochs=1)
        validate_config(ds, tsm, device=device, has_batchnorm=True)
    except ConfigError as e:
        return False, f"refused: {e}"
    return True, f"valid on {device} at world size {ctx.world}"


def run(ctx: Context, results: dict) -> dict:
    """The ``environment`` section (see the module docstring)."""
    import torch

    rows: list[dict[str, Any]] = []

    def check(name: str, value: Any, ok: bool = True) -> None:
        rows.append({"check": name, "value": value, "ok": ok})

    values: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                              "torchvision": _version("torchvision"), "deepspeed": _version("deepspeed"),
                              "av": _version("av"), "timm": _version("timm"), "numpy": _version("numpy")}
    for k in ("python", "torch", "torchvision", "timm", "numpy"):
        check(k, values[k], values[k] is not None or k in ("timm",))
    accel, backend = None, None
    ctx.progress.note("deepspeed")
    try:
        from deepspeed.accelerator import get_accelerator
        acc = get_accelerator()
        accel, backend = acc.device_name(), acc.communication_backend_name()
        check("deepspeed", values["deepspeed"])
    except Exception as e:  # ImportError, or an accelerator that fails to start
        check("deepspeed", f"does not import: {type(e).__name__}: {e}", False)
    values.update(accelerator=accel, comm_backend=backend)
    check("accelerator (DeepSpeed)", f"{accel} ({backend})", accel is not None)
    try:
        import av
        ffmpeg = getattr(av, "ffmpeg_version_info", None)
        codec = av.library_versions.get("libavcodec")
        values.update(ffmpeg=ffmpeg, libavcodec=".".join(map(str, codec)) if codec else None)
        check("PyAV / FFmpeg", f"av {values['av']}, FFmpeg {ffmpeg}, libavcodec {values['libavcodec']}")
    except ImportError as e:
        check("PyAV / FFmpeg", f"does not import: {e}", False)

    cores = ctx.cores
    total, avail = memory_gb()
    values.update(cores=cores, cpu_count=os.cpu_count(), local_ranks=ctx.local_world,
                  cores_per_device=ctx.cores_per_device, torch_threads=torch.get_num_threads(),
                  memory_total_gb=total, memory_available_gb=avail)
    check("CPU cores (usable / machine)", f"{cores} / {os.cpu_count()}; {ctx.cores_per_device} per device "
          f"({ctx.local_world} local rank(s)); torch threads {torch.get_num_threads()}")
    check("memory", f"{total:.1f} GB, {avail:.1f} GB available" if total and avail else "unknown")
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
        values["load_average_1min"] = load
        # other processes' load slows every timing below (and OpenMP barriers most): said, not failed
        check("load average (1 min)", f"{load:.1f} on {os.cpu_count()} cores"
              + (": busy, timings will be slowed by other processes" if load > (os.cpu_count() or 1) else ""))
    if os.path.isdir("/dev/shm"):
        shm = shutil.disk_usage("/dev/shm")
        values["shm_free_gb"] = shm.free / 1e9
        # DataLoader workers pass batches through /dev/shm: a tiny one (docker's 64 MB) breaks them
        check("/dev/shm (DataLoader workers)", f"{shm.free / 1e9:.2f} GB free of {shm.total / 1e9:.2f}",
              shm.free > 256e6)
    ctx.out.mkdir(parents=True, exist_ok=True)
    values["out_free_gb"] = shutil.disk_usage(ctx.out).free / 1e9
    check("disk free at --out", f"{values['out_free_gb']:.1f} GB")

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    values.update(cuda=torch.cuda.is_available(), gpus=gpus, cuda_version=torch.version.cuda)
    for i in range(gpus):
        p = torch.cuda.get_device_properties(i)
        check(f"GPU {i}", f"{p.name}, {p.total_memory / 2 ** 30:.1f} GiB, compute capability "
              f"{p.major}.{p.minor}, {p.multi_processor_count} SMs")
        values[f"gpu{i}"] = p.name
    if gpus:
        nccl = getattr(torch.cuda, "nccl", None)
        try:
            values["nccl"] = ".".join(map(str, nccl.version())) if nccl else None
        except Exception:   # NCCL absent from this torch build
            values["nccl"] = None
        check("CUDA / NCCL", f"CUDA {torch.version.cuda}, NCCL {values['nccl']}")
    else:
        check("GPUs", "none: DeepSpeed runs on its CPU accelerator (gloo)")

    ok, msg = _recipe_check(ctx, accel or ("cuda" if gpus else "cpu"))
    values["recipe_valid"] = ok
    check(f"recipe {ctx.settings.recipe}", msg, ok)

    if accel is not None:
        ctx.progress.note("DeepSpeed op report")
        try:
            from torch.utils.cpp_extension import is_ninja_available
            check("ninja (JIT-built DeepSpeed ops)", "yes" if is_ninja_available() else "no")
            ops = op_report()
            values["ops_installed"] = sum(r["installed"] for r in ops)
            values["ops_compatible"] = sum(r["compatible"] for r in ops)
            for r in ops:
                check(f"DeepSpeed op {r['op']}", f"installed {'yes' if r['installed'] else 'no'}, "
                      f"JIT-compatible {'yes' if r['compatible'] else 'no'}")
        except Exception as e:  # the report is informational
            check("DeepSpeed op report", f"unavailable: {type(e).__name__}: {e}")
    bad = [r["check"] for r in rows if not r["ok"]]
    summary = (f"torch {values['torch']}, deepspeed {values['deepspeed']}, av {values['av']} "
               f"(FFmpeg {values.get('ffmpeg')}); {accel}; {cores} cores, {gpus} GPU(s)")
    if values.get("load_average_1min", 0) > (os.cpu_count() or 1):
        summary += f"; busy machine (load {values['load_average_1min']:.1f}): timings are slowed, compare ratios"
    if bad:
        summary = f"failed checks: {', '.join(bad)}; " + summary
    return section_result("environment", title="Environment", status="failed" if bad else "ok",
                          summary=summary, values=values, rows=rows)
