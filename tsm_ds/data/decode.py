"""Decode exactly the frames a clip needs from a video file (PyAV) or a JPEG frame folder.

A *frame index* is the i-th frame in presentation order, counted from 0. The number of frames
comes from a demux-only pass over the video stream's packets (no decoding), cached per file in a
:class:`VideoIndex`; container metadata (``stream.frames``) is never trusted, it is 0 or wrong on
many files (WebM, cut AVIs, files with dropped frames).

How a clip is decoded (:func:`decode_frames`):

1. The index holds, per packet in decode order, its pts and keyframe flag. Sorting the pts gives
   the pts of every frame in presentation order, so ``pts_of_frame[i]`` names frame ``i``.
2. For the next frame still needed, we look up the last keyframe whose pts is <= the frame's pts.
   When that keyframe lies *past* the packet we decoded last, we seek to it (the decoder is
   flushed); otherwise we keep decoding forward, which is cheaper than a seek. Decoded frames
   are matched to requested frames by pts and only those are converted to RGB.
3. Files whose timestamps cannot name frames (AVI with B-frames, MP4 without a composition-time
   table: the decoder reorders frames but the packets carry decode-order stamps) are decoded
   sequentially from the start, counting frames as the decoder outputs them (presentation order).
   The same happens, with a one-time warning, when the decoder's output pts ever go backwards.

Frames the stream does not deliver (a decode error part-way, or the packet count exceeding the
decodable frames, e.g. DivX "packed B-frame" placeholder packets) are replaced by the last frame
that decoded, after one warning per file; see :func:`decode_frames`. A file with no decodable frame
raises :class:`VideoDecodeError`.

Rotation metadata (display matrix, ``frame.rotation`` in PyAV 18) is applied as ffmpeg's
autorotate does, so frames look as a player shows them. Containers are always closed. Decoding uses
one thread per call by default (``thread_count=1``), which is what a DataLoader worker wants, and
avoids PyAV's frame-threading hang when a decode loop is left early.
"""
from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "VideoError", "VideoOpenError", "NoVideoStreamError", "VideoDecodeError",
    "VideoIndex", "DecodeStats", "build_index", "get_index", "count_frames", "decode_frames",
    "decode_all_frames", "is_frame_folder", "frame_folder_count", "set_index_cache_dir",
    "warn_once", "clear_index_cache", "iter_frames",
]

_NO_PTS = np.iinfo(np.int64).min


class VideoError(Exception):
    """Base class: a video file that cannot be used. ``path`` and ``reason`` name the problem."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class VideoOpenError(VideoError):
    """The file does not exist or FFmpeg cannot open it as a media container."""


class NoVideoStreamError(VideoError):
    """The container opens but holds no video stream (e.g. an audio-only file)."""


class VideoDecodeError(VideoError):
    """The video stream yields no decodable frame (or no packet at all)."""


# --------------------------------------------------------------------------------------------
# warnings: once per (file, kind) per process
_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


def warn_once(path: str | os.PathLike, kind: str, message: str) -> bool:
    """Issue ``RuntimeWarning(message)`` the first time ``(path, kind)`` is seen in this process.

    Returns True when the warning was issued, False when it had been issued before.
    """
    key = (str(path), kind)
    with _warn_lock:
        if key in _warned:
            return False
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return True


# --------------------------------------------------------------------------------------------
@dataclass
class VideoIndex:
    """What a demux-only pass learns about a video file's (first usable) video stream.

    Attributes:
        path: the file.
        stream_index: index of the chosen video stream in the container.
        num_frames: packets with a payload (= frames, except for placeholder packets some AVI
            encoders write; those frames are then replaced, see :func:`decode_frames`).
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


