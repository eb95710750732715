"""``tsm-ds check-videos``: scan a dataset and report the files the loader cannot use.

Usage::

    tsm-ds check-videos LIST_OR_DIR [--root DIR] [--full] [--workers N] [--out REPORT_PREFIX]

LIST_OR_DIR is a list file (``path label`` or the official ``frame_dir num_frames label``) or a
class-per-folder tree. For each video the check opens the file, counts packets (the loader's frame
count) and decodes the 8 validation frames plus the last frame (``--full``: every frame, and counts
how many decode). Status per file:

- ``ok``: every frame asked for decoded;
- ``partial``: the stream ends (or fails) before the packet count (the loader repeats the last
  decoded frame; ``decodable`` says how many frames decode with ``--full``);
- ``unreadable``: cannot open / no video stream / no decodable frame (the loader replaces it).

Writes ``REPORT_PREFIX.json`` (every file) and ``REPORT_PREFIX.md`` (a table of the files that are
not ok), atomically; prints a summary. Exit status 1 when any file is unreadable, else 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

__all__ = ["check_file", "load_records", "main"]


_NOT_MEDIA = {".txt", ".csv", ".md", ".json", ".tmp", ".jpg", ".png"}


def load_records(source: str, root: str | None = None):
    """Records from a list file, a class-folder tree, or a flat folder of media files (every file
    but text/image files is checked, label -1), see the module docstring."""
    from .records import VideoRecord, read_class_folders, read_video_list

    if os.path.isdir(source):
        if any(d.is_dir() for d in Path(source).iterdir()):
            return read_class_folders(source)[0]
        return [VideoRecord(str(p), -1) for p in sorted(Path(source).iterdir())
                if p.is_file() and p.suffix.lower() not in _NOT_MEDIA]
    return read_video_list(source, root)


def check_file(path: str, num_frames: int | None = None, full: bool = False) -> dict:
    """Check one video (or frame folder). Returns a flat dict: path, status, reason, num_frames
    (packet count), decodable (frames decoded; full mode only), width, height, seekable."""
    from . import decode as D
    from .sampling import tsn_val_indices

    row = {"path": path, "status": "ok", "reason": "", "num_frames": None, "decodable": None,
           "width": None, "height": None, "seekable": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            n = num_frames if (num_frames and os.path.isdir(path)) else D.count_frames(path)
            row["num_frames"] = n
            if not os.path.isdir(path):
                row["seekable"] = D.get_index(path).seekable
            st = D.DecodeStats()
            idx = sorted(set(tsn_val_indices(n, 8).tolist() + [n - 1]))
            out = D.decode_frames(path, idx, num_frames=n, stats=st)
            row["height"], row["width"] = int(out.shape[1]), int(out.shape[2])
            if st.missing:
                row["status"] = "partial"
                row["reason"] = st.error or "the stream ends before the packet count"
            if full and not os.path.isdir(path):
                decodable, err = _decode_everything(path)
                row["decodable"] = decodable
                if decodable < n and row["status"] == "ok":
                    row["status"] = "partial"
                    row["reason"] = err or f"{decodable} of {n} frames decode"
        except D.VideoError as e:
            row["status"], row["reason"] = "unreadable", f"{type(e).__name__}: {e.reason}"
        except Exception as e:  # never let one file stop the scan
            row["status"], row["reason"] = "unreadable", f"{type(e).__name__}: {e}"
    return row


def _decode_everything(path: str) -> tuple[int, str]:
    import av

    from . import decode as D

    n, err = 0, ""
    c = D._open(path)
    try:
        s = D._video_stream(c, path)
        s.codec_context.thread_count = 1
        try:
            for _ in c.decode(s):
                n += 1
        except av.FFmpegError as e:
            err = f"{type(e).__name__}: {e}"
    finally:
        c.close()
    return n, err


def _check_star(args):
    return check_file(*args)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds check-videos``; returns 1 when any file is unreadable."""
    from tqdm import tqdm

    from ..bench.report import markdown_table

    ap = argparse.ArgumentParser(prog="tsm-ds check-videos", description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="list file (path label | frame_dir num_frames label) or class-folder tree")
    ap.add_argument("--root", default=None, help="root for relative paths in the list (default: the list's folder)")
    ap.add_argument("--full", action="store_true", help="decode every frame (slower; counts decodable frames)")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--out", default=None,
                    help="report prefix (default: ./<source name>.check in the current directory; "
                         "datasets are often read-only)")
    args = ap.parse_args(argv)

    if not Path(args.source).exists():
        print(f"tsm-ds check-videos: {args.source}: no such list file or folder", file=sys.stderr)
        return 2
    records = load_records(args.source, args.root)
    jobs = [(r.path, r.num_frames, args.full) for r in records]
    if args.workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(args.workers) as ex:
            rows = list(tqdm(ex.map(_check_star, jobs, chunksize=4), total=len(jobs),
                             desc="check-videos", unit="file"))
    else:
        rows = [check_file(*j) for j in tqdm(jobs, desc="check-videos", unit="file")]
    for r, rec in zip(rows, records):
        r["label"] = rec.label
    prefix = Path(args.out) if args.out else Path(Path(str(args.source).rstrip("/")).name + ".check")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "partial", "unreadable")}
    _atomic_write(prefix.with_name(prefix.name + ".json"),
                  json.dumps({"source": str(args.source), "counts": counts, "files": rows}, indent=2) + "\n")
    bad = [r for r in rows if r["status"] != "ok"]
    md = (f"# check-videos: {args.source}\n\n{len(rows)} files: {counts['ok']} ok, "
          f"{counts['partial']} partial, {counts['unreadable']} unreadable\n\n"
          + markdown_table(bad, ["path", "status", "reason", "num_frames", "decodable"]))
    _atomic_write(prefix.with_name(prefix.name + ".md"), md)
    print(f"{len(rows)} files: {counts['ok']} ok, {counts['partial']} partial, "
          f"{counts['unreadable']} unreadable; report: {prefix}.json / .md")
    for r in bad:
        print(f"  {r['status']:10s} {r['path']}: {r['reason']}")
    return 1 if counts["unreadable"] else 0


if __name__ == "__main__":
    sys.exit(main())
