"""``tsm-ds bench data``: clip decoding throughput, our loader against the alternatives, and
training items per core by data format (:mod:`tsm_ds.bench.data`,
:mod:`tsm_ds.bench.data_formats`). Writes ``data.json`` / ``data.md``.

Options: :data:`tsm_ds.config.tools.BENCH_DATA` (section ``bench_data`` and ``--data``, which
``$TSM_DS_DATA`` sets when the flag is not given).
"""
from __future__ import annotations

import argparse
import os

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
                                  cache=b.cache, loaders=list(b.loaders), formats=list(b.formats),
                                  seconds=b.seconds, format_clips=b.format_clips,
                                  log=lambda s: print(s, flush=True))
    fmt = [r for r in rows if r.get("table") == "formats"]
    rows = [r for r in rows if r.get("table") != "formats"]
    for r in rows:
        cps = r.get("clips_per_s")
        same = r.get("same_frames")
        print(f"  {r['input'][:38]:38s} {r['loader'][:38]:38s} "
              + (f"{cps:8.2f} clips/s" + (f"  same={same:.2f}" if same is not None else "")
                 if cps else r.get("error", "")))
    if fmt:
        print("  training items per core (1 DataLoader worker, uint8, warm page cache):")
    for r in fmt:
        if not r.get("clips_per_s_per_core"):
            print(f"  {r['input'][:38]:38s} {r['format']:18s} {r.get('error', '')}")
            continue
        ratio = "".join(f"  x{r[k]:.2f} {k[3:]}" for k in ("vs_raw", "vs_frames") if r.get(k))
        print(f"  {r['input'][:38]:38s} {r['format']:18s} {r['clips_per_s_per_core']:8.2f} clips/s/core{ratio}"
              f"  {r['bytes_per_clip'] / 1e3:8.1f} kB/clip  {r['files_per_video']:.0f} file(s)"
              f"  A100 {r['cores_a100']:.1f} cores, H100/H200 {r['cores_h100']:.1f}")
    print(f"bench data: wrote {jp} and {mp}")
    return 0 if rows else 1


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
