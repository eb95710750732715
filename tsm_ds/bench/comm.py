"""``tsm-ds bench comm``: gradient communication per optimizer step, fp32 vs bf16/fp16 vs 1-bit.

The parent process starts ``--world-size`` ranks through the ``deepspeed`` launcher (gloo on CPU,
NCCL on GPUs, ``OMP_NUM_THREADS=1`` per rank on CPU unless set) running this module with
``--worker``. Every rank builds a DeepSpeed engine (ZeRO stage 0, fp32) around a model with the
gradient layout of TSM-ResNet-50 (``build_model("resnet50", 400)``: 24,327,632 parameters in
161 tensors; a flat parameter of ``--numel`` elements when tsm_ds.models is unavailable or
``--flat`` is given), fills the gradients with fixed random values and times, interleaved over
``--reps`` repetitions (median reported):

- ``fp32``: DeepSpeed's own all-reduce (``engine.allreduce_gradients()``);
- ``bf16`` / ``fp16``: the same with ``engine.communication_data_type`` set as the
  ``communication_data_type`` recipes do (the gradient is cast, all-reduced, cast back);
- ``onebit``: :class:`tsm_ds.engine.compression.OneBitCompressor` after its warm-up
  (``freeze_step`` 0), i.e. the compressed two-phase exchange.

Bytes per rank and step follow the collective's usual algorithm: ring all-reduce 2 (w-1)/w x
payload, all-to-all (w-1)/w x payload, ring all-gather (w-1) x own part. They are computed from the
tensors handed to the collectives, not sniffed from the wire. ``rel_error`` is
||result - exact fp32 mean|| / ||exact mean|| of one step (for 1-bit a single step is coarse by
design: error feedback carries the rest into later steps).

Rank 0 writes ``comm.json`` / ``comm.md`` via :func:`tsm_ds.bench.report.write_report`.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

TSM_R50_NUMEL = 24_327_632


def build_parser() -> argparse.ArgumentParser:
    """The options of ``tsm-ds bench comm``."""
    p = argparse.ArgumentParser(prog="tsm-ds bench comm", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="bench_out", help="folder for comm.json / comm.md")
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes) on this machine")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per method (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions first")
    p.add_argument("--quick", action="store_true", help="3 reps, 1 warm-up (same gradient size)")
    p.add_argument("--flat", action="store_true", help="one flat parameter instead of the TSM-R50 layout")
    p.add_argument("--numel", type=int, default=TSM_R50_NUMEL, help="elements of the flat parameter")
    p.add_argument("--chunk-size", type=int, default=1024, help="1-bit: elements per scale (the JSON default)")
    p.add_argument("--methods", default="fp32,bf16,fp16,onebit", help="comma list of fp32,bf16,fp16,onebit")
    p.add_argument("--timeout", type=float, default=1500.0, help="seconds before the launcher is stopped")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (parent: start the launcher; ``--worker``: one rank). Returns 0 on success.

    Raises:
        SystemExit: bad options (argparse).
    """
    args = build_parser().parse_args(argv)
    if args.quick:
        args.reps, args.warmup = min(args.reps, 3), min(args.warmup, 1)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - {"fp32", "bf16", "fp16", "onebit"})
    if bad:
        print(f"tsm-ds bench comm: unknown --methods {bad}; use fp32,bf16,fp16,onebit", file=sys.stderr)
        return 2
    if args.worker:
        _worker(args, methods)
        return 0
    return _launch(args, argv or [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, argv: list[str]) -> int:
    """Start ``deepspeed --num_gpus W --module tsm_ds.bench.comm --worker ...``; show comm.md."""
    import torch
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", "1")      # 2 ranks on 2 cores: 10x slower with default threads
    launcher = os.path.join(bindir, "deepspeed")
    if not os.path.exists(launcher):
        launcher = "deepspeed"
    out_dir = str(Path(args.out_dir).resolve())
    passthru = [a for a in argv if a not in ("--quick",)]
    passthru = _replace_opt(passthru, "--out-dir", out_dir)
    if args.quick:
        passthru += ["--reps", str(args.reps), "--warmup", str(args.warmup)]
    cmd = [launcher, "--num_gpus", str(args.world_size), "--master_port", str(_free_port()),
           "--module", "tsm_ds.bench.comm", "--worker", *passthru]
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    try:
        rc = subprocess.run(cmd, env=env, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"tsm-ds bench comm: launcher did not finish in {args.timeout:.0f} s", file=sys.stderr)
        return 1
    if rc != 0:
        print(f"tsm-ds bench comm: launcher exited with {rc}", file=sys.stderr)
        return rc
    md = Path(out_dir) / "comm.md"
    if md.is_file():
        print(md.read_text())
    print(f"(launcher + {args.world_size} ranks: {time.time() - t0:.0f} s)")
    return 0


def _replace_opt(argv: list[str], flag: str, value: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out + [flag, value]


def _model(args):
    import torch
    if not args.flat:
        try:
            from tsm_ds.models import build_model
            return build_model("resnet50", 400, num_segments=8), "TSM-ResNet-50 (400 classes)"
        except ImportError:
            pass
    return torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(args.numel))]), f"flat {args.numel}"


def _worker(args, methods: list[str]) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist

    from tsm_ds.bench.report import write_report
    from tsm_ds.engine.compression import build_compressor

    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    from tsm_ds.engine.dist import release_cpu_shm_at_exit
    release_cpu_shm_at_exit()
    rank, world = dist.get_rank(), dist.get_world_size()
    model, layout = _model(args)
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
    comp = build_compressor({"type": "onebit", "freeze_step": 0, "chunk_size": args.chunk_size}, engine)
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
    calls = args.warmup + args.reps
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
            if rep >= args.warmup:
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
    med = torch.tensor([statistics.median(times[m]) for m in methods], dtype=torch.float64)
    allmed = [torch.empty_like(med) for _ in range(world)]
    dist.all_gather(allmed, med)
    if rank != 0:
        return
    step_s = {m: max(float(t[i]) for t in allmed) for i, m in enumerate(methods)}
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
            "launcher": "deepspeed --num_gpus", "reps": args.reps, "warmup_reps": args.warmup,
            "threads_per_rank": torch.get_num_threads(), "onebit_chunk_size": args.chunk_size,
            "bytes_model": "ring all-reduce 2(w-1)/w x payload; 1-bit: all-to-all (w-1)/w x (bits+scales) "
                           "+ ring all-gather (w-1) x own (bits+scales)",
            "time": "median over interleaved reps, slowest rank; onebit includes quantise/pack/decode",
            "rel_error": "||result - exact fp32 mean|| / ||exact mean||: rel_error_1step on the first call "
                         "(fresh error buffers), rel_error_mean of the mean of all calls on the same gradient "
                         "(error feedback makes the 1-bit mean converge)",
            "note": "CPU machine shared with other jobs: times are noisy; compare ratios within one run"}
    write_report("comm", rows, args.out_dir, meta=meta, title="Gradient communication per step")
    print(f"wrote {Path(args.out_dir) / 'comm.json'} and comm.md", flush=True)


if __name__ == "__main__":
    sys.exit(main())
