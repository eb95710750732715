"""Doctor section ``onebit`` (``--only onebit``): the 1-bit compressor on this device's tensors.

Two ranks (``torch.multiprocessing`` spawn, gloo over 127.0.0.1, both on this one device) run
:class:`tsm_ds.engine.comm.compression.OneBitCompressor` (``freeze_step`` 0: every call compressed)
for ``steps`` calls on a flat gradient of ``numel`` fp32 elements held on the device (CUDA
tensors through gloo: the path a GPU run without NCCL takes), and the same calls on CPU tensors
with a second compressor. Checks: the device result equals the CPU result (relative L2 difference
below 1e-3: the sign of an element within rounding of zero may differ) and is the same on both
ranks; reported: seconds per call on the device and on CPU (median), the relative error of one
call against the exact fp32 mean. On CPU (``launch/gpu_check.sh --dry-run``) both paths are CPU:
the check then exercises the spawn, the group and the exchange only.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from tsm_ds.doctor.core import Context, section_result

__all__ = ["TOLERANCE", "onebit_device_check", "run"]

#: largest relative L2 difference between the device and the CPU result that passes
TOLERANCE = 1e-3


def _rank(rank: int, world: int, port: int, device: str, numel: int, steps: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from tsm_ds.engine.comm.compression import OneBitCompressor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dev = torch.device(device)
        gen = torch.Generator().manual_seed(1000 + rank)
        grads = [torch.randn(numel, generator=gen) for _ in range(steps)]
        on_dev = OneBitCompressor(freeze_step=0, chunk_size=1024)
        on_cpu = OneBitCompressor(freeze_step=0, chunk_size=1024)
        t_dev, t_cpu, out_dev, out_cpu = [], [], [], []
        for g in grads:
            x = g.to(dev)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            y = on_dev.allreduce_flat(x)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t_dev.append(time.perf_counter() - t)
            out_dev.append(y.cpu())
            t = time.perf_counter()
            out_cpu.append(on_cpu.allreduce_flat(g.clone()))
            t_cpu.append(time.perf_counter() - t)
        exact = grads[0].clone()
        dist.all_reduce(exact)
        exact /= world
        diff = max(float((a - b).norm() / b.norm()) for a, b in zip(out_dev, out_cpu))
        same = torch.stack(out_dev)
        other = same.clone()
        dist.broadcast(other, src=0)
        queue.put({"rank": rank, "rel_diff_vs_cpu": diff, "same_on_ranks": bool(torch.equal(same, other)),
                   "device_s": statistics.median(t_dev), "cpu_s": statistics.median(t_cpu),
                   "rel_error_1step": float((out_dev[0] - exact).norm() / exact.norm()),
                   "bytes_sent": on_dev.stats().get("compression/bytes_sent")})
    finally:
        dist.destroy_process_group()


def onebit_device_check(device: str, *, numel: int = 1 << 20, steps: int = 3, world: int = 2,
                        timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run the check (module docstring) on ``device`` (``"cuda"`` / ``"cuda:0"`` / ``"cpu"``).

    Returns:
        One dict per rank: rel_diff_vs_cpu, same_on_ranks, device_s, cpu_s, rel_error_1step,
        bytes_sent.

    Raises:
        RuntimeError: a rank failed or did not report within ``timeout`` seconds.
    """
    import queue as queue_mod

    import torch.multiprocessing as mp

    from tsm_ds.engine.comm.dist import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = mp.start_processes(_rank, args=(world, free_port(), device, numel, steps, q), nprocs=world,
                               join=False, start_method="spawn")
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world:
            try:
                out.append(q.get(timeout=max(1.0, deadline - time.monotonic())))
            except queue_mod.Empty:
                raise RuntimeError(f"1-bit check: {world - len(out)} rank(s) did not report in "
                                   f"{timeout:.0f} s") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"1-bit check: no result in {timeout:.0f} s")
        procs.join(timeout=60)
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
    return sorted(out, key=lambda r: r["rank"])


def run(ctx: Context, results: dict) -> dict:
    """The ``onebit`` section (see the module docstring)."""
    device = str(ctx.device) if ctx.cuda else "cpu"
    numel = (1 << 16) if ctx.settings.quick else 1 << 22      # the path is checked, not the speed
    ctx.progress.note(f"2 ranks over gloo, {device} tensors, {numel:,} elements")
    rows = onebit_device_check(device, numel=numel)
    ok = all(r["rel_diff_vs_cpu"] < TOLERANCE and r["same_on_ranks"] for r in rows)
    r0 = rows[0]
    values = {"device": device, "numel": numel, "rel_diff_vs_cpu": max(r["rel_diff_vs_cpu"] for r in rows),
              "same_on_ranks": all(r["same_on_ranks"] for r in rows), "device_s": r0["device_s"],
              "cpu_s": r0["cpu_s"], "speedup_device_vs_cpu": r0["cpu_s"] / r0["device_s"],
              "rel_error_1step": r0["rel_error_1step"], "tolerance": TOLERANCE}
    line = (f"{device} tensors over gloo, 2 ranks: {'matches' if ok else 'DIFFERS FROM'} the CPU path "
            f"(rel. diff {values['rel_diff_vs_cpu']:.2g}), {r0['device_s'] * 1e3:.3g} ms per call "
            f"vs {r0['cpu_s'] * 1e3:.3g} ms on CPU")
    return section_result("onebit", title="1-bit compressor on this device", status="ok" if ok else "failed",
                          summary=line, values=values, rows=rows)
