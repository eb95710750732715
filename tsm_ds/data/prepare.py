"""Prepare a video dataset for training (library of ``tsm-ds prepare``): pack, re-encode or extract.

The output mirrors the input's relative paths under OUT:

- ``--mode packed`` (default, the training-ready format): one ``<rel path without extension>.jpack``
  per video (:mod:`tsm_ds.data.video.packed`): every decoded frame at ``--short-side``, JPEG
  quality 90, with an index, so a clip's frames are one open and a few reads away and cost a
  JPEG decode each (no GOP to decode through). Bytes are those of the JPEG folder of ``--mode
  frames`` plus a header of 8 bytes per frame; one file per video instead of one per frame.
- ``--mode video``: H.264 MP4 (yuv420p, video only; audio is dropped), short side scaled
  to ``--short-side`` (0: keep), keyframe every ``--keyint`` frames when given (a short interval
  makes random access cheap: the loader decodes at most keyint frames per sampled frame). Every
  decoded frame is kept, with its timestamps (so variable frame rate stays variable), rotation
  metadata is applied to the pixels, and frame counts stay those of the source.

  Encoder (issue 27, 29): libx264 ``--crf 23 --preset veryfast`` and by default ``--tune
  fastdecode`` (CAVLC instead of CABAC, no deblocking filter, no weighted prediction) with
  ``b-pyramid=none`` (no B-frame is a reference, so the loader's decoder skips every B-frame it is
  not asked for), and x264 threads pinned to 1 (x264's automatic count depends on the machine's
  cores and changes the bytes; with a fixed count two runs give identical files, tested). Measured by
  ``studies/video_decode_bench.py`` at short side 256, keyint 16: train items
  (``VideoClipDataset(mode="train", num_segments=8, img_size=224)``) per CPU second of one
  thread, median of 3 interleaved rounds, the encoder options alone (the loader of before issue
  27) / with the loader's own issue-27 changes (one reused swscale context per thread, fewer
  per-packet lookups), ratios to the encode and loader before issue 27:

  ====================================  ===============  ===============  ==============
  x264 options                          17 real clips    640x360 texture  bytes (real /
                                                                          texture)
  ====================================  ===============  ===============  ==============
  before (no tune, automatic threads)   x1.00 / x1.14    x1.00 / x1.06    1.00 / 1.00
  tune fastdecode                       x1.60 / x1.98    x2.06 / x2.46    1.06 / 1.12
  tune fastdecode + b-pyramid=none      x1.70 / x2.06    x2.49 / x2.75    1.08 / 1.12
  ====================================  ===============  ===============  ==============

  (the real clips: 30.9 -> 65.8 items per CPU second; frames decoded per item 46.6 -> 43.0.)
  Alone, cabac=0 gave x1.33 / x1.76 (bytes 1.05 / 1.13), no-deblock x1.08 / x1.05, bframes=0
  x1.12 / x0.98 (bytes 1.07 / 1.26), b-pyramid=none x1.13 / x1.03 (an earlier run, same
  method). ``--tune none`` restores x264's default tuning (smaller files, slower to load; b-pyramid=none
  stays, from Python ``x264_params=None`` drops it too).
- ``--mode frames``: JPEG frames ``<rel path without extension>/img_00001.jpg ...`` (official TSM
  layout) at ``--short-side``.

Sources are video files or JPEG frame folders (a record's ``frame_template`` names a folder's files,
e.g. ``{:05d}.jpg`` for Something-Something v1 and Jester; default ``img_{:05d}.jpg``).
Every mode keeps every source frame (rotation applied), scaled so that the short side is
``--short-side``; the loader crops them the same way whatever the format.

Lists: ``OUT/all.txt`` (``path label`` for videos and packs, ``dir num_frames label`` for frames,
paths relative to OUT), ``OUT/classes.txt`` for class-folder input.

Resuming: each output is written under a temporary name and renamed when complete, so an
interrupted run leaves no half-written output and a rerun skips what is done (a pack that exists
but whose header or index is damaged, or that was written with another ``--short-side`` or
``--quality``, is written again; damage inside a frame is found when the frame is read: the item
is replaced and the file named, and deleting the pack makes the next prepare write it again).
Files that cannot be read are skipped and listed in ``OUT/prepare_report.json`` (and printed);
nothing is dropped silently. Runs ``workers`` processes with a tqdm progress bar.
"""
from __future__ import annotations

