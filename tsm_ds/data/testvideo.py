"""Videos with a known number in every frame, written with PyAV (for tests and the benchmark).

Frame ``i`` carries ``i`` as 16 bits in a 2 x 8 grid of flat 16 x 16 cells at the top-left
(white = 1, black = 0). The cells are macroblock-aligned and flat, so the number survives lossy
compression; :func:`read_number` reads it back from a decoded RGB frame. The rest of the frame is
either flat grey or (``texture=True``) a moving pseudo-random texture, to make decoding cost
realistic in benchmarks.
"""
from __future__ import annotations

import os
from fractions import Fraction
from typing import Sequence

import numpy as np

__all__ = ["CELL", "number_frame", "read_number", "write_numbered_video"]

CELL = 16
_BITS = 16


def number_frame(i: int, width: int = 128, height: int = 64, *, texture: bool = False,
                 seed: int = 0) -> np.ndarray:
    """uint8 (height, width, 3) RGB frame showing number ``i`` (0 <= i < 65536).

    Raises ValueError when the frame is smaller than the 128 x 32 number grid.
    """
    if width < 8 * CELL or height < 2 * CELL:
        raise ValueError(f"frame {width}x{height} too small for the number grid (128x32)")
    if texture:
        rng = np.random.default_rng(seed)
        base = rng.integers(0, 256, (height // 8 + 1, width // 8 + 2), dtype=np.uint8)
        base = np.repeat(np.repeat(base, 8, axis=0), 8, axis=1)
        shift = (i * 3) % 8 + 8 * ((i // 8) % 2)
        img = np.empty((height, width, 3), dtype=np.uint8)
        tile = base[:height, shift:shift + width]
        img[..., 0] = tile
        img[..., 1] = tile[::-1] if tile.shape[0] == height else tile
        img[..., 2] = 255 - tile
    else:
        img = np.full((height, width, 3), 128, dtype=np.uint8)
    for b in range(_BITS):
        r, c = divmod(b, 8)
        img[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL] = 255 if (i >> b) & 1 else 0
    return img


def read_number(img: np.ndarray) -> int:
    """The number :func:`number_frame` drew into ``img`` (uint8 (H, W, 3), unrotated)."""
    n = 0
    for b in range(_BITS):
        r, c = divmod(b, 8)
        cell = img[r * CELL + 4:(r + 1) * CELL - 4, c * CELL + 4:(c + 1) * CELL - 4]
        if cell.mean() > 128:
            n |= 1 << b
    return n


def write_numbered_video(path: str | os.PathLike, num_frames: int, *, width: int = 128,
                         height: int = 64, fps: int = 25, codec: str = "libx264", gop: int = 12,
                         bframes: int = 2, pts: Sequence[int] | None = None,
                         time_base: Fraction = Fraction(1, 1000), rotation: int | None = None,
                         texture: bool = False, crf: int = 23, preset: str = "veryfast",
                         pix_fmt: str = "yuv420p") -> str:
    """Write ``num_frames`` numbered frames (:func:`number_frame`) to ``path``.

    Args:
        codec: "libx264" (mp4/mkv/mov), "mpeg4" (avi/mp4), "mjpeg", "libvpx-vp9", ...
        gop: keyframe interval in frames (fixed: scene-cut detection is off for x264).
        bframes: B-frames between references (reordering, so pts != decode order).
        pts: presentation times in units of ``time_base`` (variable frame rate); default i * (1 /
            fps) in time_base units.
        rotation: display rotation in degrees (stored as a display matrix, as phones do).
        texture: a moving random texture around the number (realistic decode cost).

    Returns the path. The container follows the extension.
    """
    import av

    path = str(path)
    if pts is None:
        step = Fraction(1, fps) / time_base
        pts = [int(i * step) for i in range(num_frames)]
    if len(pts) != num_frames:
        raise ValueError("len(pts) must equal num_frames")
    with av.open(path, "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.time_base = time_base
        cc = stream.codec_context
        cc.time_base = time_base
        cc.gop_size = gop
        cc.thread_count = 1
        if codec == "libx264":
            stream.options = {"crf": str(crf), "preset": preset,
                              "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:"
                                             f"bframes={bframes}"}
        elif bframes and codec in ("mpeg4", "mpeg2video", "mpeg1video"):
            cc.max_b_frames = bframes
            stream.options = {"qscale": "3"}
        if rotation:
            stream.set_display_rotation(rotation)
        for i in range(num_frames):
            frame = av.VideoFrame.from_ndarray(number_frame(i, width, height, texture=texture),
                                               format="rgb24")
            frame.pts = int(pts[i])
            frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
