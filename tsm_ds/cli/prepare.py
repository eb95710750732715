"""``tsm-ds prepare``: re-encode / resize a video dataset, or extract JPEG frames, and write lists.

Usage::

    tsm-ds prepare SRC OUT [--list LIST] [--mode video|frames] [--short-side 256]
                   [--keyint 16] [--crf 23] [--preset veryfast] [--workers N]

SRC is a class-per-folder tree (or use ``--list`` with a video list); what is written is described
in :mod:`tsm_ds.data.prepare`. Exit status 1 when a file failed.
"""
from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds prepare`` argument parser."""
    ap = argparse.ArgumentParser(prog="tsm-ds prepare", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="class-folder tree (or the root of --list's relative paths)")
    ap.add_argument("out", help="output folder")
    ap.add_argument("--list", default=None, help="video list ('path label') instead of class folders")
    ap.add_argument("--mode", choices=("video", "frames"), default="video")
    ap.add_argument("--short-side", type=int, default=256, help="0 keeps the size")
    ap.add_argument("--keyint", type=int, default=None, help="keyframe interval in frames (video mode)")
    ap.add_argument("--crf", type=int, default=23)
    ap.add_argument("--preset", default="veryfast")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds prepare``; returns 1 when any input failed, else 0."""
    args = build_parser().parse_args(argv)
    from tsm_ds.data.prepare import prepare_dataset
    from tsm_ds.data.records import read_class_folders, read_video_list

    src_root = os.path.abspath(args.src)
    classes = None
    if args.list:
        records = read_video_list(args.list, root=src_root)
    else:
        records, classes = read_class_folders(src_root)
    opts = ({"short_side": args.short_side, "keyint": args.keyint, "crf": args.crf,
             "preset": args.preset} if args.mode == "video" else {"short_side": args.short_side})
    rows = prepare_dataset(records, src_root, args.out, mode=args.mode, classes=classes,
                           workers=args.workers, **opts)
    ok = [r for r in rows if r["status"] != "failed"]
    failed = [r for r in rows if r["status"] == "failed"]
    print(f"prepare: {len(ok)} of {len(rows)} files ready in {os.path.abspath(args.out)} (list: all.txt); "
          f"{len(failed)} failed (see prepare_report.json)")
    for r in failed:
        print(f"  failed {r['src']}: {r['reason']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