import contextlib
import json
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path

from tsm_ds.utils.io import atomic_path, atomic_write_text

__all__ = ["FAST_DECODE_PARAMS", "MODES", "X264_THREADS", "extract_frames", "pack_video", "prepare_dataset",
           "prepare_rows", "prepare_video", "write_lists", "x264_options"]

#: prepare modes, the default first
MODES = ("packed", "video", "frames")

#: libx264 threads of ``--mode video`` (x264-params ``threads``): pinned, so the bytes do not depend
#: on the machine's core count (x264 is deterministic for a fixed thread count)
X264_THREADS = 1

#: torch threads of the frame resize in every mode (:func:`_resize_threads`): pinned, for the same bytes
RESIZE_THREADS = 1

#: a row's private count of stale temporaries removed (popped by :func:`prepare_rows`)
TEMP_KEY = "_temporaries_removed"


def _even(x: float) -> int:
    return max(2, int(round(x / 2.0)) * 2)


def _target_size(w: int, h: int, short_side: int) -> tuple[int, int]:
    if not short_side:
        return _even(w), _even(h)
    s = short_side / min(w, h)
    return _even(w * s), _even(h * s)


def _frames(path: str, frame_template: str | None = None):
    """Yield (rgb uint8 (H, W, 3) with rotation applied, time in seconds or None) per frame of a
    video file, or of a JPEG frame folder (files ``frame_template``, default
    :data:`~tsm_ds.data.video.FRAME_TEMPLATE`; times None)."""
    import av

    from . import video as D

    if os.path.isdir(path):
        template = frame_template or D.FRAME_TEMPLATE
        for i in range(D.frame_folder_count(path, template)):
            yield D.read_frame_folder(path, [i], template)[0], None
        return
    c = D.open_video(path)
    try:
        s = D.video_stream(c, path)
        s.codec_context.thread_count = 0  # prepare runs whole files: let FFmpeg use threads
        s.codec_context.thread_type = "AUTO"
        try:
            for frame in c.decode(s):
                yield D.to_rgb(frame), frame.time
        except av.FFmpegError as e:
            warnings.warn(f"{path}: decode error, keeping the frames before it ({e})",
                          RuntimeWarning, stacklevel=2)
    finally:
        c.close()


@contextlib.contextmanager
def _resize_threads():
    """torch at :data:`RESIZE_THREADS` intra-op thread(s) inside the block, restored after: the
    antialiased resize's bytes depend on how many threads split the image (measured: 2 threads
    gave different frames run to run inside the encoding loop, 1 thread the same every time)."""
    import torch

    n = torch.get_num_threads()
    if n != RESIZE_THREADS:
        torch.set_num_threads(RESIZE_THREADS)
    try:
        yield
    finally:
        if n != RESIZE_THREADS:
            torch.set_num_threads(n)


def _resize(img, size: tuple[int, int]):
    import torch
    from torchvision.transforms.v2 import functional as TF

    if (img.shape[1], img.shape[0]) == size:
        return img
    t = torch.from_numpy(img).permute(2, 0, 1)
    t = TF.resize(t, [size[1], size[0]], antialias=True)
    return t.permute(1, 2, 0).contiguous().numpy()


#: x264 options prepare_video adds by default (with ``tune="fastdecode"``): every B-frame
#: unreferenced, so the loader's decoder skips those it is not asked for (issue 27)
FAST_DECODE_PARAMS = "b-pyramid=none"


def x264_options(*, crf: int = 23, preset: str = "veryfast", tune: str | None = "fastdecode",
                 keyint: int | None = None, x264_params: str | None = FAST_DECODE_PARAMS,
                 threads: int = 1) -> dict[str, str]:
    """The libx264 ``stream.options`` of :func:`prepare_video` (strings, as PyAV takes them).

    Args:
        crf, preset: x264's constant rate factor and preset.
        tune: x264's ``--tune`` (default ``"fastdecode"``: CAVLC instead of CABAC, no deblocking
            filter, no weighted prediction; see the module docstring for the measurements);
            None or ``"none"``: x264's defaults.
        keyint: a keyframe every ``keyint`` frames exactly (no scene-cut keyframes); None: x264's.
        x264_params: more ``key=value`` x264 options joined by ``:`` (default
            :data:`FAST_DECODE_PARAMS`, B-frames never used as references; None: none).
        threads: x264 threads, pinned: the same pixels give the same bytes run to run, whatever
            the machine's core count (0 = x264's automatic count, which depends on the cores and
            changes the bytes).

    Raises:
        ValueError: ``threads`` < 0.
    """
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    params = [f"threads={threads}"] if threads else []
    if keyint:
        params.append(f"keyint={keyint}:min-keyint={keyint}:scenecut=0")
    if x264_params:
        params.append(x264_params)
    opts = {"crf": str(crf), "preset": preset}
    if tune and tune != "none":
        opts["tune"] = tune
    if params:
        opts["x264-params"] = ":".join(params)
    return opts


