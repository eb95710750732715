"""``tsm-ds bench data``: clip decoding throughput, our loader against the alternatives
(:mod:`tsm_ds.bench.data`). Writes ``data.json`` / ``data.md``.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """Options of ``tsm-ds bench data``."""
    from tsm_ds.bench.data import DEFAULT_DATA, LOADERS

    ap = argparse.ArgumentParser(prog="tsm-ds bench data", description=(
        "Clip decoding throughput, our loader against the alternatives (decode everything, "
        "torchcodec, decord), on real clips and generated long videos; then the training "
        "pipeline through a DataLoader."))
    ap.add_argument("--out-dir", default="bench_out", help="where data.json / data.md go")
    ap.add_argument("--data", default=None if DEFAULT_DATA is None else str(DEFAULT_DATA),
                    help="real clips, as train.py's --data takes them (default: $TSM_DS_DATA, else ../shared/data/videos)")
    ap.add_argument("--quick", action="store_true", help="1-minute generated video, 3 repetitions")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; quick 3)")
    ap.add_argument("--minutes", type=float, default=None, help="generated video length (default 5; quick 1)")
    ap.add_argument("--cache", default=None, help="folder for the generated videos (default <out-dir>/bench_videos)")
    ap.add_argument("--loaders", default=",".join(LOADERS),
                    help="comma-separated; tsm_ds_short256 scales frames to a short side of 256 "
                         "while converting (what VideoClipDataset does in val/test)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds bench data``; returns 0 (1 when no input could be benchmarked).

    Raises:
        SystemExit: bad options (argparse).
    """
    args = build_parser().parse_args(argv)
    from tsm_ds.bench.data import run_data_bench

    rows, jp, mp = run_data_bench(args.out_dir, data=args.data, quick=args.quick, reps=args.reps,
                                  minutes=args.minutes, cache=args.cache, loaders=args.loaders.split(","),
                                  log=lambda s: print(s, flush=True))
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
