"""Scan a dataset and report the files the loader cannot use (the library of ``tsm-ds check-videos``).

The source is a list file (``path label`` or the official ``frame_dir num_frames label``) or a
class-per-folder tree. For each video the check opens the file, counts packets (the loader's frame
count) and decodes the 8 validation frames plus the last frame (``--full``: every frame, and counts
how many decode). Status per file:

- ``ok``: every frame asked for decoded;
- ``partial``: the stream ends (or fails) before the packet count (the loader repeats the last
  decoded frame; ``decodable`` says how many frames decode with ``--full``);
- ``unreadable``: cannot open / no video stream / no decodable frame (the loader replaces it).

Reports: :func:`write_check_report` writes ``PREFIX.json`` (every file) and ``PREFIX.md`` (a table
of the files that are not ok), atomically.
"""
from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tsm_ds.utils.io import atomic_write_text, markdown_table

__all__ = ["check_file", "check_records", "load_records", "write_check_report"]


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
    """Check one video (or frame folder, or pack: ``full`` decodes every frame with the pack reader).
    Returns a flat dict: path, status, reason, num_frames (packet count), decodable (frames decoded;
    full mode only), width, height, seekable."""
    from . import video as D
    from .sampling import tsn_val_indices

    row = {"path": path, "status": "ok", "reason": "", "num_frames": None, "decodable": None,
           "width": None, "height": None, "seekable": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            n = num_frames if (num_frames and os.path.isdir(path)) else D.count_frames(path)
            row["num_frames"] = n
            if not os.path.isdir(path) and not D.is_packed(path):   # packs: every frame is a keyframe
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
    """Frames of ``path`` that decode, in order until the first that does not, and that error."""
    import av

    from . import video as D

    if D.is_packed(path):   # the pack reader, frame by frame (FFmpeg would probe it as one JPEG)
        with D.PackedVideo(path) as pv:
            for i in range(pv.num_frames):
                try:
                    pv.decode_chw([i])
                except D.VideoError as e:
                    return i, f"{type(e).__name__}: {e.reason}"
            return pv.num_frames, ""
    n, err = 0, ""
    c = D.open_video(path)
    try:
        s = D.video_stream(c, path)
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


def check_records(records, *, full: bool = False, workers: int = 1, progress: bool = True) -> list[dict]:
    """:func:`check_file` for every record, in ``workers`` processes; rows in record order, each
    with the record's ``label`` added. ``progress`` shows a tqdm bar."""
    from tqdm import tqdm

    jobs = [(r.path, r.num_frames, full) for r in records]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers) as ex:
            rows = list(tqdm(ex.map(_check_star, jobs, chunksize=4), total=len(jobs),
                             desc="check-videos", unit="file", disable=not progress))
    else:
        rows = [check_file(*j) for j in tqdm(jobs, desc="check-videos", unit="file", disable=not progress)]
    for r, rec in zip(rows, records):
        r["label"] = rec.label
    return rows


def write_check_report(prefix: str | os.PathLike, source: str, rows: list[dict]) -> dict[str, int]:
    """Write ``PREFIX.json`` (every file) and ``PREFIX.md`` (the files that are not ok), atomically.

    Returns the counts per status (``ok``, ``partial``, ``unreadable``).
    Raises OSError when the report folder is not writable.
    """
    prefix = Path(prefix)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "partial", "unreadable")}
    atomic_write_text(prefix.with_name(prefix.name + ".json"),
                      json.dumps({"source": str(source), "counts": counts, "files": rows}, indent=2) + "\n")
    bad = [r for r in rows if r["status"] != "ok"]
    md = (f"# check-videos: {source}\n\n{len(rows)} files: {counts['ok']} ok, "
          f"{counts['partial']} partial, {counts['unreadable']} unreadable\n\n"
          + markdown_table(bad, ["path", "status", "reason", "num_frames", "decodable"]))
    atomic_write_text(prefix.with_name(prefix.name + ".md"), md)
    return counts
