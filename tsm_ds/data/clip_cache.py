"""Decoded frames kept in memory: every video is decoded once per process, clips are still drawn.

:class:`DecodedFrameCache` holds the decoded frames of whole videos, uint8 (N, H, W, 3) RGB per
(file, decode short side). A :class:`~tsm_ds.data.dataset.VideoClipDataset` whose ``frame_cache``
is set takes its clips' frames from it instead of decoding them: the frame indices (TSN segment
sampling) and the crops / flips are still drawn per (seed, epoch, index) exactly as without the
cache, so an item is bit-identical with and without it; only the decoding is done once.

What it is for: many epochs over a small dataset (``tsm-ds bench large-batch``, the demo data)
where decoding would be most of the loader's work. What it costs: the whole decoded videos,
``frames x height x width x 3`` bytes each at the decode size (the dataset's
``decode_short_side``: 331 * S / 224 px short side for training at crop side S, 256 * S / 224 for
validation). The demo data at ``--img-size 32`` (16 frames, 47 x 47 training frames): 106 KB a
video, 136 MB for 1,280 training clips. Kinetics-400 at 224 px (~300 frames of 331 x 441) would be
~130 MB a video: not what this is for. Memory is bounded by ``max_bytes``: videos that do not fit
are decoded per access as without the cache (counted in :attr:`DecodedFrameCache.skipped`, one
``RuntimeWarning``).

Processes: entries live in the process that decoded them. :func:`attach_frame_cache` decodes
every record in the calling process before training, so that DataLoader workers forked from it
(Linux' default start method) share the frames copy-on-write; entries a worker adds itself are
lost when the worker exits (``persistent_workers=False`` restarts workers every epoch). Each rank
holds its own copy (a rank samples every record over the epochs).
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Iterable, Sequence

import numpy as np

from . import video as _video

__all__ = ["DecodedFrameCache", "attach_frame_cache"]


class DecodedFrameCache:
    """Whole decoded videos in memory, keyed by (path, decode short side), up to ``max_bytes``.

    Args:
        max_bytes: largest total size of the cached frames in bytes (> 0); a video that would
            exceed it is not cached (decoded per access; :attr:`skipped` counts them).

    Attributes:
        nbytes: bytes of frames held; hits / misses: :meth:`get` calls served from memory / that
            decoded; skipped: videos decoded but not kept (over ``max_bytes``).

    Raises:
        ValueError: ``max_bytes`` < 1.
    """

    def __init__(self, max_bytes: int):
        if int(max_bytes) < 1:
            raise ValueError(f"DecodedFrameCache: max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._frames: dict[tuple[str, int | None], np.ndarray] = {}
        self.nbytes = 0
        self.hits = self.misses = self.skipped = 0

    def __len__(self) -> int:
        return len(self._frames)

    def __contains__(self, key: tuple[str, int | None]) -> bool:
        return (str(key[0]), key[1]) in self._frames

    def _decode_all(self, path: str, num_frames: int | None, short_side: int | None,
                    thread_count: int, frame_template: str | None = None) -> np.ndarray:
        """Every frame of ``path`` with :func:`tsm_ds.data.video.decode_frames` (the decoder the
        uncached path uses, so that the pixels are the same). Raises VideoError."""
        template = frame_template or _video.FRAME_TEMPLATE
        if os.path.isdir(path):   # as the dataset: a list file's count is for folders
            num_frames = num_frames or _video.frame_folder_count(path, template)
        else:
            num_frames = _video.count_frames(path)
        frames = _video.decode_frames(path, range(num_frames), num_frames=num_frames,
                                      thread_count=thread_count, short_side=short_side, frame_template=template)
        frames.setflags(write=False)   # shared by every clip (and forked worker): never modified
        return frames

    def video(self, path: str, *, num_frames: int | None = None, short_side: int | None = None,
              thread_count: int = 1, frame_template: str | None = None) -> np.ndarray:
        """All decoded frames of ``path``: uint8 (N, H, W, 3) RGB, read-only; from memory, else
        decoded (and kept when they fit in ``max_bytes``).

        Args:
            path: a video file or a JPEG frame folder.
            num_frames: frame count (frame folders: the list file's; None: counted).
            short_side: decode short side (see :func:`~tsm_ds.data.video.decode_frames`).
            thread_count: decoder threads when decoding.
            frame_template: frame file names of a frame folder (None:
                :data:`~tsm_ds.data.video.FRAME_TEMPLATE`).

        Raises:
            tsm_ds.data.video.VideoError: the file cannot be opened / has no decodable frame
            (nothing is cached for it).
        """
        key = (str(path), short_side)
        frames = self._frames.get(key)
        if frames is not None:
            self.hits += 1
            return frames
        self.misses += 1
        frames = self._decode_all(key[0], num_frames, short_side, thread_count, frame_template)
        if self.nbytes + frames.nbytes <= self.max_bytes:
            self._frames[key] = frames
            self.nbytes += frames.nbytes
        else:
            if self.skipped == 0:
                warnings.warn(f"decoded-frame cache full ({self.nbytes / 2**20:.0f} of "
                              f"{self.max_bytes / 2**20:.0f} MB): {path} and further videos are decoded "
                              f"per clip; raise train.py --cache-decoded-max-mb to keep them all",
                              RuntimeWarning, stacklevel=2)
            self.skipped += 1
        return frames

    def get(self, path: str, indices: Iterable[int], *, num_frames: int | None = None,
            thread_count: int = 1, short_side: int | None = None, frame_template: str | None = None) -> np.ndarray:
        """Frames ``indices`` of ``path``, as :func:`tsm_ds.data.video.decode_frames` returns them.

        Args:
            path, num_frames, short_side, thread_count, frame_template: see :meth:`video`.
            indices: frame indices in presentation order, any order, repeats allowed; clipped to
                [0, N - 1] as ``decode_frames`` clips them.

        Returns:
            np.uint8 (T, H, W, 3) RGB, T = len(indices), a new (writable) array.

        Raises:
            ValueError: no indices. tsm_ds.data.video.VideoError: see :meth:`video`.
        """
        want = np.fromiter((int(i) for i in indices), dtype=np.int64)
        if want.size == 0:
            raise ValueError("DecodedFrameCache.get: no indices requested")
        frames = self.video(path, num_frames=num_frames, short_side=short_side, thread_count=thread_count,
                            frame_template=frame_template)
        return frames[np.clip(want, 0, len(frames) - 1)]

    def stats(self) -> dict:
        """{"videos", "mb" (MiB held), "max_mb", "hits", "misses", "skipped"} (this process)."""
        return {"videos": len(self._frames), "mb": round(self.nbytes / 2**20, 1),
                "max_mb": round(self.max_bytes / 2**20, 1), "hits": self.hits, "misses": self.misses,
                "skipped": self.skipped}


def attach_frame_cache(datasets: Sequence, *, max_mb: float, thread_count: int = 1) -> tuple[DecodedFrameCache, dict]:
    """Give ``datasets`` one shared :class:`DecodedFrameCache` and decode all their records into it now.

    Args:
        datasets: :class:`~tsm_ds.data.dataset.VideoClipDataset` objects (None entries skipped);
            each one's ``frame_cache`` is set and its records are decoded at its
            ``decode_short_side``.
        max_mb: the cache's size limit in MiB (> 0).
        thread_count: decoder threads.

    Returns:
        (the cache, {"videos", "mb", "max_mb", "skipped", "unreadable", "seconds"}); unreadable
        files are left out (the dataset reports and replaces them when it meets them).

    Raises:
        ValueError: ``max_mb`` <= 0.
    """
    if not max_mb > 0:
        raise ValueError(f"max_mb must be > 0, got {max_mb} (train.py --cache-decoded-max-mb)")
    cache = DecodedFrameCache(int(max_mb * 2**20))
    t0, unreadable = time.perf_counter(), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # the dataset warns about bad files when it meets them
        for ds in datasets:
            if ds is None:
                continue
            ds.frame_cache = cache
            options = getattr(ds, "reader_options", None)
            if options is not None:
                options.apply()   # this process decodes: its frame-index cache as the dataset says
            for rec in ds.records:
                try:
                    cache.video(rec.path, num_frames=rec.num_frames, short_side=ds.decode_short_side,
                                thread_count=thread_count, frame_template=rec.frame_template)
                except _video.VideoError:
                    unreadable += 1
    cache.hits = cache.misses = 0       # count the training's own accesses from here
    return cache, {**cache.stats(), "unreadable": unreadable, "seconds": round(time.perf_counter() - t0, 1)}
