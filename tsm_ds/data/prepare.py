"""``tsm-ds prepare``: re-encode / resize a video dataset, or extract JPEG frames, and write lists.

Usage::

    tsm-ds prepare SRC OUT [--list LIST --root DIR] [--mode video|frames] [--short-side 256]
                   [--keyint 16] [--crf 23] [--preset veryfast] [--workers N] [--split-val]

SRC is a class-per-folder tree (or use ``--list`` with a video list). The output mirrors the input's
relative paths under OUT:

- ``--mode video`` (default): H.264 MP4 (yuv420p, video only; audio is dropped), short side scaled
  to ``--short-side`` (0: keep), keyframe every ``--keyint`` frames when given (a short interval
  makes random access cheap: the loader decodes at most keyint frames per sampled frame). Every
  decoded frame is kept, with its timestamps (so variable frame rate stays variable), rotation
  metadata is applied to the pixels, and frame counts stay those of the source.
- ``--mode frames``: JPEG frames ``<rel path without extension>/img_00001.jpg ...`` (official TSM
  layout) at ``--short-side``.

Lists: ``OUT/all.txt`` (``path label`` for videos, ``dir num_frames label`` for frames, paths relative
to OUT), ``OUT/classes.txt`` for class-folder input.

Resuming: each output is written under a temporary name and renamed when complete, so an
interrupted run leaves no half-written output and a rerun skips what is done. Files that cannot be
read are skipped and listed in ``OUT/prepare_report.json`` (and printed); nothing is dropped
silently. Runs ``--workers`` processes with a tqdm progress bar. Exit status 1 when a file failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path

__all__ = ["prepare_video", "extract_frames", "main"]


def _even(x: float) -> int:
    return max(2, int(round(x / 2.0)) * 2)


def _target_size(w: int, h: int, short_side: int) -> tuple[int, int]:
    if not short_side:
        return _even(w), _even(h)
    s = short_side / min(w, h)
    return _even(w * s), _even(h * s)


def _frames(path: str):
    """Yield (rgb uint8 (H, W, 3) with rotation applied, time in seconds or None) per frame."""
    import av

    from . import decode as D

    c = D._open(path)
    try:
        s = D._video_stream(c, path)
        s.codec_context.thread_count = 0  # prepare runs whole files: let FFmpeg use threads
        s.codec_context.thread_type = "AUTO"
        try:
            for frame in c.decode(s):
                yield D._rotate(frame.to_ndarray(format="rgb24"), frame.rotation), frame.time
        except av.FFmpegError as e:
            warnings.warn(f"{path}: decode error, keeping the frames before it ({e})",
                          RuntimeWarning, stacklevel=2)
    finally:
        c.close()


def _resize(img, size: tuple[int, int]):
    import torch
    from torchvision.transforms.v2 import functional as TF

    if (img.shape[1], img.shape[0]) == size:
        return img
    t = torch.from_numpy(img).permute(2, 0, 1)
    t = TF.resize(t, [size[1], size[0]], antialias=True)
    return t.permute(1, 2, 0).contiguous().numpy()


def prepare_video(src: str, dst: str, *, short_side: int = 256, keyint: int | None = None,
                  crf: int = 23, preset: str = "veryfast") -> int:
    """Re-encode ``src`` to an H.264 MP4 ``dst`` (written as dst + '.part.mp4', then renamed).

    Returns the number of frames written. Raises VideoError subclasses for unreadable input.
    """
    import av

    from .decode import VideoDecodeError

    tmp = dst + ".part.mp4"
    n = 0
    last_t = None
    tb = Fraction(1, 90000)
    try:
        with av.open(tmp, "w") as out:
            stream = None
            for img, t in _frames(src):
                if stream is None:
                    w, h = _target_size(img.shape[1], img.shape[0], short_side)
                    stream = out.add_stream("libx264", rate=30)
                    stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
                    stream.time_base = tb
                    stream.codec_context.time_base = tb
                    opts = {"crf": str(crf), "preset": preset}
                    if keyint:
                        opts["x264-params"] = f"keyint={keyint}:min-keyint={keyint}:scenecut=0"
                    stream.options = opts
                # keep the source timing when it increases; else 30 fps steps
                pts = int(round(t / tb)) if t is not None else None
                if pts is None or (last_t is not None and pts <= last_t):
                    pts = (last_t + 3000) if last_t is not None else 0
                last_t = pts
                frame = av.VideoFrame.from_ndarray(_resize(img, (stream.width, stream.height)),
                                                   format="rgb24")
                frame.pts, frame.time_base = pts, tb
                for p in stream.encode(frame):
                    out.mux(p)
                n += 1
            if stream is None:
                raise VideoDecodeError(src, "no decodable frame")
            for p in stream.encode():
                out.mux(p)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return n


def extract_frames(src: str, dst_dir: str, *, short_side: int = 256, quality: int = 90) -> int:
    """Write every frame of ``src`` as ``dst_dir/img_00001.jpg ...`` (built in a temporary folder
    and renamed when complete). Returns the number of frames."""
    from PIL import Image

    from .decode import VideoDecodeError

    tmp = dst_dir + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    n = 0
    try:
        size = None
        for img, _ in _frames(src):
            if size is None:
                size = _target_size(img.shape[1], img.shape[0], short_side)
            n += 1
            Image.fromarray(_resize(img, size)).save(os.path.join(tmp, f"img_{n:05d}.jpg"),
                                                     quality=quality)
        if n == 0:
            raise VideoDecodeError(src, "no decodable frame")
        os.replace(tmp, dst_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return n


def _job(args) -> dict:
    src, rel, label, out_root, mode, opts = args
    from . import decode as D

    stem = os.path.splitext(rel)[0]
    dst = os.path.join(out_root, stem + (".mp4" if mode == "video" else ""))
    row = {"src": src, "out": os.path.relpath(dst, out_root), "label": label, "status": "done",
           "num_frames": None, "reason": ""}
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    try:
        if mode == "video":
            if os.path.isfile(dst):
                row["status"] = "skipped (exists)"
                row["num_frames"] = D.count_frames(dst)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    row["num_frames"] = prepare_video(src, dst, **opts)
        else:
            if os.path.isdir(dst):
                row["status"] = "skipped (exists)"
                row["num_frames"] = D.frame_folder_count(dst)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    row["num_frames"] = extract_frames(src, dst, short_side=opts["short_side"])
    except Exception as e:  # report, never stop the whole run
        row["status"], row["reason"] = "failed", f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    return row


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds prepare``; returns 1 when any input failed, else 0."""
    from tqdm import tqdm

    from .records import read_class_folders, read_video_list

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
    args = ap.parse_args(argv)

    src_root = os.path.abspath(args.src)
    classes = None
    if args.list:
        records = read_video_list(args.list, root=src_root)
    else:
        records, classes = read_class_folders(src_root)
    out_root = os.path.abspath(args.out)
    os.makedirs(out_root, exist_ok=True)
    opts = ({"short_side": args.short_side, "keyint": args.keyint, "crf": args.crf,
             "preset": args.preset} if args.mode == "video" else {"short_side": args.short_side})
    jobs = []
    for r in records:
        rel = os.path.relpath(r.path, src_root)
        if rel.startswith(".."):
            rel = os.path.basename(r.path)
        jobs.append((r.path, rel, r.label, out_root, args.mode, opts))
    if args.workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(args.workers) as ex:
            rows = list(tqdm(ex.map(_job, jobs), total=len(jobs), desc="prepare", unit="file"))
    else:
        rows = [_job(j) for j in tqdm(jobs, desc="prepare", unit="file")]

    ok = [r for r in rows if r["status"] != "failed"]
    lines = [(f"{r['out']} {r['label']}" if args.mode == "video"
              else f"{r['out']} {r['num_frames']} {r['label']}") for r in ok]
    _write(Path(out_root) / "all.txt", "\n".join(lines) + ("\n" if lines else ""))
    if classes is not None:
        _write(Path(out_root) / "classes.txt", "\n".join(classes) + "\n")
    failed = [r for r in rows if r["status"] == "failed"]
    _write(Path(out_root) / "prepare_report.json",
           json.dumps({"src": src_root, "mode": args.mode, "options": opts, "files": rows}, indent=2) + "\n")
    print(f"prepare: {len(ok)} of {len(rows)} files ready in {out_root} (list: all.txt); "
          f"{len(failed)} failed (see prepare_report.json)")
    for r in failed:
        print(f"  failed {r['src']}: {r['reason']}")
    return 1 if failed else 0


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
