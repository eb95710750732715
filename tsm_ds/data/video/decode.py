"""Decode exactly the frames a clip needs (:func:`decode_frames`), or stream frames in order.

How a clip is decoded (:func:`decode_frames`):

1. The :class:`~tsm_ds.data.video.index.VideoIndex` gives the pts of every frame in presentation
   order, so ``frame_pts[i]`` names frame ``i``.
2. For the next frame still needed, we look up the last keyframe whose pts is <= the frame's pts.
   When that keyframe lies *past* the packet we decoded last, we seek to it (the decoder is
   flushed); otherwise we keep decoding forward, which is cheaper than a seek. Decoded frames
   are matched to requested frames by pts and only those are converted to RGB.
3. Files whose timestamps cannot name frames (AVI with B-frames, MP4 without a composition-time
   table: the decoder reorders frames but the packets carry decode-order stamps) are decoded
   sequentially from the start, counting frames as the decoder outputs them (presentation order).
   The same happens, with a one-time warning, when the decoder's output pts ever go backwards.

Every sequential pass (in :func:`decode_frames`, :func:`decode_all_frames`, :func:`iter_frames`,
streaming inference, the decoding benchmark) runs through one loop, :func:`iter_decoded`.

Frames the stream does not deliver (a decode error part-way, or the packet count exceeding the
decodable frames, e.g. DivX "packed B-frame" placeholder packets) are replaced by the last frame
that decoded, after one warning per file; see :func:`decode_frames`. A file with no decodable frame
raises :class:`~tsm_ds.data.video.errors.VideoDecodeError`.

Rotation metadata (display matrix, ``frame.rotation`` in PyAV 18) is applied as ffmpeg's
autorotate does, so frames look as a player shows them (:func:`to_rgb`). Containers are always
closed. Decoding uses one thread per call by default (``thread_count=1``), which is what a
DataLoader worker wants, and avoids PyAV's frame-threading hang when a decode loop is left early.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from .errors import VideoDecodeError, warn_once
from .frames import FRAME_TEMPLATE, frame_folder_count, is_frame_folder, read_frame_folder
from .index import VideoIndex, get_index, open_video, video_stream

__all__ = ["DecodeStats", "decode_frames", "decode_all_frames", "iter_frames", "iter_decoded",
           "to_rgb", "rotate"]


@dataclass
class DecodeStats:
    """What one decode call did (filled by :func:`decode_frames` and :func:`iter_decoded`).

    Attributes:
        decoded: frames the decoder produced.
        seeks: seeks made.
        missing: requested frames the stream did not deliver (replaced by the last decoded frame).
        sequential: decoded from the start without seeking.
        error: ``"ExceptionType: message"`` of the decode/demux error that ended decoding, or None.
    """

    decoded: int = 0
    seeks: int = 0
    missing: int = 0
    sequential: bool = False
    error: str | None = None


def rotate(img: np.ndarray, rotation: float | int | None) -> np.ndarray:
    """Apply display-matrix rotation to an (H, W, C) image as ffmpeg's autorotate does.

    ``rotation`` is PyAV's ``frame.rotation``: degrees counter-clockwise (av_display_rotation_get).
    ffmpeg rotates the picture by -rotation (e.g. -90 -> transpose=clock, a clockwise turn).
    np.rot90(k) turns counter-clockwise k times, so k = round(rotation / 90) mod 4.

    Returns:
        ``img`` itself for no rotation, else a contiguous rotated copy (H and W swapped for
        90 / 270 degrees).
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


def to_rgb(frame, size: tuple[int, int] | None = None) -> np.ndarray:
    """One decoded PyAV video frame as np.uint8 (H, W, 3) RGB, rotation metadata applied.

    Args:
        frame: an ``av.VideoFrame``.
        size: (width, height) before rotation to convert to, scaled in the same swscale pass as
            the RGB conversion (bilinear, area-filtered when shrinking); None or the frame's own
            size keeps it.
    """
    if size is None or (frame.width, frame.height) == size:
        arr = frame.to_ndarray(format="rgb24")
    else:  # scaled in the same swscale pass as the RGB conversion (bilinear, area-filtered
        # when shrinking); also used when the resolution changes mid-stream
        arr = frame.to_ndarray(format="rgb24", width=size[0], height=size[1],
                               interpolation="BILINEAR")
    return rotate(arr, getattr(frame, "rotation", 0))


def _configure(stream, thread_count: int) -> None:
    cc = stream.codec_context
    cc.thread_count = max(0, int(thread_count))
    # frame threading can hang when a decode loop is left early in a DataLoader worker;
    # slice threading is safe. With one thread the type does not matter.
    cc.thread_type = "SLICE"


# --------------------------------------------------------------------------------------------
# the one sequential decode loop


