"""``tsm-ds prepare``: pack (default), re-encode or extract JPEG frames of a video dataset, and write lists.

Usage::

    tsm-ds prepare SRC OUT [--list LIST] [--mode packed|video|frames] [--short-side 256]
                   [--keyint 16] [--crf 23] [--preset veryfast] [--workers N]

SRC is a class-per-folder tree (or use ``--list`` with a video list); what is written is described
in :mod:`tsm_ds.data.prepare`. Options: :data:`tsm_ds.config.tools.PREPARE`. Exit status 1 when a
file failed.
"""
from __future__ import annotations

import argparse
import os
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import PREPARE

#: the fields this command uses
COMMAND = PREPARE


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds prepare`` argument parser (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds prepare``; returns 1 when any input failed, else 0.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    p = cfg.prepare
    from tsm_ds.data.prepare import prepare_dataset
    from tsm_ds.data.records import read_class_folders, read_video_list

    src_root = os.path.abspath(p.src)
    classes = None
    if p.list:
        records = read_video_list(p.list, root=src_root)
    else:
        records, classes = read_class_folders(src_root)
    opts = ({"short_side": p.short_side, "keyint": p.keyint, "crf": p.crf, "preset": p.preset}
            if p.mode == "video" else {"short_side": p.short_side})
    rows = prepare_dataset(records, src_root, p.out, mode=p.mode, classes=classes, workers=p.workers, **opts)
    ok = [r for r in rows if r["status"] != "failed"]
    failed = [r for r in rows if r["status"] == "failed"]
    print(f"prepare: {len(ok)} of {len(rows)} files ready in {os.path.abspath(p.out)} (list: all.txt); "
          f"{len(failed)} failed (see prepare_report.json)")
    for r in failed:
        print(f"  failed {r['src']}: {r['reason']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
