"""One decoded PyAV frame as an RGB array: rotation metadata applied as ffmpeg's autorotate does
(:func:`rotate`, :func:`to_rgb`), optionally scaled down in the same swscale pass.

Every decoder of :mod:`tsm_ds.data.video` (:mod:`.decode`, :mod:`.sequential`) and
``tsm-ds prepare`` convert frames here.

Conversion cost (issue 27): ``frame.to_ndarray(format="rgb24")`` makes a new swscale context for
every frame object the decoder returns, with swscale's automatic thread count, i.e. a new thread
pool per frame: 0.43-0.86 ms CPU and ~3 ms wall per 340x256 frame on the 2-core test machine
(measured one frame object after another, as a decode loop gives them). :func:`to_rgb` reuses one
``VideoReformatter`` per thread (one swscale context, re-initialised by swscale only when the
frame geometry or format changes) with one swscale thread: 0.067 ms per frame, the same bytes.
"""
from __future__ import annotations

import threading

import numpy as np

__all__ = ["rotate", "to_rgb"]


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


_local = threading.local()


def _reformatter():
    """This thread's ``av.video.reformatter.VideoReformatter`` (a swscale context is not safe to
    share between threads)."""
    r = getattr(_local, "reformatter", None)
    if r is None:
        from av.video.reformatter import VideoReformatter

        r = _local.reformatter = VideoReformatter()
    return r


def to_rgb(frame, size: tuple[int, int] | None = None) -> np.ndarray:
    """One decoded PyAV video frame as np.uint8 (H, W, 3) RGB, rotation metadata applied.

    Converted by this thread's reused swscale context, one swscale thread (see the module
    docstring); the pixels are those of ``frame.to_ndarray(format="rgb24")``.

    Args:
        frame: an ``av.VideoFrame``.
        size: (width, height) before rotation to convert to, scaled in the same swscale pass as
            the RGB conversion (bilinear, area-filtered when shrinking); None or the frame's own
            size keeps it.

    Raises:
        av.FFmpegError (or ValueError) when swscale cannot convert the frame's format.
    """
    r = _reformatter()
    if size is None or (frame.width, frame.height) == size:
        rgb = r.reformat(frame, format="rgb24", threads=1)
    else:  # scaled in the same swscale pass as the RGB conversion (bilinear, area-filtered
        # when shrinking); also used when the resolution changes mid-stream
        rgb = r.reformat(frame, width=size[0], height=size[1], format="rgb24",
                         interpolation="BILINEAR", threads=1)
    return rotate(rgb.to_ndarray(), getattr(frame, "rotation", 0))


def _resize_like(img: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    t = F.interpolate(t, size=shape[:2], mode="bilinear", align_corners=False)
    return t[0].permute(1, 2, 0).round().clamp(0, 255).byte().numpy()
