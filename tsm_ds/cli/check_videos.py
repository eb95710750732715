"""``tsm-ds check-videos``: scan a dataset and report the files the loader cannot use.

Usage::

    tsm-ds check-videos LIST_OR_DIR [--root DIR] [--full] [--workers N] [--out REPORT_PREFIX]

LIST_OR_DIR is a list file (``path label`` or the official ``frame_dir num_frames label``) or a
class-per-folder tree; statuses are described in :mod:`tsm_ds.data.check`. Writes
``REPORT_PREFIX.json`` and ``REPORT_PREFIX.md``, prints a summary. Exit status 1 when any file is
unreadable, 2 when the source does not exist, else 0.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds check-videos`` argument parser."""
    ap = argparse.ArgumentParser(prog="tsm-ds check-videos", description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="list file (path label | frame_dir num_frames label) or class-folder tree")
    ap.add_argument("--root", default=None, help="root for relative paths in the list (default: the list's folder)")
    ap.add_argument("--full", action="store_true", help="decode every frame (slower; counts decodable frames)")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--out", default=None,
                    help="report prefix (default: ./<source name>.check in the current directory; "
                         "datasets are often read-only)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds check-videos``; returns 1 when any file is unreadable."""
    args = build_parser().parse_args(argv)
    from tsm_ds.data.check import check_records, load_records, write_check_report

    if not Path(args.source).exists():
        print(f"tsm-ds check-videos: {args.source}: no such list file or folder", file=sys.stderr)
        return 2
    records = load_records(args.source, args.root)
    rows = check_records(records, full=args.full, workers=args.workers)
    prefix = Path(args.out) if args.out else Path(Path(str(args.source).rstrip("/")).name + ".check")
    counts = write_check_report(prefix, args.source, rows)
    print(f"{len(rows)} files: {counts['ok']} ok, {counts['partial']} partial, "
          f"{counts['unreadable']} unreadable; report: {prefix}.json / .md")
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['status']:10s} {r['path']}: {r['reason']}")
    return 1 if counts["unreadable"] else 0


if __name__ == "__main__":
    sys.exit(main())