def prepare_video(src: str, dst: str, *, short_side: int = 256, keyint: int | None = None,
                  crf: int = 23, preset: str = "veryfast", tune: str | None = "fastdecode",
                  x264_params: str | None = FAST_DECODE_PARAMS, threads: int = X264_THREADS,
                  frame_template: str | None = None) -> int:
    """Re-encode ``src`` to an H.264 MP4 ``dst`` (written atomically: a temporary file, then renamed).

    Args:
        src / dst: input video (or JPEG frame folder: its frames at 30 fps, files
            ``frame_template``, default ``img_{:05d}.jpg``) and output ``.mp4`` path.
        short_side: short side of the output in pixels, both sides rounded to even (0: keep).
        keyint: a keyframe every ``keyint`` frames exactly (None: x264's choice).
        crf, preset, tune, x264_params, threads: the encoder's (:func:`x264_options`). The
            defaults ``tune="fastdecode"`` and ``x264_params="b-pyramid=none"`` make the output
            cheap to load for a few percent more bytes (measured in the module docstring);
            ``threads=1``: x264's output does not depend on the run or the machine's core count
            (the same bytes for the same pixels and library versions).

    Returns:
        the number of frames written (= frames decoded from ``src``).

    Raises:
        VideoOpenError, NoVideoStreamError, VideoDecodeError (no decodable frame): unreadable
        input; av.FFmpegError from the encoder; OSError when ``dst`` cannot be written.

    The frame resize runs :data:`RESIZE_THREADS` torch thread(s), so a video's bytes are the same
    run to run and on every machine with the same FFmpeg/x264 and torch builds and CPU
    instruction set.
    """
    import av

    from .video import VideoDecodeError

    n = 0
    last_t = None
    tb = Fraction(1, 90000)
    with _resize_threads(), atomic_path(dst, suffix=".mp4") as tmp:
        with av.open(str(tmp), "w") as out:
            stream = None
            for img, t in _frames(src, frame_template):
                if stream is None:
                    w, h = _target_size(img.shape[1], img.shape[0], short_side)
                    stream = out.add_stream("libx264", rate=30)
                    stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
                    stream.time_base = tb
                    stream.codec_context.time_base = tb
                    stream.options = x264_options(crf=crf, preset=preset, tune=tune, keyint=keyint,
                                                  x264_params=x264_params, threads=threads)
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
    return n


def extract_frames(src: str, dst_dir: str, *, short_side: int = 256, quality: int = 90,
                   frame_template: str | None = None) -> int:
    """Write every frame of ``src`` (a video, or a frame folder of files ``frame_template``) as
    ``dst_dir/img_00001.jpg ...`` (built in a temporary folder and renamed when complete).
    Returns the number of frames.

    Raises:
        VideoDecodeError: no decodable frame (nothing is left behind).
    """
    from PIL import Image

    from .video import VideoDecodeError

    n = 0
    with _resize_threads(), atomic_path(dst_dir, directory=True) as tmp:
        size = None
        for img, _ in _frames(src, frame_template):
            if size is None:
                size = _target_size(img.shape[1], img.shape[0], short_side)
            n += 1
            Image.fromarray(_resize(img, size)).save(os.path.join(tmp, f"img_{n:05d}.jpg"),
                                                     quality=quality)
        if n == 0:
            raise VideoDecodeError(src, "no decodable frame")
    return n


def _scaled_frames(src: str, short_side: int, frame_template: str | None = None):
    """Every frame of ``src`` (rotation applied) scaled to ``short_side`` (0: as decoded)."""
    size = None
    for img, _ in _frames(src, frame_template):
        if size is None:
            size = _target_size(img.shape[1], img.shape[0], short_side)
        yield _resize(img, size)