def iter_decoded(path: str | os.PathLike, *, stream_index: int | None = None, thread_count: int = 1,
                 stats: DecodeStats | None = None) -> Iterator:
    """Yield every decoded frame (``av.VideoFrame``, not converted) of a video file's video stream
    in decoder output order, which is presentation order: the one sequential decode loop.

    Frame ``k`` yielded is frame index ``k``. The caller converts the frames it keeps
    (:func:`to_rgb`); the loop adds no per-frame work beyond counting.

    Args:
        path: a video file.
        stream_index: the container stream to decode (e.g. ``VideoIndex.stream_index``); None
            picks the first video stream that is not cover art.
        thread_count: decoder threads (slice threading; 1 = one thread, right for DataLoader
            workers; 0 = FFmpeg's choice).
        stats: a :class:`DecodeStats` whose ``decoded`` counts the frames yielded and whose
            ``error`` receives the error that ended decoding.

    Raises (on the first ``next``):
        VideoOpenError, NoVideoStreamError. A demux or decode error part-way is *not* raised:
        the generator stops there (``stats.error`` says why), so a caller can keep the frames
        before it. The container is closed when the generator finishes or is closed.
    """
    path = str(path)
    container = open_video(path)
    try:
        stream = video_stream(container, path) if stream_index is None else container.streams[stream_index]
        _configure(stream, thread_count)
        try:
            # = container.decode(stream), which PyAV implements as this same double loop
            for packet in container.demux(stream):
                for frame in packet.decode():
                    if stats is not None:
                        stats.decoded += 1
                    yield frame
        except Exception as e:  # a decode/demux error part-way: stop, keep what was yielded
            if stats is not None:
                stats.error = f"{type(e).__name__}: {e}"
    finally:
        container.close()


# --------------------------------------------------------------------------------------------
# exact frames of a clip


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
        frame_template: file names in a frame folder (:data:`FRAME_TEMPLATE`).
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
        ValueError: no indices. VideoOpenError, NoVideoStreamError, VideoDecodeError (no
        decodable frame at all).

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
        return read_frame_folder(path, want, frame_template)

    idx = get_index(path)
    n = idx.num_frames
    want = [min(max(i, 0), n - 1) for i in want]
    targets = sorted(set(want))
    got: dict[int, np.ndarray] = {}
    last = None
    if idx.seekable:
        container = open_video(path)
        try:
            stream = container.streams[idx.stream_index]
            _configure(stream, thread_count)
            ok, last = _decode_seeking(container, stream, idx, targets, got, st, skip_nonref,
                                       short_side)
        finally:
            container.close()
        if not ok:
            warn_once(path, "pts", f"{path}: decoder output timestamps are not in "
                                   "presentation order; decoding this file sequentially")
            idx.seekable = False
            got.clear()
    if not idx.seekable:
        st.sequential = True
        last = _decode_sequential(path, idx.stream_index, thread_count, targets, got, st,
                                  short_side)

    if not got and last is None:
        raise VideoDecodeError(path, f"no decodable frame ({st.error or 'the decoder returned none'})")
    missing = [i for i in targets if i not in got]
    if missing:
        st.missing = len(missing)
        last_i, last_img = last if last is not None else max(got.items())
        for i in missing:  # the stream ended or failed before these frames
            got[i] = last_img
        why = st.error or "the stream ends early"
        warn_once(path, "partial", _partial_message(path, min(missing), why, n, last_i))
    size = got[targets[0]].shape
    out = np.empty((len(want),) + size, dtype=np.uint8)
    for j, i in enumerate(want):
        img = got[i]
        if img.shape != size:  # rotation differing across frames: extremely rare
            img = _resize_like(img, size)
        out[j] = img
    return out


def _partial_message(path: str, first_missing: int, why: str, n: int, last_i: int) -> str:
    return (f"{path}: frames from {first_missing} on could not be decoded ({why}); {n} packets, "
            f"last decoded frame {last_i}; those frames are replaced by the last decoded frame")


