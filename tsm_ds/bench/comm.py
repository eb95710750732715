"""``tsm-ds bench comm``: gradient communication per optimizer step, fp32 vs bf16/fp16 vs 1-bit.

The parent process (:func:`launch`) starts ``world_size`` ranks through the ``deepspeed`` launcher
(gloo on CPU, NCCL on GPUs, ``OMP_NUM_THREADS=1`` per rank on CPU unless set) running the command
module :mod:`tsm_ds.cli.bench_comm` with ``--worker``, whose ranks call :func:`worker`. Every rank
builds a DeepSpeed engine (ZeRO stage 0, fp32) around a model with the gradient layout of
TSM-ResNet-50 (``build_model("resnet50", 400)``: 24,327,632 parameters in
161 tensors; a flat parameter of ``numel`` elements when tsm_ds.models is unavailable or
``flat`` is set), fills the gradients with fixed random values and times, interleaved over
``reps`` repetitions (median reported):

- ``fp32``: DeepSpeed's own all-reduce (``engine.allreduce_gradients()``);
- ``bf16`` / ``fp16``: the same with ``engine.communication_data_type`` set as the
  ``communication_data_type`` recipes do (the gradient is cast, all-reduced, cast back);
- ``onebit``: :class:`tsm_ds.engine.comm.compression.OneBitCompressor` after its warm-up
  (``freeze_step`` 0), i.e. the compressed two-phase exchange.

Bytes per rank and step follow the collective's usual algorithm: ring all-reduce 2 (w-1)/w x
payload, all-to-all (w-1)/w x payload, ring all-gather (w-1) x own part. They are computed from the
tensors handed to the collectives, not sniffed from the wire. ``rel_error`` is
||result - exact fp32 mean|| / ||exact mean|| of one step (for 1-bit a single step is coarse by
design: error feedback carries the rest into later steps).

Rank 0 writes ``comm.json`` / ``comm.md`` via :func:`tsm_ds.utils.io.write_report`.
"""
from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["TSM_R50_NUMEL", "METHODS", "CommLaunchError", "check_methods", "worker_argv", "launch",
           "worker", "slowest_rank"]

_LOG = logging.getLogger(__name__)
#: gradient elements of TSM-ResNet-50 with a 400-class head (the flat parameter's default size)
TSM_R50_NUMEL = 24_327_632
#: the methods measured, in table order
METHODS: tuple[str, ...] = ("fp32", "bf16", "fp16", "onebit")
#: the module the launcher runs on every rank (a command line, not an import)
WORKER_MODULE = "tsm_ds.cli.bench_comm"


class CommLaunchError(RuntimeError):
    """The launcher failed (``returncode``) or did not finish in time (``returncode`` None)."""

    def __init__(self, message: str, returncode: int | None):
        super().__init__(message)
        self.returncode = returncode


def check_methods(methods: Sequence[str]) -> list[str]:
    """The method names, stripped, empty ones dropped.

    Raises:
        ValueError: a name not in :data:`METHODS` (the message lists them).
    """
    out = [m.strip() for m in methods if m.strip()]
    bad = sorted(set(out) - set(METHODS))
    if bad:
        raise ValueError(f"unknown methods {bad}; use {','.join(METHODS)}")
    return out


def worker_argv(out_dir: str | os.PathLike, *, methods: Sequence[str] = METHODS, reps: int = 7,
                warmup: int = 2, flat: bool = False, numel: int = TSM_R50_NUMEL,
                chunk_size: int = 1024) -> list[str]:
    """The arguments every rank's :mod:`tsm_ds.cli.bench_comm` gets (``--worker`` and every
    measurement option), written by :func:`tsm_ds.config.to_argv` from
    :data:`tsm_ds.config.tools.BENCH_COMM`."""
    from tsm_ds.config import Config, to_argv
    from tsm_ds.config.tools import BENCH_COMM

    return to_argv(BENCH_COMM, Config, {
        "bench_comm.out_dir": str(out_dir), "bench_comm.reps": int(reps), "bench_comm.warmup": int(warmup),
        "bench_comm.flat": bool(flat), "bench_comm.numel": int(numel), "bench_comm.chunk_size": int(chunk_size),
        "bench_comm.methods": tuple(methods), "bench_comm.worker": True}, only_changed=False)


