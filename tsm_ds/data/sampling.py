"""Which frames make a clip: pure functions from a frame count to 0-based frame indices.

Indices are positions in presentation order (the i-th frame a player shows), 0-based, where the
official TSM list files and ``ops/dataset.py`` are 1-based (they add 1 to the same offsets).

Short videos follow the official code exactly (``ops/dataset.py`` of mit-han-lab/
temporal-shift-module): TSN training with fewer frames than segments returns frame 0 for every
segment, validation likewise when ``num_frames <= num_segments``; the test/"uniform" rule and
dense sampling repeat frames (``int(tick / 2 + tick * x)`` with tick < 1, and a window that wraps
around with ``% num_frames``). No video is dropped for being short.

Random choices use a ``numpy.random.Generator`` the caller seeds per (seed, epoch, sample index).
"""
from __future__ import annotations

import numpy as np

__all__ = ["tsn_train_indices", "tsn_val_indices", "tsn_test_indices", "dense_indices",
           "dense_test_indices", "clip_indices"]


def _check(num_frames: int, num_segments: int) -> None:
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")


def tsn_train_indices(num_frames: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """TSN training clip: one random frame inside each of ``num_segments`` equal segments.

    Returns int64 (T,) indices in [0, num_frames), non-decreasing; all zeros when
    num_frames < T (official behaviour; its "sorted random frames" branch cannot be reached
    with one frame per segment).

    Raises ValueError for num_frames < 1 or num_segments < 1.
    Source: ops/dataset.py ``TSNDataSet._sample_indices`` (dense_sample=False, new_length=1).
    """
    _check(num_frames, num_segments)
    avg = num_frames // num_segments
    if avg > 0:
        return np.arange(num_segments, dtype=np.int64) * avg + rng.integers(0, avg, num_segments)
    if num_frames > num_segments:  # pragma: no cover - unreachable when avg == 0
        return np.sort(rng.integers(0, num_frames, num_segments)).astype(np.int64)
    return np.zeros(num_segments, dtype=np.int64)


def tsn_val_indices(num_frames: int, num_segments: int) -> np.ndarray:
    """TSN validation clip: the centre frame of each of ``num_segments`` equal segments.

    Returns int64 (T,): ``int(tick / 2 + tick * x)`` with tick = num_frames / T when
    num_frames > T, else all zeros (official behaviour).

    Source: ops/dataset.py ``TSNDataSet._get_val_indices``.
    """
    _check(num_frames, num_segments)
    if num_frames > num_segments:
        tick = num_frames / float(num_segments)
        return np.array([int(tick / 2.0 + tick * x) for x in range(num_segments)], dtype=np.int64)
    return np.zeros(num_segments, dtype=np.int64)


def tsn_test_indices(num_frames: int, num_segments: int, *, num_clips: int = 1,
                     twice_sample: bool = False) -> np.ndarray:
    """TSN ("uniform") test views: ``num_clips`` clips of T frames, shape (num_clips, T).

    Clip k takes ``int(tick * (x + (k + 0.5) / num_clips))``, tick = num_frames / T, so one clip
    is the official segment centres ``int(tick / 2 + tick * x)``, and several clips are evenly
    shifted inside the segments (as mmaction2's SampleFrames test mode). With ``twice_sample`` the
    official pair is returned: segment centres and segment starts ``int(tick * x)`` (2 clips).
    Short videos repeat frames (tick < 1). Returns int64 (K, T).

    Source: ops/dataset.py ``TSNDataSet._get_test_indices`` (uniform and twice_sample branches).
    """
    _check(num_frames, num_segments)
    tick = num_frames / float(num_segments)
    x = np.arange(num_segments)
    if twice_sample:
        a = [int(tick / 2.0 + tick * i) for i in x]
        b = [int(tick * i) for i in x]
        return np.clip(np.array([a, b], dtype=np.int64), 0, num_frames - 1)
    if num_clips < 1:
        raise ValueError(f"num_clips must be >= 1, got {num_clips}")
    out = [[int(tick * (i + (k + 0.5) / num_clips)) for i in x] for k in range(num_clips)]
    return np.clip(np.array(out, dtype=np.int64), 0, num_frames - 1)


def _dense_window(num_frames: int, num_segments: int, start: int, stride: int) -> np.ndarray:
    return (np.arange(num_segments, dtype=np.int64) * stride + start) % num_frames


def dense_indices(num_frames: int, num_segments: int, *, train: bool,
                  rng: np.random.Generator | None = None, window: int = 64) -> np.ndarray:
    """Dense (I3D-style) clip: T frames with stride ``window // T`` from one window of ``window``
    frames; indices wrap around (``% num_frames``) for videos shorter than the window.

    Training picks the window start at random in ``[0, num_frames - window)``; validation uses
    the middle start ``(num_frames - window) // 2`` (the official code draws a random start in
    validation too; we keep validation deterministic). Returns int64 (T,).

    Source: ops/dataset.py ``_sample_indices`` / ``_get_val_indices`` (dense_sample=True).
    """
    _check(num_frames, num_segments)
    stride = max(1, window // num_segments)
    sample_pos = max(1, 1 + num_frames - window)
    if train:
        if rng is None:
            raise ValueError("dense_indices(train=True) needs rng")
        start = 0 if sample_pos == 1 else int(rng.integers(0, sample_pos - 1))
    else:
        start = (sample_pos - 1) // 2
    return _dense_window(num_frames, num_segments, start, stride)


def dense_test_indices(num_frames: int, num_segments: int, *, num_clips: int = 10,
                       window: int = 64) -> np.ndarray:
    """Dense test views: ``num_clips`` windows with starts ``linspace(0, num_frames - window,
    num_clips)`` (int), each as :func:`dense_indices`. Returns int64 (num_clips, T).

    Source: ops/dataset.py ``_get_test_indices`` (dense_sample=True, 10 clips there).
    """
    _check(num_frames, num_segments)
    stride = max(1, window // num_segments)
    sample_pos = max(1, 1 + num_frames - window)
    starts = np.linspace(0, sample_pos - 1, num=num_clips, dtype=int)
    return np.stack([_dense_window(num_frames, num_segments, int(s), stride) for s in starts])


def clip_indices(num_frames: int, num_segments: int, *, mode: str, sampling: str = "tsn",
                 rng: np.random.Generator | None = None, num_clips: int = 1,
                 twice_sample: bool = False, window: int = 64) -> np.ndarray:
    """Frame indices for one dataset item: int64 (K, T), K clips (K = 1 for train and val).

    Args:
        mode: "train" | "val" | "test". sampling: "tsn" (segments) | "dense" (I3D window).
        num_clips, twice_sample: test views (see :func:`tsn_test_indices`,
            :func:`dense_test_indices`).

    Raises ValueError for an unknown mode/sampling.
    """
    if sampling not in ("tsn", "dense"):
        raise ValueError(f"sampling must be 'tsn' or 'dense', got {sampling!r}")
    if mode == "train":
        if sampling == "dense":
            return dense_indices(num_frames, num_segments, train=True, rng=rng, window=window)[None]
        if rng is None:
            raise ValueError("training sampling needs rng")
        return tsn_train_indices(num_frames, num_segments, rng)[None]
    if mode == "val":
        if sampling == "dense":
            return dense_indices(num_frames, num_segments, train=False, window=window)[None]
        return tsn_val_indices(num_frames, num_segments)[None]
    if mode == "test":
        if sampling == "dense":
            return dense_test_indices(num_frames, num_segments, num_clips=num_clips, window=window)
        return tsn_test_indices(num_frames, num_segments, num_clips=num_clips,
                                twice_sample=twice_sample)
    raise ValueError(f"mode must be 'train', 'val' or 'test', got {mode!r}")