def _resize_like(img: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    t = F.interpolate(t, size=shape[:2], mode="bilinear", align_corners=False)
    return t[0].permute(1, 2, 0).round().clamp(0, 255).byte().numpy()


def _decode_sequential(path: str, stream_index: int, thread_count: int, targets: list[int],
                       got: dict, st: DecodeStats, short_side: int | None = None):
    """Decode from the start (:func:`iter_decoded`), converting the frames in ``targets``.

    Returns (index, image) of the last frame decoded when targets remain missing, else None.
    Raises VideoOpenError when the file cannot be opened.
    """
    need = set(targets)
    i = -1
    size = None
    last_frame = None
    frames = iter_decoded(path, stream_index=stream_index, thread_count=thread_count, stats=st)
    try:
        for i, frame in enumerate(frames):
            last_frame = frame
            if i in need:
                try:
                    size = size or _out_size(frame, short_side)
                    got[i] = to_rgb(frame, size)
                except Exception as e:  # a conversion error ends decoding like a decode error
                    st.error = f"{type(e).__name__}: {e}"
                    break
                need.discard(i)
                if not need:
                    return None
    finally:
        frames.close()
    return _last(got, i, last_frame, size or (_out_size(last_frame, short_side) if last_frame else None))


def _last(got: dict, i: int, frame, size):
    """(index, image) of the last decoded frame (converted if it was not a target) or None."""
    if frame is None or i < 0:
        return None
    return (i, got[i] if i in got else to_rgb(frame, size))


#: decoders whose ``skip_frame = "NONREF"`` drops only unreferenced frames (checked against full
#: decodes of ../shared/data; libdav1d returned wrong AV1 frames): the others decode every packet
NONREF_EXACT_DECODERS = frozenset({"h264", "hevc", "mpeg4", "mpeg2video", "mpeg1video"})


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
    # per-packet skipping is exact only when packets are decoded one by one (no frame threads), and
    # only with decoders whose NONREF skipping drops exactly the unreferenced frames
    skip_nonref = (skip_nonref and cc.name in NONREF_EXACT_DECODERS
                   and not (cc.thread_count != 1 and "FRAME" in str(cc.thread_type)))
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
                got[ti] = to_rgb(frame, size)
                remaining.remove(ti)
    if not remaining:
        return True, None
    return True, _last(got, last_i, last_frame,
                       size or (_out_size(last_frame, short_side) if last_frame else None))


# --------------------------------------------------------------------------------------------
# whole videos, in order


def decode_all_frames(path: str | os.PathLike, *, thread_count: int = 1) -> np.ndarray:
    """Reference decoder: every frame in decoder output (= presentation) order.

    Returns:
        np.uint8 (N, H, W, 3) RGB with rotation applied; frames whose size differs from the
        first frame's are scaled to it. Stops quietly at the first decode error.

    Raises:
        VideoOpenError, NoVideoStreamError, VideoDecodeError (no decodable frame).

    Used by tests and the benchmark's decode-everything baseline.
    """
    path = str(path)
    frames = []
    size = None
    it = iter_decoded(path, thread_count=thread_count)
    try:
        for frame in it:
            try:
                frames.append(to_rgb(frame, size))
            except Exception:  # a conversion error ends decoding like a decode error
                break
            size = size or (frame.width, frame.height)
    finally:
        it.close()
    if not frames:
        raise VideoDecodeError(path, "no decodable frame")
    return np.stack(frames)


def iter_frames(path: str | os.PathLike, *, stride: int = 1, start: int = 0,
                stop: int | None = None, thread_count: int = 1,
                num_frames: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (index, uint8 (H, W, 3) RGB with rotation applied) for frames start, start + stride,
    ... (< stop) in presentation order, in one sequential pass (for streaming inference over a
    whole video: repeated :func:`decode_frames` calls on chunks would re-decode each GOP).

    Args:
        path: a video file, or a JPEG frame folder (its files are read one by one).
        stride, start, stop: which frames (``stop`` None: to the end of the stream).
        thread_count: decoder threads.
        num_frames: the frame count the caller works with (``count_frames``: the packet count,
            or a frame folder's count). None: the stream's end is the end; a decode error after
            the first frame stops quietly with a warning naming the file. When given, frames at
            and past ``num_frames`` are not yielded, and frames the stream does not deliver (it
            ends or fails early) are the last decoded frame, after one warning per file, as
            :func:`decode_frames` fills them.

    The container is closed when the generator finishes or is closed.

    Raises:
        ValueError (stride < 1), VideoOpenError, NoVideoStreamError, or VideoDecodeError when no
        frame decodes.
    """
    path = str(path)
    if stride < 1:
        raise ValueError("stride must be >= 1")
    if num_frames is not None:
        stop = num_frames if stop is None else min(stop, num_frames)
    if is_frame_folder(path):
        n = frame_folder_count(path) if num_frames is None else num_frames
        for j in range(start, n if stop is None else min(stop, n), stride):
            yield j, read_frame_folder(path, [j])[0]
        return
    st = DecodeStats()
    i = img_i = -1
    frame = img = None
    frames = iter_decoded(path, thread_count=thread_count, stats=st)
    try:
        for i, frame in enumerate(frames):
            if stop is not None and i >= stop:
                return
            if i >= start and (i - start) % stride == 0:
                try:
                    img, img_i = to_rgb(frame), i
                except Exception as e:  # a conversion error ends decoding like a decode error
                    st.error = f"{type(e).__name__}: {e}"
                    break
                yield i, img
    finally:
        frames.close()
    if num_frames is None:
        if i < 0:
            raise VideoDecodeError(path, f"no decodable frame ({st.error})" if st.error
                                   else "no decodable frame")
        if st.error is not None:
            warn_once(path, "partial", f"{path}: decode error after frame {i} ({st.error}); "
                                       "stopping there")
        return
    if i < 0:
        raise VideoDecodeError(path, f"no decodable frame ({st.error or 'the decoder returned none'})")
    # fill the frames the stream did not deliver, as decode_frames does
    nxt = start if i < start else start + ((i - start) // stride + 1) * stride
    if nxt >= stop:
        return
    warn_once(path, "partial", _partial_message(path, nxt, st.error or "the stream ends early",
                                                num_frames, i))
    last_img = img if img_i == i else to_rgb(frame)
    for j in range(nxt, stop, stride):
        yield j, last_img