def launch(out_dir: str | os.PathLike, *, world_size: int = 2, methods: Sequence[str] = METHODS,
           reps: int = 7, warmup: int = 2, flat: bool = False, numel: int = TSM_R50_NUMEL,
           chunk_size: int = 1024, timeout: float = 1500.0,
           log: Callable[[str], Any] = _LOG.info) -> Path:
    """Run the benchmark: ``deepspeed --num_gpus world_size --module tsm_ds.cli.bench_comm
    --worker ...`` on this machine; rank 0 writes ``comm.json`` / ``comm.md`` into ``out_dir``.

    Without a GPU the ranks use DeepSpeed's CPU accelerator and one OpenMP thread each (unless
    ``DS_ACCELERATOR`` / ``OMP_NUM_THREADS`` are set). The ranks' output goes to this process's
    stdout / stderr; ``log`` gets the launcher command line.

    Args:
        out_dir: folder of the report (made absolute: the ranks may start elsewhere).
        world_size: ranks; methods: subset of :data:`METHODS`; reps / warmup: timed / untimed
            repetitions; flat / numel: one flat parameter of ``numel`` elements instead of the
            TSM-R50 layout; chunk_size: 1-bit elements per scale; timeout: seconds.

    Returns:
        The path of ``comm.md`` (it exists when rank 0 got that far).

    Raises:
        ValueError: an unknown method.
        CommLaunchError: the launcher exited non-zero or ran past ``timeout``.
    """
    import torch

    from tsm_ds.engine.comm.dist import free_port, launcher_command

    methods = check_methods(methods)
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")     # threads per rank: set_threads in each rank
    out = Path(out_dir).resolve()
    cmd = [*launcher_command(), "--num_gpus", str(world_size), "--master_port", str(free_port()),
           "--module", WORKER_MODULE,
           *worker_argv(out, methods=methods, reps=reps, warmup=warmup, flat=flat, numel=numel,
                        chunk_size=chunk_size)]
    log("+ " + " ".join(cmd))
    try:
        rc = subprocess.run(cmd, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        raise CommLaunchError(f"launcher did not finish in {timeout:.0f} s", None) from None
    if rc != 0:
        raise CommLaunchError(f"launcher exited with {rc}", rc)
    return out / "comm.md"


def _model(flat: bool, numel: int):
    """(module, description): TSM-ResNet-50 (400 classes), or one flat parameter of ``numel``."""
    import torch
    if not flat:
        try:
            from tsm_ds.models import build_model
            return build_model("resnet50", 400, num_segments=8), "TSM-ResNet-50 (400 classes)"
        except ImportError:
            pass
    return torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(numel))]), f"flat {numel}"


