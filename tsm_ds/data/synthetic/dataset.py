"""Encoding and the on-disk demo dataset: :func:`make_demo_dataset` (and :func:`encode_video`,
:func:`available_codec`).

Files: ``root/{train,val}/<class>/<class>_<j:04d>.mp4`` (H.264 via libx264 when the PyAV build
has it, else MPEG-4 part 2), list files ``root/train.txt`` and ``root/val.txt`` with lines
``<path relative to root> <label>``, ``root/classes.txt`` (one name per line, line number =
label) and ``root/meta.json`` (parameters plus per-clip ground truth: object centre, size, angle
and opacity per frame). Every file is written atomically (:mod:`tsm_ds.utils.io`); ``meta.json``
is written last: its presence marks a complete dataset, which a second call with the same
parameters reuses.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from tsm_ds.utils.io import atomic_path, atomic_write_text

from .render import (
    _CLASS_TO_PAIR,
    _FORMAT_VERSION,
    ALL_CLASSES,
    CLASS_PAIRS,
    DEFAULT_CLASSES,
    _check_params,
    _Params,
    render_clip,
    sample_clip,
)

__all__ = ["make_demo_dataset", "encode_video", "available_codec"]

_SPLITS = {"train": 0, "val": 1}

# --------------------------------------------------------------------------------------------
# encoding


def available_codec(preferred: str = "auto") -> str:
    """The PyAV encoder to use: 'libx264' (H.264) when present, else 'mpeg4' (MPEG-4 part 2).

    Args:
        preferred: "auto", or an encoder name to check ("libx264", "mpeg4", ...).

    Raises:
        ValueError: the named encoder is not in this PyAV/FFmpeg build.
    """
    import av

    def has(name: str) -> bool:
        try:
            av.codec.Codec(name, "w")
            return True
        except Exception:  # noqa: BLE001 - PyAV raises several types for a missing codec
            return False

    if preferred == "auto":
        return "libx264" if has("libx264") else "mpeg4"
    if not has(preferred):
        raise ValueError(f"encoder {preferred!r} is not available in this PyAV/FFmpeg build; "
                         "use codec='auto', 'libx264' or 'mpeg4'")
    return preferred


def encode_video(frames: np.ndarray, path: str | os.PathLike, *, fps: int = 8,
                 codec: str = "libx264") -> None:
    """Write frames to an .mp4 file atomically (:func:`tsm_ds.utils.io.atomic_path`).

    Args:
        frames: uint8 (T, H, W, 3) RGB, H and W even.
        path: destination file.
        fps: frame rate written to the container (frames per second).
        codec: PyAV encoder; 'libx264' uses CRF 18, preset medium, one thread, no MB-tree
            (with MB-tree the same frames gave different bitstreams from run to run);
            'mpeg4' uses qscale 3.

    Raises:
        ValueError: frames of the wrong dtype or shape.
    """
    import av

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    if codec in ("libx264", "h264"):
        # MB-tree rate control made x264 (FFmpeg 8.1 build of PyAV 18) emit different bitstreams
        # for the same frames in ~1 of 3 runs, threads=1 or not; without it output is bit-exact
        options = {"crf": "18", "preset": "medium", "threads": "1", "x264-params": "mbtree=0"}
    else:
        options = {"qscale": "3", "threads": "1"}
    with atomic_path(path, suffix=".mp4") as tmp, av.open(str(tmp), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


# --------------------------------------------------------------------------------------------
# the dataset


def _clip_rng(seed: int, split: str, pair: str, j: int) -> np.random.Generator:
    pair_id = list(CLASS_PAIRS).index(pair)
    return np.random.default_rng((seed, _SPLITS[split], pair_id, j))


def _make_one(job: tuple) -> dict:
    root, split, cls, label, j, params = job
    pair_id, pair, reverse = _CLASS_TO_PAIR[cls]
    spec = sample_clip(pair, _clip_rng(params["seed"], split, pair, j), size=params["size"],
                       num_frames=params["num_frames"], speed=tuple(params["speed"]),
                       radius=tuple(params["radius"]), noise=tuple(params["noise"]),
                       distractor_prob=params["distractor_prob"], clutter=params["clutter"],
                       contrast=params["contrast"], tint=params["tint"])
    rel = f"{split}/{cls}/{cls}_{j:04d}.mp4"
    encode_video(render_clip(spec, reverse=reverse), Path(root) / rel, fps=params["fps"],
                 codec=params["codec"])
    if reverse:  # ground truth in the order the frames are shown
        for key in ("centre", "radius", "angle", "alpha"):
            spec[key] = spec[key][::-1]
    twin = CLASS_PAIRS[pair][0 if reverse else 1]
    return {"path": rel, "label": label, "class": cls, "split": split, "reversed": reverse,
            "twin": f"{split}/{twin}/{twin}_{j:04d}.mp4", **spec}


@contextlib.contextmanager
def _locked(root: Path):
    """Hold an exclusive lock on root/.lock: two ranks that call at once generate once."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _result(root: Path, classes: Sequence[str], meta: dict) -> dict:
    return {"train_list": str(root / "train.txt"), "val_list": str(root / "val.txt"),
            "classes": list(classes), "root": str(root), "num_frames": meta["params"]["num_frames"],
            "meta": str(root / "meta.json")}


