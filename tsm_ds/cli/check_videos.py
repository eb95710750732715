"""``tsm-ds check-videos``: scan a dataset and report the files the loader cannot use.

Usage::

    tsm-ds check-videos LIST_OR_DIR [--root DIR] [--full] [--workers N] [--out REPORT_PREFIX]

LIST_OR_DIR is a list file (``path label`` or the official ``frame_dir num_frames label``) or a
class-per-folder tree; statuses are described in :mod:`tsm_ds.data.check`. Writes
``REPORT_PREFIX.json`` and ``REPORT_PREFIX.md``, prints a summary. Options:
:data:`tsm_ds.config.tools.CHECK_VIDEOS`. Exit status 1 when any file is unreadable, 2 when the
source does not exist, else 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import CHECK_VIDEOS

#: the fields this command uses
COMMAND = CHECK_VIDEOS


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds check-videos`` argument parser (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds check-videos``; returns 1 when any file is unreadable, 2 when the
    source does not exist.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    c = cfg.check_videos
    from tsm_ds.data.check import check_records, load_records, write_check_report

    if not Path(c.source).exists():
        print(f"tsm-ds check-videos: {c.source}: no such list file or folder", file=sys.stderr)
        return 2
    records = load_records(c.source, c.root)
    rows = check_records(records, full=c.full, workers=c.workers)
    prefix = Path(c.out) if c.out else Path(Path(str(c.source).rstrip("/")).name + ".check")
    counts = write_check_report(prefix, c.source, rows)
    print(f"{len(rows)} files: {counts['ok']} ok, {counts['partial']} partial, "
          f"{counts['unreadable']} unreadable; report: {prefix}.json / .md")
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['status']:10s} {r['path']}: {r['reason']}")
    return 1 if counts["unreadable"] else 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