def _file_key(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


_index_cache: OrderedDict[tuple[str, int, int], VideoIndex] = OrderedDict()
#: most frame indexes kept in this process (least recently used dropped first; a dropped one is
#: rebuilt by one demux pass, or read from the on-disk cache)
INDEX_CACHE_SIZE = int(os.environ.get("TSM_DS_INDEX_CACHE_SIZE", "8192"))
_index_cache_dir: str | None = os.environ.get("TSM_DS_INDEX_CACHE") or None


def set_index_cache_dir(path: str | os.PathLike | None) -> None:
    """Also keep frame indexes on disk under ``path`` (shared by DataLoader workers and runs).

    ``None`` keeps them in this process only. The environment variable ``TSM_DS_INDEX_CACHE``
    sets the default. Entries are keyed by (real path, size, mtime), so edited files re-index.
    """
    global _index_cache_dir
    _index_cache_dir = None if path is None else str(path)


def clear_index_cache() -> None:
    """Forget every in-process frame index (the on-disk cache, if any, is kept)."""
    _index_cache.clear()


def _open(path: str):
    import av

    if not os.path.isfile(path):
        raise VideoOpenError(path, "file not found (check the list file's paths and the data root)")
    try:
        return av.open(path, metadata_errors="ignore")
    except Exception as e:  # av.FFmpegError, UnicodeDecodeError, OSError, ...
        raise VideoOpenError(path, f"cannot open: {type(e).__name__}: {e}") from None


def _video_stream(container, path: str):
    """The first video stream that is not an attached picture (cover art); audio may come first."""
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

    Cost: reading packet headers only, about 1-4 ms for a 10 s clip.

    Raises:
        VideoOpenError, NoVideoStreamError, VideoDecodeError (no packet with a payload).
    """
    path = str(path)
    container = _open(path)
    try:
        stream = _video_stream(container, path)
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
    cache (:func:`set_index_cache_dir`) uses the same key. Raises what :func:`build_index` raises.
    """
    path = str(path)
    try:
        key = _file_key(path)
    except OSError:
        raise VideoOpenError(path, "file not found (check the list file's paths and the data root)"
                             ) from None
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
                f.parent.mkdir(parents=True, exist_ok=True)
                tmp = f.with_suffix(f".{os.getpid()}.tmp.npz")
                np.savez(tmp, stream_index=idx.stream_index, num_frames=idx.num_frames,
                         pkt_pts=idx.pkt_pts, pkt_key=idx.pkt_key, seekable=idx.seekable,
                         has_b_frames=idx.has_b_frames)
                os.replace(tmp, f)
            except OSError:
                pass
    _index_cache[key] = idx
    while len(_index_cache) > INDEX_CACHE_SIZE:
        _index_cache.popitem(last=False)
    return idx


# --------------------------------------------------------------------------------------------
# JPEG frame folders (official TSM layout: img_00001.jpg, 1-indexed)
FRAME_TEMPLATE = "img_{:05d}.jpg"


def is_frame_folder(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory (a JPEG frame folder), False for a file."""
    return os.path.isdir(path)


def frame_folder_count(path: str | os.PathLike, template: str = FRAME_TEMPLATE) -> int:
    """Number of frames in a JPEG frame folder: the count of consecutive files img_00001.jpg...

    Raises VideoDecodeError when the folder holds no first frame.
    """
    path = str(path)
    names = set(os.listdir(path))
    n = 0
    # the files are consecutive in the official layout; count up, then confirm by the set
    while template.format(n + 1) in names:
        n += 1
    if n == 0:
        raise VideoDecodeError(path, f"frame folder has no {template.format(1)}")
    return n


def _read_jpegs(path: str, indices: Sequence[int], template: str) -> np.ndarray:
    import torch
    from torchvision.io import ImageReadMode, decode_image, read_file

    cache: dict[int, np.ndarray] = {}
    out = []
    for i in indices:
        if i not in cache:
            f = os.path.join(path, template.format(i + 1))
            try:
                img = decode_image(read_file(f), mode=ImageReadMode.RGB)
            except Exception as e:
                raise VideoDecodeError(f, f"cannot read frame: {type(e).__name__}: {e}") from None
            cache[i] = img.permute(1, 2, 0).contiguous().numpy()
        out.append(cache[i])
    del torch
    return np.stack(out)


# --------------------------------------------------------------------------------------------
@dataclass
class DecodeStats:
    """What one :func:`decode_frames` call did. ``decoded``: frames the decoder produced;
    ``seeks``; ``missing``: requested frames the stream did not deliver (replaced by the last
    decoded frame); ``sequential``: decoded from the start without seeking."""

    decoded: int = 0
    seeks: int = 0
    missing: int = 0
    sequential: bool = False
    error: str | None = None


def _rotate(img: np.ndarray, rotation: float | int | None) -> np.ndarray:
    """Apply display-matrix rotation as ffmpeg's autorotate does.

    ``rotation`` is PyAV's ``frame.rotation``: degrees counter-clockwise (av_display_rotation_get).
    ffmpeg rotates the picture by -rotation (e.g. -90 -> transpose=clock, a clockwise turn).
    np.rot90(k) turns counter-clockwise k times, so k = round(rotation / 90) mod 4.
    """
    if not rotation:
        return img
    k = int(round(float(rotation) / 90.0)) % 4
    return np.ascontiguousarray(np.rot90(img, k)) if k else img


def _out_size(frame, short_side: int | None) -> tuple[int, int]:
    """(width, height) to convert ``frame`` to: its own size, or scaled down so that the short
    side is ``short_side`` (never scaled up)."""
    w, h = frame.width, frame.height
    if not short_side or min(w, h) <= short_side:
        return (w, h)
    s = short_side / min(w, h)
    return (max(1, int(round(w * s))), max(1, int(round(h * s))))


def _to_rgb(frame, size: tuple[int, int] | None) -> np.ndarray:
    if size is None or (frame.width, frame.height) == size:
        arr = frame.to_ndarray(format="rgb24")
    else:  # scaled in the same swscale pass as the RGB conversion (bilinear, area-filtered
        # when shrinking); also used when the resolution changes mid-stream
        arr = frame.to_ndarray(format="rgb24", width=size[0], height=size[1],
                               interpolation="BILINEAR")
    return _rotate(arr, getattr(frame, "rotation", 0))


def _configure(stream, thread_count: int) -> None:
    cc = stream.codec_context
    cc.thread_count = max(0, int(thread_count))
    # frame threading can hang when a decode loop is left early in a DataLoader worker;
    # slice threading is safe. With one thread the type does not matter.
    cc.thread_type = "SLICE"


def decode_frames(path: str | os.PathLike, indices: Iterable[int], *, num_frames: int | None = None,
                  thread_count: int = 1, stats: DecodeStats | None = None,
                  frame_template: str = FRAME_TEMPLATE, skip_nonref: bool = True,
                  short_side: int | None = None) -> np.ndarray:
    """Decode frames ``indices`` (presentation order, 0-based) of a video file or frame folder.

    Args:
        path: a video file, or a JPEG frame folder (``img_00001.jpg`` ... 1-indexed files).
        indices: frame indices, any order, repeats allowed. Indices are clipped to
            ``[0, num_frames - 1]``.
        num_frames: for frame folders, the count from the list file (counted when None); ignored
            for video files (the cached packet count is used).
        thread_count: decoder threads (1 = one thread, right for DataLoader workers).
        stats: a :class:`DecodeStats` to fill (frames decoded, seeks, ...), for benchmarks.
        skip_nonref: let the decoder skip non-reference frames that are not asked for (files with
            trustworthy pts only; exact, since no other frame needs them; ~2x fewer frames
            decoded on H.264 with B-frames).
        short_side: when set, frames whose short side is larger are scaled down to it while they
            are converted to RGB (cheaper than converting full-size frames and resizing after;
            video files only). None keeps the decoded size.

    Returns:
        np.uint8 array (T, H, W, 3), RGB, T = len(indices), in the order of ``indices``; H, W
        after rotation metadata is applied.

    Raises:
        VideoOpenError, NoVideoStreamError, VideoDecodeError (no decodable frame at all).

    Partial streams: when the decoder stops early (a decode error part-way, or fewer frames than
    packets), requested frames past the last decoded frame are replaced by the last decoded frame
    (as the official code repeats frames of short videos) and a warning names the file once.
    """
    path = str(path)
    st = stats if stats is not None else DecodeStats()
    want = [int(i) for i in indices]
    if not want:
        raise ValueError("decode_frames: no indices requested")
    if is_frame_folder(path):
        n = num_frames if num_frames else frame_folder_count(path, frame_template)
        want = [min(max(i, 0), n - 1) for i in want]
        return _read_jpegs(path, want, frame_template)

    idx = get_index(path)
    n = idx.num_frames
    want = [min(max(i, 0), n - 1) for i in want]
    targets = sorted(set(want))
    got: dict[int, np.ndarray] = {}
    container = _open(path)
    try:
        stream = container.streams[idx.stream_index]
        _configure(stream, thread_count)
        last = None
        if idx.seekable:
            ok, last = _decode_seeking(container, stream, idx, targets, got, st, skip_nonref,
                                       short_side)
            if not ok:
                warn_once(path, "pts", f"{path}: decoder output timestamps are not in "
                                       "presentation order; decoding this file sequentially")
                idx.seekable = False
                got.clear()
                container.close()
                container = _open(path)
                stream = container.streams[idx.stream_index]
                _configure(stream, thread_count)
        if not idx.seekable:
            st.sequential = True
            last = _decode_sequential(container, stream, targets, got, st, short_side)
    finally:
        container.close()

    if not got and last is None:
        raise VideoDecodeError(path, f"no decodable frame ({st.error or 'the decoder returned none'})")
    missing = [i for i in targets if i not in got]
    if missing:
        st.missing = len(missing)
        last_i, last_img = last if last is not None else max(got.items())
        for i in missing:  # the stream ended or failed before these frames
            got[i] = last_img
        why = st.error or "the stream ends early"
        warn_once(path, "partial", f"{path}: frames from {min(missing)} on could not be decoded "
                                   f"({why}); {n} packets, last decoded frame {last_i}; "
                                   "those frames are replaced by the last decoded frame")
    size = got[targets[0]].shape
    out = np.empty((len(want),) + size, dtype=np.uint8)
    for j, i in enumerate(want):
        img = got[i]
        if img.shape != size:  # rotation differing across frames: extremely rare
            img = _resize_like(img, size)
        out[j] = img
    return out


def _resize_like(img: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    t = F.interpolate(t, size=shape[:2], mode="bilinear", align_corners=False)
    return t[0].permute(1, 2, 0).round().clamp(0, 255).byte().numpy()


def _decode_sequential(container, stream, targets: list[int], got: dict, st: DecodeStats,
                       short_side: int | None = None):
    """Decode from the start, counting output frames (decoder output order = presentation order).

    Returns (index, image) of the last frame decoded when targets remain missing, else None.
    """
    need = set(targets)
    i = -1
    size = None
    last_frame = None
    try:
        for packet in container.demux(stream):
            for frame in packet.decode():
                i += 1
                st.decoded += 1
                last_frame = frame
                if i in need:
                    size = size or _out_size(frame, short_side)
                    got[i] = _to_rgb(frame, size)
                    need.discard(i)
                    if not need:
                        return None
    except Exception as e:  # a decode/demux error part-way: keep what we have
        st.error = f"{type(e).__name__}: {e}"
    return _last(got, i, last_frame, size or (_out_size(last_frame, short_side) if last_frame else None))


def _last(got: dict, i: int, frame, size):
    """(index, image) of the last decoded frame (converted if it was not a target) or None."""
    if frame is None or i < 0:
        return None
    return (i, got[i] if i in got else _to_rgb(frame, size))


def _decode_seeking(container, stream, idx: VideoIndex, targets: list[int], got: dict,
                    st: DecodeStats, skip_nonref: bool = True, short_side: int | None = None):
    """Seek / decode-forward loop for files whose pts name frames, one packet at a time.

    Always works on the smallest frame still missing: when the keyframe it needs lies past the
    last packet sent to the decoder, seek there; otherwise keep decoding forward.

    Returns (ok, last): ok is False when the pts cannot be trusted after all (decoder output pts
    went backwards, or a seek landed past the keyframe asked for): the caller then decodes
    sequentially. last = (index, image) of the last decoded frame when frames are missing.
    """
    cc = stream.codec_context
    # per-packet skipping is exact only when packets are decoded one by one (no frame threads)
    skip_nonref = skip_nonref and not (cc.thread_count != 1 and "FRAME" in str(cc.thread_type))
    skip_mode = "DEFAULT"
    remaining = sorted(targets)
    need_pts = {int(idx.frame_pts[i]): i for i in remaining}
    gen = None
    pos = -1
    prev_pts = None
    check_landing = False
    kpos = goal = 0
    size = None
    last_frame = None
    last_i = -1
    while remaining:
        kpos_next, kpts = idx.keyframe_for(remaining[0])
        if gen is None or kpos_next > max(pos, goal):
            kpos = kpos_next
            if gen is not None or kpos > 0:
                # backward=True: land on the keyframe at or before kpts (checked below)
                container.seek(kpts, stream=stream, backward=True, any_frame=False)
                st.seeks += 1
            gen = container.demux(stream)
            # a seek may land on an earlier keyframe (mov does with large B-frame delays): then
            # decode forward to the goal instead of seeking again
            pos, goal, prev_pts, check_landing = -1, kpos, None, True
        try:
            packet = next(gen)
        except StopIteration:
            break
        except Exception as e:
            st.error = f"{type(e).__name__}: {e}"
            break
        if packet.size:
            p = idx.pos_of(int(packet.pts)) if packet.pts is not None else None
            if check_landing:
                check_landing = False
                if p is None or p > kpos:
                    return False, None
            pos = p if p is not None else pos + 1
            if skip_nonref:
                # a packet whose frame is not asked for: if no other frame references it, the
                # decoder may skip it (non-reference B-frames are a third to a half of H.264)
                mode = "DEFAULT" if (packet.pts is not None and int(packet.pts) in need_pts) else "NONREF"
                if mode != skip_mode:
                    cc.skip_frame = skip_mode = mode
        try:
            frames = packet.decode()
        except Exception as e:
            st.error = f"{type(e).__name__}: {e}"
            break
        for frame in frames:
            st.decoded += 1
            if frame.pts is None:
                return False, None
            fp = int(frame.pts)
            if prev_pts is not None and fp <= prev_pts:
                return False, None
            prev_pts = fp
            last_frame = frame
            fi = idx.frame_of(fp)
            last_i = last_i if fi is None else fi
            ti = need_pts.pop(fp, None)
            if ti is not None:
                size = size or _out_size(frame, short_side)
                got[ti] = _to_rgb(frame, size)
                remaining.remove(ti)
    if not remaining:
        return True, None
    return True, _last(got, last_i, last_frame,
                       size or (_out_size(last_frame, short_side) if last_frame else None))


def count_frames(path: str | os.PathLike) -> int:
    """Frames in a video file (cached demux-only packet count) or a JPEG frame folder.

    Raises VideoOpenError / NoVideoStreamError / VideoDecodeError as :func:`build_index`.
    """
    path = str(path)
    if is_frame_folder(path):
        return frame_folder_count(path)
    return get_index(path).num_frames


def decode_all_frames(path: str | os.PathLike, *, thread_count: int = 1) -> np.ndarray:
    """Reference decoder: every frame in decoder output (= presentation) order, uint8 (N, H, W, 3)
    with rotation applied. Stops at the first decode error. Used by tests and the benchmark's
    decode-everything baseline."""
    path = str(path)
    container = _open(path)
    try:
        stream = _video_stream(container, path)
        _configure(stream, thread_count)
        frames = []
        size = None
        try:
            for frame in container.decode(stream):
                frames.append(_to_rgb(frame, size))
                size = size or (frame.width, frame.height)
        except Exception:
            pass
    finally:
        container.close()
    if not frames:
        raise VideoDecodeError(path, "no decodable frame")
    return np.stack(frames)


def iter_frames(path: str | os.PathLike, *, stride: int = 1, start: int = 0,
                stop: int | None = None, thread_count: int = 1):
    """Yield (index, uint8 (H, W, 3) RGB with rotation applied) for frames start, start + stride,
    ... (< stop) in presentation order, in one sequential pass (for streaming inference over a
    whole video: repeated :func:`decode_frames` calls on chunks would re-decode each GOP).

    The container is closed when the generator finishes or is closed. Stops quietly at a decode
    error after the first frame (a warning names the file); raises VideoOpenError /
    NoVideoStreamError, or VideoDecodeError when no frame decodes.
    """
    path = str(path)
    if stride < 1:
        raise ValueError("stride must be >= 1")
    container = _open(path)
    try:
        stream = _video_stream(container, path)
        _configure(stream, thread_count)
        i = -1
        try:
            for frame in container.decode(stream):
                i += 1
                if stop is not None and i >= stop:
                    return
                if i >= start and (i - start) % stride == 0:
                    yield i, _rotate(frame.to_ndarray(format="rgb24"), frame.rotation)
        except Exception as e:
            if i < 0:
                raise VideoDecodeError(path, f"no decodable frame ({type(e).__name__}: {e})") from None
            warn_once(path, "partial", f"{path}: decode error after frame {i} "
                                       f"({type(e).__name__}: {e}); stopping there")
        if i < 0:
            raise VideoDecodeError(path, "no decodable frame")
    finally:
        container.close()
