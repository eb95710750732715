"""Whole videos in order: the one sequential decode loop (:func:`iter_decoded`) and the readers
built on it, :func:`iter_frames` (every ``stride``-th frame in one pass, for streaming inference)
and :func:`decode_all_frames` (the reference decoder of tests and benchmarks).

Every sequential pass (in :func:`tsm_ds.data.video.decode.decode_frames` for files whose
timestamps cannot name frames, :func:`decode_all_frames`, :func:`iter_frames`, streaming
inference, the decoding benchmark) runs through :func:`iter_decoded`. Decoding uses one thread per
call by default (``thread_count=1``, slice threading), which is what a DataLoader worker wants,
and avoids PyAV's frame-threading hang when a decode loop is left early. Containers are always
closed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .convert import to_rgb
from .errors import VideoDecodeError, warn_once
from .frames import frame_folder_count, is_frame_folder, read_frame_folder
from .index import open_video, video_stream
from .packed import PackedVideo, is_packed

__all__ = ["DecodeStats", "iter_decoded", "decode_all_frames", "iter_frames"]


@dataclass
class DecodeStats:
    """What one decode call did (filled by :func:`~tsm_ds.data.video.decode.decode_frames` and
    :func:`iter_decoded`).

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
    (:func:`~tsm_ds.data.video.convert.to_rgb`); the loop adds no per-frame work beyond counting.

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


def _partial_message(path: str, first_missing: int, why: str, n: int, last_i: int) -> str:
    return (f"{path}: frames from {first_missing} on could not be decoded ({why}); {n} packets, "
            f"last decoded frame {last_i}; those frames are replaced by the last decoded frame")


# --------------------------------------------------------------------------------------------
# whole videos, in order


def decode_all_frames(path: str | os.PathLike, *, thread_count: int = 1) -> np.ndarray:
    """Reference decoder: every frame in decoder output (= presentation) order.

    Returns:
        np.uint8 (N, H, W, 3) RGB with rotation applied; frames whose size differs from the
        first frame's are scaled to it. Stops quietly at the first decode error. A packed video
        (``.jpack``): all its frames (a damaged pack raises VideoDecodeError).

    Raises:
        VideoOpenError, NoVideoStreamError, VideoDecodeError (no decodable frame).

    Used by tests and the benchmark's decode-everything baseline.
    """
    path = str(path)
    if is_packed(path):
        with PackedVideo(path) as pv:
            return pv.decode(range(pv.num_frames))
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
    whole video: repeated :func:`~tsm_ds.data.video.decode.decode_frames` calls on chunks would
    re-decode each GOP).

    Args:
        path: a video file, a JPEG frame folder (its files are read one by one) or a packed
            video (``.jpack``, frames read one by one).
        stride, start, stop: which frames (``stop`` None: to the end of the stream).
        thread_count: decoder threads.
        num_frames: the frame count the caller works with (``count_frames``: the packet count,
            or a frame folder's count). None: the stream's end is the end; a decode error after
            the first frame stops quietly with a warning naming the file. When given, frames at
            and past ``num_frames`` are not yielded, and frames the stream does not deliver (it
            ends or fails early) are the last decoded frame, after one warning per file, as
            :func:`~tsm_ds.data.video.decode.decode_frames` fills them.

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
    if is_packed(path):
        with PackedVideo(path) as pv:
            n = pv.num_frames if num_frames is None else num_frames
            for j in range(start, n if stop is None else min(stop, n), stride):
                yield j, pv.decode([j])[0]
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
