"""Doctor section ``communication``: the gradient all-reduce per step at this world size.

Under the ``deepspeed`` launcher every rank runs :func:`tsm_ds.bench.comm.worker` (the same
measurement as ``tsm-ds bench comm``: DeepSpeed's all-reduce in fp32 / bf16, the 1-bit
compressor, interleaved repetitions, slowest rank's median) on a flat gradient of the doctor
model's size (the compute section's ``grad_numel``); rank 0 reads its ``comm.json`` (written under
``--out/comm``). Values: ``allreduce_s`` of the recipe's method (its ``communication_data_type`` or
``tsm_ds.compression``; fp32 otherwise), ``allreduce_ms_<method>``, and
``speedup_<method>`` = the recipe method's time / that method's time, ``bytes_ratio_<method>``
= fp32 bytes / that method's bytes.

At world size 1 there is no all-reduce: the section is ``not_measured`` and its notes give the
command that measures it.
"""
from __future__ import annotations

import shlex
from typing import Any

from tsm_ds.doctor.core import Context, section_result

__all__ = ["recipe_comm_method", "launcher_hint", "run"]


def recipe_comm_method(raw: dict) -> str:
    """The all-reduce a recipe trains with: ``onebit`` (``tsm_ds.compression`` of type onebit),
    else its ``communication_data_type`` (``bf16`` / ``fp16``), else ``fp32``."""
    comp = (raw.get("tsm_ds") or {}).get("compression")
    if isinstance(comp, dict) and comp.get("type") == "onebit":
        return "onebit"
    cdt = str(raw.get("communication_data_type") or "fp32").lower()
    return {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "fp32": "fp32",
            "bf16": "bf16", "fp16": "fp16"}.get(cdt, "fp32")


def launcher_hint(ctx: Context, ranks: int = 2) -> str:
    """The command that measures communication: this doctor's model flags under the launcher
    (written by :func:`tsm_ds.config.to_argv` from :data:`tsm_ds.config.tools.DOCTOR`)."""
    from tsm_ds.config import Config, to_argv
    from tsm_ds.config.tools import DOCTOR

    s = ctx.settings
    flags = to_argv(DOCTOR, Config, {
        "engine.deepspeed_config": s.recipe, "model.arch": s.arch, "model.num_segments": s.num_segments,
        "data.img_size": s.img_size, "doctor.only": ("compute", "communication", "verdict"),
        "doctor.quick": bool(s.quick)}, only_changed=False)
    return f"deepspeed --num_gpus {ranks} --module tsm_ds.cli.doctor " + " ".join(shlex.quote(f) for f in flags)


def run(ctx: Context, results: dict) -> dict:
    """The ``communication`` section (see the module docstring); every rank calls it."""
    from tsm_ds.bench import comm
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.utils.io import read_report

    s = ctx.settings
    raw = load_config(s.recipe)
    method = recipe_comm_method(raw)
    if ctx.world == 1:
        hint = launcher_hint(ctx)
        return section_result(
            "communication", title="Communication", status="not_measured",
            summary="not measured: world size 1 has no gradient all-reduce",
            values={"world_size": 1, "recipe_method": method, "how": hint},
            notes=[f"measure it with 2 or more ranks: `{hint}` (several machines: the launcher's "
                   "--hostfile); `tsm-ds bench comm` measures TSM-R50's gradient alone"])
    numel = (results.get("compute") or {}).get("values", {}).get("grad_numel")
    if not numel:
        from tsm_ds.models import build_model
        m = build_model(s.arch, s.num_classes, num_segments=s.num_segments)
        numel = sum(p.numel() for p in m.parameters() if p.requires_grad)
    methods = comm.check_methods(list(dict.fromkeys([method, *s.comm_methods])))
    ctx.progress.note(f"{', '.join(methods)} on {numel:,} elements, {ctx.world} ranks")
    path = comm.worker(ctx.out / "comm", methods=methods, reps=3 if s.quick else 7, warmup=1 if s.quick else 2,
                       flat=True, numel=int(numel), log=lambda line: None)
    if ctx.rank != 0:
        return section_result("communication", title="Communication", summary="(rank 0 reports)")
    payload = read_report(path) or {}
    rows = [r for r in payload.get("rows", []) if isinstance(r, dict)]
    by = {r["method"]: r for r in rows}
    base = by[method]
    values: dict[str, Any] = {"world_size": ctx.world, "backend": payload.get("meta", {}).get("backend"),
                              "grad_numel": int(numel), "recipe_method": method,
                              "allreduce_s": base["time_ms"] / 1e3, "report": str(path)}
    for m, r in by.items():
        values[f"allreduce_ms_{m}"] = r["time_ms"]
        values[f"bytes_ratio_{m}"] = r["bytes_ratio_vs_fp32"]
        if m != method:
            values[f"speedup_{m}"] = base["time_ms"] / r["time_ms"]
    line = (f"{ctx.world} ranks ({values['backend']}), {numel:,} gradient elements: "
            + ", ".join(f"{m} {r['time_ms']:.3g} ms" for m, r in by.items()) + f" per step (recipe: {method})")
    keep = ("method", "time_ms", "bytes_sent_per_rank", "bytes_ratio_vs_fp32", "time_ratio_vs_fp32",
            "rel_error_1step", "compress_ms")
    return section_result("communication", title="Communication", summary=line, values=values,
                          rows=[{k: r.get(k) for k in keep} for r in rows],
                          notes=["times: median of interleaved repetitions, slowest rank; the machine may be "
                                 "shared: compare the ratios"])
