"""``tsm-ds bench comm``: gradient communication per optimizer step, fp32 vs bf16/fp16 vs 1-bit
(:mod:`tsm_ds.bench.comm`).

Without ``--worker`` this starts the ``deepspeed`` launcher, which runs this module again with
``--worker`` on every rank (``deepspeed --module tsm_ds.cli.bench_comm --worker ...``); rank 0
writes ``comm.json`` / ``comm.md`` and the parent prints the table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tsm_ds.bench.comm import METHODS, TSM_R50_NUMEL


def build_parser() -> argparse.ArgumentParser:
    """The options of ``tsm-ds bench comm``."""
    p = argparse.ArgumentParser(prog="tsm-ds bench comm", description=(
        "Gradient communication per optimizer step, fp32 vs bf16/fp16 vs 1-bit: bytes and time per "
        "rank, through the deepspeed launcher."))
    p.add_argument("--out-dir", default="bench_out", help="folder for comm.json / comm.md")
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes) on this machine")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per method (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions first")
    p.add_argument("--quick", action="store_true", help="3 reps, 1 warm-up (same gradient size)")
    p.add_argument("--flat", action="store_true", help="one flat parameter instead of the TSM-R50 layout")
    p.add_argument("--numel", type=int, default=TSM_R50_NUMEL, help="elements of the flat parameter")
    p.add_argument("--chunk-size", type=int, default=1024, help="1-bit: elements per scale (the JSON default)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of " + ",".join(METHODS))
    p.add_argument("--timeout", type=float, default=1500.0, help="seconds before the launcher is stopped")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (parent: start the launcher; ``--worker``: one rank). Returns 0 on
    success, 2 for unknown ``--methods``, the launcher's status (1 on time-out) when it fails.

    Raises:
        SystemExit: bad options (argparse).
    """
    args = build_parser().parse_args(argv)
    from tsm_ds.bench import comm

    if args.quick:
        args.reps, args.warmup = min(args.reps, 3), min(args.warmup, 1)
    try:
        methods = comm.check_methods(args.methods.split(","))
    except ValueError as e:
        print(f"tsm-ds bench comm: {e} (--methods)", file=sys.stderr)
        return 2
    opts = dict(methods=methods, reps=args.reps, warmup=args.warmup, flat=args.flat, numel=args.numel,
                chunk_size=args.chunk_size)
    if args.worker:
        comm.worker(args.out_dir, log=lambda s: print(s, flush=True), **opts)
        return 0
    t0 = time.time()
    try:
        md = comm.launch(args.out_dir, world_size=args.world_size, timeout=args.timeout,
                         log=lambda s: print(s, flush=True), **opts)
    except comm.CommLaunchError as e:
        print(f"tsm-ds bench comm: {e}", file=sys.stderr)
        return e.returncode or 1
    if Path(md).is_file():
        print(Path(md).read_text())
    print(f"(launcher + {args.world_size} ranks: {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
