"""The frame index of a video file: a demux-only pass (no decoding), cached in process and on disk.

A *frame index* is the i-th frame in presentation order, counted from 0. The number of frames
comes from a demux-only pass over the video stream's packets, cached per file in a
:class:`VideoIndex`; container metadata (``stream.frames``) is never trusted, it is 0 or wrong on
many files (WebM, cut AVIs, files with dropped frames).

The index holds, per packet in decode order, its pts and keyframe flag. Sorting the pts gives
the pts of every frame in presentation order, so ``frame_pts[i]`` names frame ``i``; files whose
timestamps cannot name frames are marked ``seekable=False`` (decoded sequentially, see
:func:`tsm_ds.data.video.decode_frames`).

Caches: in process (least recently used first out, :data:`INDEX_CACHE_SIZE` entries) and, when
:func:`set_index_cache_dir` (or ``TSM_DS_INDEX_CACHE``) names a folder, on disk, shared by
DataLoader workers and runs; both keyed by (real path, size, mtime).
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tsm_ds.utils.io import atomic_path

from .errors import NoVideoStreamError, VideoDecodeError, VideoOpenError, check_readable_file, warn_once
from .frames import frame_folder_count, is_frame_folder
from .packed import is_packed, packed_count

__all__ = ["VideoIndex", "build_index", "get_index", "count_frames", "set_index_cache_dir",
           "clear_index_cache", "set_index_cache_size", "open_video", "video_stream", "INDEX_CACHE_SIZE"]

_NO_PTS = np.iinfo(np.int64).min


@dataclass
class VideoIndex:
    """What a demux-only pass learns about a video file's (first usable) video stream.

    Attributes:
        path: the file.
        stream_index: index of the chosen video stream in the container.
        num_frames: packets with a payload (= frames, except for placeholder packets some AVI
            encoders write; those frames are then replaced, see
            :func:`tsm_ds.data.video.decode_frames`).
        pkt_pts: int64 (P,) packet pts in decode order (stream time base); ``_NO_PTS`` if absent.
        pkt_key: bool (P,) keyframe flag per packet, decode order.
        seekable: True when pts identify frames (unique, present, and not decode-order stamps on a
            codec that reorders); False means sequential decoding from the start.
        has_b_frames: the codec reorders frames (decoder delay > 0).
    """

    path: str
    stream_index: int
    num_frames: int
    pkt_pts: np.ndarray
    pkt_key: np.ndarray
    seekable: bool
    has_b_frames: bool = False
    # derived lookups (filled by __post_init__)
    frame_pts: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    key_pos: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    key_pts: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    order: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.frame_pts = np.sort(self.pkt_pts)
        self.key_pos = np.flatnonzero(self.pkt_key)
        self.key_pts = self.pkt_pts[self.key_pos]
        if self.seekable and (len(self.key_pos) == 0 or self.key_pos[0] != 0
                              or np.any(np.diff(self.key_pts) <= 0)):
            # no keyframe at the start, or keyframes out of pts order: do not trust seeks
            self.seekable = False
        # frame_pts[j] is the pts of decode position order[j]; lookups by binary search keep
        # the index small (24 bytes per frame) for datasets of many files
        self.order = np.argsort(self.pkt_pts, kind="stable")

    def frame_of(self, pts: int) -> int | None:
        """Presentation index of the frame with this pts, or None."""
        j = int(np.searchsorted(self.frame_pts, pts))
        return j if j < len(self.frame_pts) and self.frame_pts[j] == pts else None

    def pos_of(self, pts: int) -> int | None:
        """Decode position (packet index) of the packet with this pts, or None."""
        j = self.frame_of(pts)
        return None if j is None else int(self.order[j])

    def keyframe_for(self, frame: int) -> tuple[int, int]:
        """(decode position, pts) of the last keyframe whose pts <= the pts of ``frame``."""
        t = self.frame_pts[frame]
        k = int(np.searchsorted(self.key_pts, t, side="right")) - 1
        k = max(k, 0)
        return int(self.key_pos[k]), int(self.key_pts[k])


_index_cache: OrderedDict[tuple[str, int, int], VideoIndex] = OrderedDict()
#: most frame indexes kept in this process (least recently used dropped first; a dropped one is
#: rebuilt by one demux pass, or read from the on-disk cache)
#: rebuilt by one demux pass, or read from the on-disk cache); training sets it from
#: ``data.index_cache_size`` (:func:`set_index_cache_size`)
INDEX_CACHE_SIZE = 8192
_index_cache_dir: str | None = None   # a dataset's reader_options set it (:func:`set_index_cache_dir`)


def set_index_cache_dir(path: str | os.PathLike | None) -> None:
    """Also keep frame indexes on disk under ``path`` (shared by DataLoader workers and runs).

    ``None`` keeps them in this process only (the default). A dataset sets it in the process that
    reads it from its ``reader_options`` (``--index-cache`` / ``TSM_DS_INDEX_CACHE``;
    :meth:`tsm_ds.data.options.ReaderOptions.apply`). Entries are keyed by (real path, size, mtime), so
    edited files re-index.
    """
    global _index_cache_dir
    _index_cache_dir = None if path is None else str(path)


def set_index_cache_size(entries: int) -> None:
    """Keep at most ``entries`` frame indexes in this process (default 8192; a dataset sets it from its
    ``reader_options``, ``--index-cache-size`` / ``TSM_DS_INDEX_CACHE_SIZE``); the least recently used are
    dropped first.

    Raises:
        ValueError: ``entries`` < 1.
    """
    global INDEX_CACHE_SIZE
    if int(entries) < 1:
        raise ValueError(f"index cache size must be >= 1 entry, got {entries}")
    INDEX_CACHE_SIZE = int(entries)
    while len(_index_cache) > INDEX_CACHE_SIZE:
        _index_cache.popitem(last=False)


def clear_index_cache() -> None:
    """Forget every in-process frame index (the on-disk cache, if any, is kept)."""
    _index_cache.clear()


def open_video(path: str):
    """Open ``path`` with PyAV for reading (``metadata_errors="ignore"``: undecodable tags are
    dropped, not fatal). The caller closes the returned ``av`` input container.

    Raises:
        VideoOpenError: the file does not exist, or FFmpeg cannot open it (names the reason).
    """
    import av

    check_readable_file(path)   # the real reason: ENOENT, ELOOP, EACCES, a folder
    try:
        return av.open(path, metadata_errors="ignore")
    except Exception as e:  # av.FFmpegError, UnicodeDecodeError, OSError, ...
        raise VideoOpenError(path, f"cannot open: {type(e).__name__}: {e}") from None


def video_stream(container, path: str):
    """The first video stream of an open container that is not an attached picture (cover art);
    audio may come first.

    Raises:
        NoVideoStreamError: no such stream (audio-only or data-only file); ``path`` names it.
    """
    for s in container.streams.video:
        disp = getattr(s, "disposition", None)
        try:
            import av

            if disp is not None and (disp & av.stream.Disposition.attached_pic):
                continue
        except Exception:  # pragma: no cover - older PyAV without Disposition
            pass
        return s
    raise NoVideoStreamError(path, "no video stream (audio-only or data-only file)")


def build_index(path: str | os.PathLike) -> VideoIndex:
    """Demux (do not decode) the video stream of ``path`` once and return its :class:`VideoIndex`.

    Cost: reading packet headers only, about 1-4 ms for a 10 s clip. A demux error part-way keeps
    the packets read so far (one warning per file).

    Raises:
        VideoOpenError, NoVideoStreamError, VideoDecodeError (no packet with a payload).
    """
    path = str(path)
    container = open_video(path)
    try:
        stream = video_stream(container, path)
        pts: list[int] = []
        key: list[bool] = []
        try:
            for p in container.demux(stream):
                if p.size == 0:  # flush packets, and AVI index entries of dropped frames
                    continue
                pts.append(_NO_PTS if p.pts is None else int(p.pts))
                key.append(bool(p.is_keyframe))
        except Exception as e:  # a demux error part-way: keep the packets read so far
            warn_once(path, "demux", f"{path}: demux error after {len(pts)} packets "
                                      f"({type(e).__name__}: {e}); counting those")
        if not pts:
            raise VideoDecodeError(path, "the video stream has no packets")
        has_b = bool(stream.codec_context.has_b_frames)
        arr = np.asarray(pts, dtype=np.int64)
        monotonic = bool(np.all(np.diff(arr) > 0))
        seekable = (not np.any(arr == _NO_PTS)) and len(np.unique(arr)) == len(arr)
        if has_b and (monotonic or container.format.name == "avi"):
            # the codec reorders frames but the packets carry decode-order stamps: the pts do not
            # name presentation positions (AVI with B-frames, MP4 without a ctts table)
            seekable = False
        return VideoIndex(path, stream.index, len(pts), arr, np.asarray(key, dtype=bool),
                          seekable, has_b)
    finally:
        container.close()


def _disk_cache_file(key: tuple[str, int, int]) -> Path | None:
    if not _index_cache_dir:
        return None
    h = hashlib.sha1(repr(key).encode()).hexdigest()[:20]
    return Path(_index_cache_dir) / f"{h}.npz"


def get_index(path: str | os.PathLike) -> VideoIndex:
    """The cached :class:`VideoIndex` of ``path`` (built by :func:`build_index` on first use).

    The in-process cache is keyed by (real path, size in bytes, mtime in ns); the optional on-disk
    cache (:func:`set_index_cache_dir`, written atomically, an unreadable entry is rebuilt) uses
    the same key.

    Raises:
        VideoOpenError (file not found, symbolic link loop, ...: :func:`~.errors.check_readable_file`),
        and what :func:`build_index` raises.
    """
    path = str(path)
    st = check_readable_file(path)   # VideoOpenError with the real reason (ENOENT, ELOOP, ...)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    idx = _index_cache.get(key)
    if idx is not None:
        _index_cache.move_to_end(key)
        return idx
    f = _disk_cache_file(key)
    if f is not None and f.is_file():
        try:
            z = np.load(f)
            idx = VideoIndex(path, int(z["stream_index"]), int(z["num_frames"]), z["pkt_pts"],
                             z["pkt_key"], bool(z["seekable"]), bool(z["has_b_frames"]))
        except Exception:
            idx = None
    if idx is None:
        idx = build_index(path)
        if f is not None:
            try:
                with atomic_path(f, suffix=".npz") as tmp:
                    np.savez(tmp, stream_index=idx.stream_index, num_frames=idx.num_frames,
                             pkt_pts=idx.pkt_pts, pkt_key=idx.pkt_key, seekable=idx.seekable,
                             has_b_frames=idx.has_b_frames)
            except OSError:
                pass
    _index_cache[key] = idx
    while len(_index_cache) > INDEX_CACHE_SIZE:
        _index_cache.popitem(last=False)
    return idx


def count_frames(path: str | os.PathLike) -> int:
    """Frames in a video file (cached demux-only packet count), a JPEG frame folder or a packed
    video (its header).

    Raises:
        VideoOpenError / NoVideoStreamError / VideoDecodeError as :func:`build_index`;
        VideoDecodeError for a frame folder without a first frame.
    """
    path = str(path)
    if is_frame_folder(path):
        return frame_folder_count(path)
    if is_packed(path):
        return packed_count(path)
    return get_index(path).num_frames