def pack_video(src: str, dst: str, *, short_side: int = 256, quality: int = 90,
               frame_template: str | None = None) -> int:
    """Write every frame of ``src`` (a video file, or a JPEG frame folder whose files are
    ``frame_template``, default ``img_{:05d}.jpg``) into one packed video ``dst`` (``.jpack``,
    atomically).

    Frames are scaled as ``--mode frames`` scales them (short side ``short_side``, even sides,
    antialiased) and encoded at JPEG ``quality`` (:func:`tsm_ds.data.video.write_packed`).

    Returns:
        the number of frames.

    Raises:
        VideoError subclasses: unreadable input, or no decodable frame (nothing is written).
    """
    from .video import write_packed

    with _resize_threads():
        return write_packed(dst, _scaled_frames(src, short_side, frame_template), quality=quality,
                            meta={"source": os.path.basename(src), "short_side": short_side})


def _remove_stale_temporaries(dst: str) -> int:
    """Remove the temporary files / folders a killed writer of ``dst`` left beside it
    (:func:`tsm_ds.utils.io.atomic_path` names them ``.<name>.<8 random chars><suffix>``); returns
    how many. Only ``dst``'s own: one process writes one output at a time."""
    import re
    import shutil

    folder, name = os.path.split(dst)
    pattern = re.compile(r"\." + re.escape(name) + r"\.[A-Za-z0-9_]{8}\.\w+$")
    removed = 0
    try:
        entries = os.listdir(folder or ".")
    except FileNotFoundError:
        return 0
    for e in entries:
        if pattern.match(e):
            path = os.path.join(folder, e)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            removed += 1
    return removed


def _die_with_parent() -> None:
    """Pool worker initializer: on Linux, the kernel sends the worker SIGTERM when the process that
    started it dies (``prctl(PR_SET_DEATHSIG)``), so a killed ``tsm-ds prepare`` leaves no worker
    writing into OUT. Elsewhere nothing."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))   # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass


@contextlib.contextmanager
def _noted(row: dict):
    """Run a prepare step with warnings caught: a source that decodes only part-way ("decode error,
    keeping the frames before it") is kept, and the row's reason says so (status stays done)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    notes = [str(w.message) for w in caught if "decode error" in str(w.message)]
    if notes:
        row["reason"] = f"partial source, {notes[0]}"


def _job(args) -> dict:
    src, rel, label, out_root, mode, opts, template = args
    from . import video as D

    stem = os.path.splitext(rel)[0]
    dst = os.path.join(out_root, stem + {"video": ".mp4", "packed": D.PACK_EXTENSION}.get(mode, ""))
    row = {"src": src, "out": os.path.relpath(dst, out_root), "label": label, "status": "done",
           "num_frames": None, "reason": ""}
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    row[TEMP_KEY] = _remove_stale_temporaries(dst)
    try:
        if mode == "packed":
            want = {"short_side": opts["short_side"], "quality": opts.get("quality", 90)}
            try:
                if os.path.isfile(dst):
                    with D.PackedVideo(dst) as pv:
                        # a pack of other options (--short-side, --quality) is written again
                        same = all(pv.meta.get(k) == v for k, v in want.items())
                        row["num_frames"] = pv.num_frames if same else None
                    row["status"] = "skipped (exists)"
            except D.VideoError:   # a damaged pack (e.g. copied in part): written again
                row["num_frames"] = None
            if row["num_frames"] is None:
                row["status"] = "done"
                with _noted(row):
                    row["num_frames"] = pack_video(src, dst, short_side=opts["short_side"],
                                                   quality=opts.get("quality", 90), frame_template=template)
        elif mode == "video":
            if os.path.isfile(dst):
                row["status"] = "skipped (exists)"
                row["num_frames"] = D.count_frames(dst)
            else:
                with _noted(row):
                    row["num_frames"] = prepare_video(src, dst, **opts, frame_template=template)
        else:
            if os.path.isdir(dst):
                row["status"] = "skipped (exists)"
                row["num_frames"] = D.frame_folder_count(dst)
            else:
                with _noted(row):
                    row["num_frames"] = extract_frames(src, dst, short_side=opts["short_side"],
                                                       quality=opts.get("quality", 90), frame_template=template)
    except Exception as e:  # report, never stop the whole run
        row["status"], row["reason"] = "failed", f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    return row


def prepare_rows(records, src_root: str, out_root: str, *, mode: str = "packed", workers: int = 1,
                 progress: bool = True, **opts) -> tuple[list[dict], int]:
    """Prepare every record into ``out_root`` (outputs only: no lists, no report).

    Args: as :func:`prepare_dataset` (without ``classes``).

    Returns:
        (rows, temporaries): one row per record in the records' order (src, out, label, status
        ``done`` / ``skipped (exists)`` / ``failed``, num_frames, reason), and how many temporary
        files a killed earlier run had left beside these outputs and were removed.

    Raises:
        ValueError: an unknown mode. OSError: the output folder is not writable.
    """
    from tqdm import tqdm

    if mode not in MODES:
        raise ValueError(f"prepare mode must be one of {MODES}, got {mode!r}")
    src_root, out_root = os.path.abspath(src_root), os.path.abspath(out_root)
    os.makedirs(out_root, exist_ok=True)
    jobs = []
    for r in records:
        rel = os.path.relpath(r.path, src_root)
        if rel.startswith(".."):
            rel = os.path.basename(r.path)
        jobs.append((r.path, rel, r.label, out_root, mode, opts, getattr(r, "frame_template", None)))
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers, initializer=_die_with_parent) as ex:
            rows = list(tqdm(ex.map(_job, jobs), total=len(jobs), desc="prepare", unit="file",
                             disable=not progress))
    else:
        rows = [_job(j) for j in tqdm(jobs, desc="prepare", unit="file", disable=not progress)]
    temporaries = sum(r.pop(TEMP_KEY, 0) for r in rows)
    return rows, temporaries


