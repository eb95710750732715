"""Decode exactly the frames a clip needs (:func:`decode_frames`).

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

Every sequential pass runs through one loop, :func:`tsm_ds.data.video.sequential.iter_decoded`
(that module also holds the whole-video readers :func:`~tsm_ds.data.video.sequential.iter_frames`
and :func:`~tsm_ds.data.video.sequential.decode_all_frames`).

Frames the stream does not deliver (a decode error part-way, or the packet count exceeding the
decodable frames, e.g. DivX "packed B-frame" placeholder packets) are replaced by the last frame
that decoded, after one warning per file; see :func:`decode_frames`. A file with no decodable frame
raises :class:`~tsm_ds.data.video.errors.VideoDecodeError`.

Rotation metadata (display matrix, ``frame.rotation`` in PyAV 18) is applied as ffmpeg's
autorotate does, so frames look as a player shows them (:func:`tsm_ds.data.video.convert.to_rgb`).
Containers are always closed. Decoding uses one thread per call by default (``thread_count=1``),
which is what a DataLoader worker wants, and avoids PyAV's frame-threading hang when a decode loop
is left early.
"""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from .convert import _out_size, _resize_like, to_rgb
from .errors import VideoDecodeError, warn_once
from .frames import FRAME_TEMPLATE, frame_folder_count, is_frame_folder, read_frame_folder
from .index import VideoIndex, get_index, open_video
from .packed import is_packed, read_packed_frames
from .sequential import DecodeStats, _configure, _partial_message, iter_decoded

__all__ = ["decode_frames", "NONREF_EXACT_DECODERS"]


def decode_frames(path: str | os.PathLike, indices: Iterable[int], *, num_frames: int | None = None,
                  thread_count: int = 1, stats: DecodeStats | None = None,
                  frame_template: str = FRAME_TEMPLATE, skip_nonref: bool = True,
                  short_side: int | None = None) -> np.ndarray:
    """Decode frames ``indices`` (presentation order, 0-based) of a video file or frame folder.

    Args:
        path: a video file, a JPEG frame folder (``img_00001.jpg`` ... 1-indexed files) or a
            packed video (``.jpack``, :mod:`~tsm_ds.data.video.packed`).
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
            video files), or, for packs and JPEG frame folders stored at least twice that size,
            decoded at a reduced JPEG DCT scale (:func:`~tsm_ds.data.video.packed.dct_scale_for`). None keeps
            the decoded size.

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
        return read_frame_folder(path, want, frame_template, short_side=short_side)
    if is_packed(path):   # one open, one read per run of adjacent frames (data/video/packed.py)
        return read_packed_frames(path, want, short_side=short_side)

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
    last_fp = None
    key_for = None   # (frame, (decode position, pts) of its keyframe): looked up once per frame
    pkt_pts = idx.pkt_pts
    while remaining:
        if key_for is None or key_for[0] != remaining[0]:
            key_for = (remaining[0], idx.keyframe_for(remaining[0]))
        kpos_next, kpts = key_for[1]
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
            pts = None if packet.pts is None else int(packet.pts)
            if check_landing:
                check_landing = False
                p = None if pts is None else idx.pos_of(pts)
                if p is None or p > kpos:
                    return False, None
                pos = p
            elif pts is not None and pos + 1 < len(pkt_pts) and pkt_pts[pos + 1] == pts:
                pos += 1   # the next packet in decode order, as expected (no binary search)
            else:
                p = None if pts is None else idx.pos_of(pts)
                pos = p if p is not None else pos + 1
            if skip_nonref:
                # a packet whose frame is not asked for: if no other frame references it, the
                # decoder may skip it (non-reference B-frames are a third to a half of H.264)
                mode = "DEFAULT" if (pts is not None and pts in need_pts) else "NONREF"
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
            last_frame, last_fp = frame, fp
            ti = need_pts.pop(fp, None)
            if ti is not None:
                size = size or _out_size(frame, short_side)
                got[ti] = to_rgb(frame, size)
                remaining.remove(ti)
    if not remaining:
        return True, None
    # the presentation index of the last decoded frame (its pts not in the index, which the
    # demux pass makes impossible: the last frame kept)
    last_i = idx.frame_of(last_fp) if last_fp is not None else None
    if last_i is None:
        last_i = max(got) if got else -1
    return True, _last(got, last_i, last_frame,
                       size or (_out_size(last_frame, short_side) if last_frame else None))