def worker(out_dir: str | os.PathLike, *, methods: Sequence[str] = METHODS, reps: int = 7,
           warmup: int = 2, flat: bool = False, numel: int = TSM_R50_NUMEL, chunk_size: int = 1024,
           log: Callable[[str], Any] = _LOG.info) -> Path | None:
    """One rank of the benchmark (under the ``deepspeed`` launcher: ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``... in the environment). Every rank measures; rank 0 writes the report.

    Args: as :func:`launch`; ``log`` gets rank 0's "wrote ..." line.

    Returns:
        ``comm.json``'s path on rank 0, None on the other ranks.

    Raises:
        ValueError: an unknown method.
    """
    import deepspeed
    import torch
    import torch.distributed as dist

    from tsm_ds.engine.comm.compression import build_compressor
    from tsm_ds.utils.io import write_report

    methods = check_methods(methods)

    from tsm_ds.engine.comm.dist import init_distributed, set_threads

    cuda = torch.cuda.is_available()
    set_threads()   # ranks sharing a CPU split its cores (2 unpinned ranks on 2 cores: ~10x slower)
    rank, world = init_distributed()
    model, layout = _model(flat, numel)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "steps_per_print": 10 ** 9, "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
           "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    engine.enable_backward_allreduce = False
    params = [p for p in engine.module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    gen = torch.Generator().manual_seed(1000 + rank)
    local = [torch.randn(p.shape, generator=gen).to(p.device) for p in params]
    # the exact fp32 mean, for the error column
    flat_local = torch.cat([g.reshape(-1) for g in local])
    exact = flat_local.clone()
    dist.all_reduce(exact)
    exact.div_(world)
    exact_norm = float(exact.norm())
    comp = build_compressor({"type": "onebit", "freeze_step": 0, "chunk_size": chunk_size}, engine)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def reset():
        for p, g in zip(params, local):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)

    times = {m: [] for m in methods}
    extra = {m: {} for m in methods}
    sums = {m: torch.zeros_like(exact) for m in methods}
    calls = warmup + reps
    for rep in range(calls):
        for m in methods:                               # interleaved: load drifts hit every method alike
            reset()
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            if m == "onebit":
                comp.allreduce(params)
            else:
                engine.communication_data_type = dtypes[m]
                engine.allreduce_gradients()
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if rep >= warmup:
                times[m].append(dt)
                if m == "onebit":
                    st = comp.stats()
                    extra[m].setdefault("compress_s", []).append(st["compression/compress_s"])
                    extra[m].setdefault("comm_s", []).append(st["compression/comm_s"])
                    extra[m]["bytes"] = st["compression/bytes_sent"]
            out = torch.cat([p.grad.reshape(-1).float() for p in params])
            sums[m].add_(out)
            if rep == 0:
                extra[m]["rel_error_1step"] = float((out - exact).norm()) / exact_norm
            del out
    for m in methods:
        extra[m]["rel_error_mean"] = float((sums[m].div_(calls) - exact).norm()) / exact_norm
    # every rank's median: the slowest rank is the step time
    slowest = slowest_rank([statistics.median(times[m]) for m in methods], world)
    if rank != 0:
        return None
    step_s = dict(zip(methods, slowest))
    ring = 2.0 * (world - 1) / world
    rows = []
    ref_bytes = ring * 4 * numel
    for m in methods:
        if m == "onebit":
            sent = float(extra[m]["bytes"])
            lay = comp.layout                           # phase-1 message: sign bits + chunk scales
            payload = lay.padded // 8 + 4 * lay.world_size * lay.k
        else:
            esz = torch.tensor([], dtype=dtypes[m]).element_size()
            payload = numel * esz
            sent = ring * payload
        row = {"method": m, "bytes_sent_per_rank": sent, "payload_bytes": payload,
               "bytes_ratio_vs_fp32": ref_bytes / sent, "time_ms": 1e3 * step_s[m],
               "time_ratio_vs_fp32": step_s["fp32"] / step_s[m] if "fp32" in step_s else None,
               "rel_error_1step": extra[m]["rel_error_1step"], "rel_error_mean": extra[m]["rel_error_mean"],
               "compress_ms": None, "collectives_ms": None}
        if m == "onebit":
            row["compress_ms"] = 1e3 * statistics.median(extra[m]["compress_s"])
            row["collectives_ms"] = 1e3 * statistics.median(extra[m]["comm_s"])
        rows.append(row)
    meta = {"gradient": f"{layout}: {numel:,} fp32 elements ({4 * numel / 1e6:.1f} MB)",
            "world_size": world, "backend": dist.get_backend(),
            "launcher": "deepspeed --num_gpus", "reps": reps, "warmup_reps": warmup,
            "threads_per_rank": torch.get_num_threads(), "onebit_chunk_size": chunk_size,
            "bytes_model": "ring all-reduce 2(w-1)/w x payload; 1-bit: all-to-all (w-1)/w x (bits+scales) "
                           "+ ring all-gather (w-1) x own (bits+scales)",
            "time": "median over interleaved reps, slowest rank; onebit includes quantise/pack/decode",
            "rel_error": "||result - exact fp32 mean|| / ||exact mean||: rel_error_1step on the first call "
                         "(fresh error buffers), rel_error_mean of the mean of all calls on the same gradient "
                         "(error feedback makes the 1-bit mean converge)",
            "note": "CPU machine shared with other jobs: times are noisy; compare ratios within one run"}
    json_path, md_path = write_report("comm", rows, out_dir, meta=meta, title="Gradient communication per step")
    log(f"wrote {json_path} and {md_path.name}")
    return json_path


def slowest_rank(values: list[float], world: int) -> list[float]:
    """Per entry, the largest of every rank's value (a step takes the slowest rank's time); a
    collective: every rank calls it. The tensors live on the backend's device
    (:func:`tsm_ds.engine.comm.dist.collective_device`: NCCL refuses CPU tensors)."""
    import torch
    import torch.distributed as dist

    from tsm_ds.engine.comm.dist import collective_device

    dev = collective_device()
    mine = torch.tensor(values, dtype=torch.float64, device=dev)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return torch.stack(every).max(dim=0).values.cpu().tolist()
