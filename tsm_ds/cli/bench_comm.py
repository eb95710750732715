"""``tsm-ds bench comm``: gradient communication per optimizer step, fp32 vs bf16/fp16 vs 1-bit
(:mod:`tsm_ds.bench.comm`).

Without ``--worker`` this starts the ``deepspeed`` launcher, which runs this module again with
``--worker`` on every rank (``deepspeed --module tsm_ds.cli.bench_comm --worker ...``, the
arguments written by :func:`tsm_ds.bench.comm.worker_argv`); rank 0 writes ``comm.json`` /
``comm.md`` and the parent prints the table. Options: :data:`tsm_ds.config.tools.BENCH_COMM`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_COMM

#: the fields this command uses
COMMAND = BENCH_COMM


def build_parser() -> argparse.ArgumentParser:
    """The options of ``tsm-ds bench comm`` (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (parent: start the launcher; ``--worker``: one rank). Returns 0 on
    success, 2 for unknown ``--methods``, the launcher's status (1 on time-out) when it fails.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    b = cfg.bench_comm
    from tsm_ds.bench import comm

    reps, warmup = (min(b.reps, 3), min(b.warmup, 1)) if b.quick else (b.reps, b.warmup)
    try:
        methods = comm.check_methods(b.methods)
    except ValueError as e:
        print(f"tsm-ds bench comm: {e} (--methods)", file=sys.stderr)
        return 2
    opts = dict(methods=methods, reps=reps, warmup=warmup, flat=b.flat, numel=b.numel, chunk_size=b.chunk_size)
    if b.worker:
        comm.worker(b.out_dir, log=lambda s: print(s, flush=True), **opts)
        return 0
    t0 = time.time()
    try:
        md = comm.launch(b.out_dir, world_size=b.world_size, timeout=b.timeout,
                         log=lambda s: print(s, flush=True), **opts)
    except comm.CommLaunchError as e:
        print(f"tsm-ds bench comm: {e}", file=sys.stderr)
        return e.returncode or 1
    if Path(md).is_file():
        print(Path(md).read_text())
    print(f"(launcher + {b.world_size} ranks: {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
