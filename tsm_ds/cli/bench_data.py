"""``tsm-ds bench data``: clip decoding throughput, our loader against the alternatives
(:mod:`tsm_ds.bench.data`). Writes ``data.json`` / ``data.md``.

Options: :data:`tsm_ds.config.tools.BENCH_DATA` (section ``bench_data`` and ``--data``, which
``$TSM_DS_DATA`` sets when the flag is not given).
"""
from __future__ import annotations

import argparse
import os
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_DATA

#: the fields this command uses
COMMAND = BENCH_DATA


def build_parser() -> argparse.ArgumentParser:
    """Options of ``tsm-ds bench data`` (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds bench data``; returns 0 (1 when no input could be benchmarked).

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv, env=os.environ)
    b = cfg.bench_data
    from tsm_ds.bench.data import DEFAULT_DATA, run_data_bench

    data = cfg.data.data if cfg.data.data is not None else DEFAULT_DATA   # ../shared/data/videos
    rows, jp, mp = run_data_bench(b.out_dir, data=data, quick=b.quick, reps=b.reps, minutes=b.minutes,
                                  cache=b.cache, loaders=list(b.loaders), log=lambda s: print(s, flush=True))
    for r in rows:
        cps = r.get("clips_per_s")
        same = r.get("same_frames")
        print(f"  {r['input'][:38]:38s} {r['loader'][:38]:38s} "
              + (f"{cps:8.2f} clips/s" + (f"  same={same:.2f}" if same is not None else "")
                 if cps else r.get("error", "")))
    print(f"bench data: wrote {jp} and {mp}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
