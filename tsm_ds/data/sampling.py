"""Which frames make a clip: pure functions from a frame count to 0-based frame indices.

Every rule equals, by value, the official code: mit-han-lab/temporal-shift-module
``ops/dataset.py`` at commit d6da93d7a1dbff5a0dc54da8b1ae9dae28127329 (``TSNDataSet.
_sample_indices``, ``_get_val_indices``, ``_get_test_indices`` with ``new_length=1``), checked
exhaustively for num_segments 1..32 x num_frames 1..3000 in
``tests/data/test_sampling_official.py``. Deliberate, documented differences:

* Indices are 0-based positions in presentation order (the i-th frame a player shows); the
  official code returns the same offsets ``+ 1`` (1-based image numbers ``img_00001.jpg``...).
  So ours == official - 1, element by element.
* Random draws come from a ``numpy.random.Generator`` the caller seeds per (seed, epoch, sample
  index), not the global ``numpy.random`` state. The draws have the official arguments
  (``integers(0, avg, T)`` for ``randint(avg, size=T)``, ``integers(0, sample_pos - 1)`` for
  ``np.random.randint(0, sample_pos - 1)``), and the arithmetic on them is separated into
  :func:`tsn_train_from_draws` and :func:`dense_window_indices`, so equal draws give equal clips.
* Dense validation (``dense_indices(train=False)``) uses the middle window start
  ``(sample_pos - 1) // 2``; the official ``_get_val_indices`` draws a random start as in
  training (use ``train=True`` for that). Validation here stays deterministic.
* Several TSN test clips (``num_clips > 1``, not in the official code) shift the segment
  centres evenly inside the segments; ``num_clips=1`` is the official uniform rule.
* ``window`` (official: 64) is a parameter for dense sampling; the stride is
  ``max(1, window // T)`` (official ``64 // T``, equal for T <= 64).

Short videos follow the official code: TSN training with fewer frames than segments returns
frame 0 for every segment, validation likewise when ``num_frames <= num_segments``; the
test/"uniform" and twice rules repeat frames (``int(tick / 2 + tick * x)`` with tick < 1), and
dense windows wrap around with ``% num_frames``. No video is dropped for being short.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["tsn_train_indices", "tsn_train_from_draws", "tsn_val_indices", "tsn_test_indices",
           "dense_indices", "dense_window_indices", "dense_test_indices", "clip_indices"]


def _check(num_frames: int, num_segments: int) -> None:
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")


def _centres(num_frames: int, num_segments: int) -> np.ndarray:
    # official: tick = num_frames / float(T); [int(tick / 2.0 + tick * x) for x in range(T)].
    # float64 numpy arithmetic is the same IEEE arithmetic, and astype truncates like int().
    tick = num_frames / float(num_segments)
    return (tick / 2.0 + tick * np.arange(num_segments, dtype=np.float64)).astype(np.int64)


def tsn_train_from_draws(num_frames: int, num_segments: int,
                         draws: np.ndarray | None) -> np.ndarray:
    """TSN training clip from given random draws: ``x * avg + draws[x]``, avg = num_frames // T.

    Args:
        draws: int (T,) in ``[0, avg)`` -- the official ``randint(average_duration, size=T)``;
            ignored (may be None) when avg == 0, where the clip is all zeros.

    Returns int64 (T,) indices in [0, num_frames), non-decreasing. The official third branch
    (sorted random frames when avg == 0 but num_frames > T) cannot be reached with
    ``new_length=1``.

    Raises ValueError for num_frames < 1, num_segments < 1, or draws of the wrong shape or range.
    Source: ops/dataset.py ``TSNDataSet._sample_indices`` (dense_sample=False, new_length=1).
    """
    _check(num_frames, num_segments)
    avg = num_frames // num_segments
    if avg == 0:
        return np.zeros(num_segments, dtype=np.int64)
    d = np.asarray(draws, dtype=np.int64)
    if d.shape != (num_segments,) or d.min() < 0 or d.max() >= avg:
        raise ValueError(f"draws must be int ({num_segments},) in [0, {avg}), got {draws!r}")
    return _train_from_draws(num_segments, avg, d)


def _train_from_draws(num_segments: int, avg: int, draws: np.ndarray) -> np.ndarray:
    # official: np.multiply(list(range(T)), average_duration) + randint(average_duration, size=T)
    return np.arange(num_segments, dtype=np.int64) * avg + draws


def tsn_train_indices(num_frames: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """TSN training clip: one random frame inside each of ``num_segments`` equal segments.

    Draws ``rng.integers(0, avg, T)`` (avg = num_frames // T; nothing is drawn when avg == 0)
    and returns :func:`tsn_train_from_draws` of them: int64 (T,) in [0, num_frames),
    non-decreasing; all zeros when num_frames < T (official behaviour).

    Raises ValueError for num_frames < 1 or num_segments < 1.
    Source: ops/dataset.py ``TSNDataSet._sample_indices`` (dense_sample=False, new_length=1).
    """
    _check(num_frames, num_segments)
    avg = num_frames // num_segments
    if avg == 0:
        return np.zeros(num_segments, dtype=np.int64)
    return _train_from_draws(num_segments, avg, rng.integers(0, avg, num_segments))


def tsn_val_indices(num_frames: int, num_segments: int) -> np.ndarray:
    """TSN validation clip: the centre frame of each of ``num_segments`` equal segments.

    Returns int64 (T,): ``int(tick / 2 + tick * x)`` with tick = num_frames / T when
    num_frames > T, else all zeros (official behaviour).

    Raises ValueError for num_frames < 1 or num_segments < 1.
    Source: ops/dataset.py ``TSNDataSet._get_val_indices`` (dense_sample=False, new_length=1).
    """
    _check(num_frames, num_segments)
    if num_frames > num_segments:
        return _centres(num_frames, num_segments)
    return np.zeros(num_segments, dtype=np.int64)


def tsn_test_indices(num_frames: int, num_segments: int, *, num_clips: int = 1,
                     twice_sample: bool = False) -> np.ndarray:
    """TSN ("uniform") test views: ``num_clips`` clips of T frames, shape (num_clips, T).

    One clip is the official segment centres ``int(tick / 2.0 + tick * x)``, tick =
    num_frames / T, for every length (short videos repeat frames, no all-zeros branch). With
    ``twice_sample`` the official pair is returned: segment centres, then segment starts
    ``int(tick * x)`` (2 clips; num_clips ignored). Several clips (not official) take
    ``int(tick * ((k + 0.5) / num_clips) + tick * x)`` for clip k, evenly shifted inside the
    segments (as mmaction2's SampleFrames test mode); k = 0 of one clip is the official rule.
    Returns int64 (K, T) in [0, num_frames).

    Raises ValueError for num_frames < 1, num_segments < 1 or num_clips < 1.
    Source: ops/dataset.py ``TSNDataSet._get_test_indices`` (uniform and twice_sample branches).
    """
    _check(num_frames, num_segments)
    if twice_sample:
        tick = num_frames / float(num_segments)
        out = np.empty((2, num_segments), dtype=np.int64)
        out[0] = _centres(num_frames, num_segments)
        out[1] = tick * np.arange(num_segments, dtype=np.float64)  # int(tick * x): truncates
        return out
    if num_clips < 1:
        raise ValueError(f"num_clips must be >= 1, got {num_clips}")
    if num_clips == 1:
        return _centres(num_frames, num_segments)[None]
    tick = num_frames / float(num_segments)
    x = np.arange(num_segments, dtype=np.float64)
    out = [(tick * ((k + 0.5) / num_clips) + tick * x).astype(np.int64) for k in range(num_clips)]
    return np.clip(np.stack(out), 0, num_frames - 1)


def dense_window_indices(num_frames: int, num_segments: int, start: int, *,
                         window: int = 64) -> np.ndarray:
    """Dense (I3D-style) clip from a given window start: ``(x * stride + start) % num_frames``
    with stride ``max(1, window // T)``. Returns int64 (T,).

    Raises ValueError for num_frames < 1, num_segments < 1 or start < 0.
    Source: ops/dataset.py ``_sample_indices`` / ``_get_val_indices`` / ``_get_test_indices``
    (dense_sample=True: ``(idx * t_stride + start_idx) % record.num_frames``).
    """
    _check(num_frames, num_segments)
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    stride = max(1, window // num_segments)
    return (np.arange(num_segments, dtype=np.int64) * stride + int(start)) % num_frames


def dense_indices(num_frames: int, num_segments: int, *, train: bool,
                  rng: np.random.Generator | None = None, window: int = 64) -> np.ndarray:
    """Dense (I3D-style) clip: T frames with stride ``window // T`` from one window of ``window``
    frames; indices wrap around (``% num_frames``) for videos shorter than the window.

    sample_pos = max(1, 1 + num_frames - window). Training draws the start as the official code,
    0 if sample_pos == 1 else ``rng.integers(0, sample_pos - 1)`` (so in ``[0, sample_pos - 2]``);
    validation uses the middle start ``(sample_pos - 1) // 2`` (the official code draws a random
    start in validation too; we keep validation deterministic). Returns int64 (T,), see
    :func:`dense_window_indices`.

    Raises ValueError for num_frames < 1, num_segments < 1, or train without rng.
    Source: ops/dataset.py ``_sample_indices`` / ``_get_val_indices`` (dense_sample=True).
    """
    _check(num_frames, num_segments)
    sample_pos = max(1, 1 + num_frames - window)
    if train:
        if rng is None:
            raise ValueError("dense_indices(train=True) needs rng")
        start = 0 if sample_pos == 1 else int(rng.integers(0, sample_pos - 1))
    else:
        start = (sample_pos - 1) // 2
    return dense_window_indices(num_frames, num_segments, start, window=window)


@lru_cache(maxsize=4096)
def _dense_test_starts(sample_pos: int, num_clips: int) -> np.ndarray:
    # official: np.linspace(0, sample_pos - 1, num=10, dtype=int); cached (read-only) per length
    starts = np.linspace(0, sample_pos - 1, num=num_clips, dtype=int).astype(np.int64)
    starts.flags.writeable = False
    return starts


def dense_test_indices(num_frames: int, num_segments: int, *, num_clips: int = 10,
                       window: int = 64) -> np.ndarray:
    """Dense test views: ``num_clips`` windows with starts ``linspace(0, sample_pos - 1,
    num_clips, dtype=int)``, sample_pos = max(1, 1 + num_frames - window), each as
    :func:`dense_window_indices`. Returns int64 (num_clips, T).

    Raises ValueError for num_frames < 1 or num_segments < 1.
    Source: ops/dataset.py ``_get_test_indices`` (dense_sample=True, 10 clips there).
    """
    _check(num_frames, num_segments)
    starts = _dense_test_starts(max(1, 1 + num_frames - window), num_clips)
    stride = max(1, window // num_segments)
    # row k is dense_window_indices(num_frames, num_segments, starts[k], window=window)
    return (starts[:, None] + np.arange(num_segments, dtype=np.int64) * stride) % num_frames


def clip_indices(num_frames: int, num_segments: int, *, mode: str, sampling: str = "tsn",
                 rng: np.random.Generator | None = None, num_clips: int = 1,
                 twice_sample: bool = False, window: int = 64) -> np.ndarray:
    """Frame indices for one dataset item: int64 (K, T), K clips (K = 1 for train and val).

    Args:
        mode: "train" | "val" | "test". sampling: "tsn" (segments) | "dense" (I3D window).
        num_clips, twice_sample: test views (see :func:`tsn_test_indices`,
            :func:`dense_test_indices`).

    Raises ValueError for an unknown mode/sampling (and as the rules it calls).
    Source: ops/dataset.py ``TSNDataSet.__getitem__`` (train: ``_sample_indices``, val:
    ``_get_val_indices``, test: ``_get_test_indices``); see the module docstring for the
    deliberate differences (0-based, deterministic dense validation, several TSN test clips).
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
