"""Convergence study behind the compression docs: 1-bit vs fp32 all-reduce on a small MLP.

``python studies/compression_study.py --out-dir DIR`` trains a 3-layer MLP (32-128-128-8,
21,800 parameters, ReLU) on a synthetic 8-class task (labels = argmax of a fixed random linear
teacher; 2,048 samples, each of 2 gloo ranks takes every second one) for ``--steps`` optimizer
steps of 32 samples per rank at a constant learning rate, once per (optimizer, communication)
pair and seed, and reports the final full-data cross-entropy (chance: ln 8 = 2.079).

Communication: ``fp32`` (exact mean of the gradients) or ``onebit c=<chunk_size>``
(:class:`tsm_ds.engine.comm.compression.OneBitCompressor`, freeze_step 20). Optimizers: SGD momentum
0.9 lr 0.05, SGD without momentum lr 0.05, ``timm.optim.Lamb`` lr 0.01, ``timm.optim.Lars`` lr 2.

It is a small-scale sanity study (minutes on 2 CPU cores), not evidence about TSM on Kinetics.
Writes ``compression_study.json`` / ``.md`` via :func:`tsm_ds.utils.io.write_report`.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: (name, optimizer factory key, chunk_size or None for fp32)
DEFAULT_RUNS = [
    ("sgd_m0.9", None), ("sgd_m0.9", 65536), ("sgd_m0.9", 4096), ("sgd_m0.9", 1024), ("sgd_m0.9", 256),
    ("sgd_m0", None), ("sgd_m0", 1024),
    ("lamb", None), ("lamb", 1024),
    ("lars", None), ("lars", 1024),
]


def _optimizer(name: str, params):
    import timm.optim
    if name == "sgd_m0.9":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "sgd_m0":
        return torch.optim.SGD(params, lr=0.05)
    if name == "lamb":
        return timm.optim.Lamb(params, lr=0.01)
    if name == "lars":
        return timm.optim.Lars(params, lr=2.0, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}")


def _rank(rank: int, port: int, runs, seeds: int, steps: int, queue) -> None:
    from tsm_ds.engine.comm.compression import OneBitCompressor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(32, 8, generator=g)
    x = torch.randn(2048, 32, generator=g)
    y = (x @ teacher).argmax(1)
    xs, ys = x[rank::2], y[rank::2]
    for opt_name, chunk in runs:
        losses = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                        torch.nn.ReLU(), torch.nn.Linear(128, 8))
            opt = _optimizer(opt_name, model.parameters())
            comp = OneBitCompressor(freeze_step=20, chunk_size=chunk) if chunk else None
            for step in range(steps):
                i = (step * 32) % xs.shape[0]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xs[i:i + 32]), ys[i:i + 32]).backward()
                if comp is not None:
                    comp.allreduce(model.parameters())
                else:
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                        p.grad.div_(2)
                opt.step()
            with torch.no_grad():
                losses.append(float(torch.nn.functional.cross_entropy(model(x), y)))
        if rank == 0:
            queue.put((opt_name, chunk, losses))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run the study and write the report; returns 0."""
    ap = argparse.ArgumentParser(prog="python studies/compression_study.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="bench_out")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    from tsm_ds.utils.io import write_report
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_rank, args=(port, DEFAULT_RUNS, args.seeds, args.steps, queue), nprocs=2,
                       start_method="spawn")
    results = [queue.get() for _ in DEFAULT_RUNS]
    base = {o: statistics.mean(losses) for o, c, losses in results if c is None}
    rows = [{"optimizer": o, "communication": "fp32" if c is None else f"onebit c={c}",
             "final_loss_mean": statistics.mean(losses), "final_loss_per_seed": " ".join(f"{v:.4f}" for v in losses),
             "vs_fp32": statistics.mean(losses) / base[o] if o in base else None} for o, c, losses in results]
    meta = {"model": "MLP 32-128-128-8 (21,800 params)", "ranks": 2, "steps": args.steps, "seeds": args.seeds,
            "batch": "32 per rank", "freeze_step": 20, "chance_loss": 2.079}
    write_report("compression_study", rows, args.out_dir, meta=meta, title="1-bit vs fp32 all-reduce: MLP study")
    print(open(os.path.join(args.out_dir, "compression_study.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