def make_demo_dataset(root: str | os.PathLike, *, seed: int = 0,
                      classes: Iterable[str] = DEFAULT_CLASSES, train_per_class: int = 200,
                      val_per_class: int = 50, num_frames: int = 16, size: int = 64,
                      speed: tuple[float, float] = (1.5, 2.5),
                      radius: tuple[float, float] = (8.0, 12.0),
                      noise: tuple[float, float] = (0.01, 0.05), distractor_prob: float = 0.0,
                      clutter: float = 0.5, contrast: float = 0.4, tint: float = 0.25, fps: int = 8,
                      codec: str = "auto", workers: int = 1, overwrite: bool = False) -> dict:
    """Generate (or reuse) the motion-direction demo dataset under ``root``.

    Each class has ``train_per_class`` training and ``val_per_class`` validation clips (labels
    exactly balanced). Classes of the same pair in ``CLASS_PAIRS`` are each other's time
    reversal clip by clip (see the module docstring), so only the order of frames tells them
    apart. With the defaults: 4 classes, 800 + 200 clips of 16 frames, 64 x 64 px, objects
    16-24 px across moving 1.5-2.5 px/frame (3-5 px between the frames an 8-segment clip
    samples), half-strength background clutter, no distractor.

    Why 16 frames for 8-segment clips: validation clips take the official TSN segment centres
    (``tsm_ds.data.sampling.clip_indices``, official ``_get_val_indices``), which fall back to
    frame 0 repeated T times when a video has ``num_frames <= num_segments``. With 8-frame
    videos and 8 segments every validation clip was one still frame (no motion), so any model
    scored exactly chance on this dataset. Keep ``num_frames > num_segments`` (2x is clean:
    validation then takes frames 1, 3, ..., 15).

    Args:
        root: output folder (created). ``root/train.txt``, ``root/val.txt`` list clips as
            ``<path relative to root> <label>``; ``root/classes.txt``; ``root/meta.json``.
        seed: the clips are a pure function of (seed, parameters); same seed, same decoded bytes.
        classes: class names from ``ALL_CLASSES``, in label order (label = position).
        train_per_class, val_per_class: clips per class in each split (>= 1).
        num_frames: frames per video (>= 2); must exceed the clips' num_segments for
            validation sampling to see motion (see above).
        size: frame height = width in pixels (even, >= 24).
        speed: (low, high) pixels per frame for moving objects.
        radius: (low, high) object size in pixels.
        noise: (low, high) per-frame Gaussian noise standard deviation, intensity units in [0, 1].
        distractor_prob: probability of a static second shape in a clip (the same for all classes).
        clutter: background structure in [0, 1] (0: flat random colour; see ``sample_clip``).
        contrast: minimum brightness difference between object and background, in [0, 0.5).
        tint: largest per-channel random tint of the colours (0: grey levels).
        fps: frames per second written to the container.
        codec: "auto" (libx264 if this PyAV has it, else mpeg4), "libx264" or "mpeg4".
        workers: processes rendering and encoding clips (the result does not depend on it).
        overwrite: regenerate even when ``root/meta.json`` already describes a dataset; without
            it, a dataset made with other parameters is an error (nothing is deleted silently).

    Returns:
        ``{"train_list": str, "val_list": str, "classes": [names], "root": str,
        "num_frames": int, "meta": str}`` (paths of files, absolute).

    Raises:
        ValueError: unknown or repeated class names, counts < 1, parameters that do not fit the
            frame, an unavailable codec, or ``root`` holding a dataset made with other
            parameters (pass ``overwrite=True`` or use another folder).
    """
    root = Path(root).resolve()
    classes = list(classes)
    unknown = [c for c in classes if c not in _CLASS_TO_PAIR]
    if unknown or not classes or len(set(classes)) != len(classes):
        raise ValueError(f"classes must be distinct names from {ALL_CLASSES}; got {classes}")
    if train_per_class < 1 or val_per_class < 1:
        raise ValueError(f"train_per_class and val_per_class must be >= 1, "
                         f"got {train_per_class}, {val_per_class}")
    _check_params(_Params(size, num_frames, tuple(speed), tuple(radius), tuple(noise)), contrast, tint)
    params = {
        "format_version": _FORMAT_VERSION, "seed": int(seed), "classes": classes,
        "train_per_class": int(train_per_class), "val_per_class": int(val_per_class),
        "num_frames": int(num_frames), "size": int(size), "speed": [float(s) for s in speed],
        "radius": [float(r) for r in radius], "noise": [float(n) for n in noise],
        "distractor_prob": float(distractor_prob), "clutter": float(clutter),
        "contrast": float(contrast), "tint": float(tint), "fps": int(fps), "codec": available_codec(codec),
    }
    meta_path = root / "meta.json"
    with _locked(root):
        if meta_path.is_file() and not overwrite:
            meta = json.loads(meta_path.read_text())
            if meta.get("params") == params:
                return _result(root, classes, meta)
            raise ValueError(
                f"{meta_path} describes a demo dataset made with other parameters "
                f"({meta.get('params')}); pass overwrite=True (--overwrite) or choose another folder")
        if meta_path.exists():
            meta_path.unlink()
        for split in _SPLITS:
            shutil.rmtree(root / split, ignore_errors=True)
            for cls in classes:
                (root / split / cls).mkdir(parents=True, exist_ok=True)
        counts = {"train": train_per_class, "val": val_per_class}
        # interleave classes so that a partial list file (never written, but a reader's view of
        # the job order) stays balanced, and twins are rendered next to each other
        jobs = [(str(root), split, cls, label, j, params)
                for split in _SPLITS for j in range(counts[split])
                for label, cls in enumerate(classes)]
        if workers > 1:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(workers) as pool:
                clips = pool.map(_make_one, jobs, chunksize=8)
        else:
            clips = [_make_one(job) for job in jobs]
        for split in _SPLITS:
            lines = [f"{c['path']} {c['label']}\n" for c in clips if c["split"] == split]
            atomic_write_text(root / f"{split}.txt", "".join(lines))
        atomic_write_text(root / "classes.txt", "".join(f"{c}\n" for c in classes))
        meta = {"params": params, "clips": clips}
        atomic_write_text(meta_path, json.dumps(meta, separators=(",", ":")))
    return _result(root, classes, meta)