def write_lists(out_root: str, rows: list[dict], *, src_root: str, mode: str, options: dict,
                classes=None) -> None:
    """Write ``OUT/all.txt`` (the rows not failed, in order), ``OUT/classes.txt`` (when ``classes``
    is given) and ``OUT/prepare_report.json`` (``src``, ``mode``, ``options``, every row), each
    atomically.

    Args:
        out_root: the output folder. rows: as :func:`prepare_rows` returns them.
        src_root: the source folder recorded in the report (made absolute).
        mode / options: the prepare mode and its options, recorded in the report.
        classes: class names, one per line of ``classes.txt`` (None: no file).

    Raises:
        OSError: the folder is not writable.
    """
    ok = [r for r in rows if r["status"] != "failed"]
    lines = [(f"{r['out']} {r['label']}" if mode != "frames"
              else f"{r['out']} {r['num_frames']} {r['label']}") for r in ok]
    atomic_write_text(Path(out_root) / "all.txt", "\n".join(lines) + ("\n" if lines else ""))
    if classes is not None:
        atomic_write_text(Path(out_root) / "classes.txt", "\n".join(classes) + "\n")
    atomic_write_text(Path(out_root) / "prepare_report.json",
                      json.dumps({"src": os.path.abspath(src_root), "mode": mode, "options": options,
                                  "files": rows}, indent=2) + "\n")


def prepare_dataset(records, src_root: str, out_root: str, *, mode: str = "packed", classes=None,
                    workers: int = 1, progress: bool = True, **opts) -> list[dict]:
    """Prepare every record (see the module docstring) and write the lists and the report.

    Args:
        records: ``VideoRecord`` s; outputs mirror their paths relative to ``src_root``.
        src_root / out_root: input and output folders (absolute or relative).
        mode: ``"packed"`` (training-ready packs: ``opts`` short_side), ``"video"`` (re-encode:
            ``opts`` short_side, keyint, crf, preset) or ``"frames"`` (JPEG frames: ``opts``
            short_side).
        classes: class names for ``OUT/classes.txt`` (None: no file).
        workers: processes; progress: a tqdm bar.

    Returns:
        one row per record: src, out, label, status (``done`` / ``skipped (exists)`` /
        ``failed``), num_frames, reason. Failed files are listed, never dropped silently.

    Raises:
        OSError: the output folder is not writable. ValueError: an unknown mode.
    """
    rows, _ = prepare_rows(records, src_root, out_root, mode=mode, workers=workers, progress=progress, **opts)
    write_lists(out_root, rows, src_root=src_root, mode=mode, options=opts, classes=classes)
    return rows
