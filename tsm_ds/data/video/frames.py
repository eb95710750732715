"""JPEG frame folders: the official TSM layout of one folder per video, ``img_00001.jpg`` ...

Frame ``i`` (0-based, as everywhere in :mod:`tsm_ds.data.video`) is the file
``FRAME_TEMPLATE.format(i + 1)`` (1-indexed names, as the official ``TSNDataSet`` reads them).
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from .errors import VideoDecodeError

__all__ = ["FRAME_TEMPLATE", "is_frame_folder", "frame_folder_count", "read_frame_folder",
           "read_frame_folder_list"]

#: file name of frame i + 1 in a frame folder (official TSM layout: img_00001.jpg, 1-indexed)
FRAME_TEMPLATE = "img_{:05d}.jpg"


def is_frame_folder(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory (a JPEG frame folder), False for a file."""
    return os.path.isdir(path)


def frame_folder_count(path: str | os.PathLike, template: str = FRAME_TEMPLATE) -> int:
    """Number of frames in a JPEG frame folder: the count of consecutive files img_00001.jpg...

    Raises:
        VideoDecodeError: the folder holds no first frame.
        OSError: ``path`` is not a readable folder.
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


def read_frame_folder_list(path: str | os.PathLike, indices: Sequence[int], template: str = FRAME_TEMPLATE,
                           short_side: int | None = None) -> list[np.ndarray]:
    """Frames ``indices`` (0-based, any order, repeats allowed; not clipped) of a frame folder, one
    array each: np.uint8 (H, W, 3) RGB, in the order of ``indices`` (a repeated index is the same
    array). Each distinct frame is read and decoded once: JPEG files with simplejpeg (the pixels
    of torchvision's ``decode_jpeg``, as packs are decoded), other images with torchvision's
    ``decode_image``. With ``short_side``, JPEG frames at least twice that size are decoded at a
    reduced DCT scale (:func:`~tsm_ds.data.video.packed.dct_scale_for`), as packs are.

    Raises:
        VideoDecodeError: a frame file is missing or not a readable image (names the file).
    """
    from .packed import _decode_one, dct_scale_for

    path = str(path)
    cache: dict[int, np.ndarray] = {}
    scale = None   # the DCT scale, from the first frame's size
    for i in indices:
        if i in cache:
            continue
        f = os.path.join(path, template.format(i + 1))
        try:
            with open(f, "rb") as fh:
                data = fh.read()
            if data[:2] == b"\xff\xd8":   # JPEG
                if scale is None:
                    import simplejpeg

                    h, w = simplejpeg.decode_jpeg_header(data)[:2]
                    scale = dct_scale_for(w, h, short_side)
                cache[i] = _decode_one(data, scale, short_side)
            else:
                import torch
                from torchvision.io import ImageReadMode, decode_image

                img = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
                cache[i] = img.permute(1, 2, 0).contiguous().numpy()
        except Exception as e:
            raise VideoDecodeError(f, f"cannot read frame: {type(e).__name__}: {e}") from None
    return [cache[i] for i in indices]


def read_frame_folder(path: str | os.PathLike, indices: Sequence[int],
                      template: str = FRAME_TEMPLATE, short_side: int | None = None) -> np.ndarray:
    """Read frames ``indices`` (0-based, any order, repeats allowed; not clipped) of a frame folder
    (:func:`read_frame_folder_list`, stacked).

    Returns:
        np.uint8 array (T, H, W, 3), RGB, T = len(indices), in the order of ``indices``.

    Raises:
        VideoDecodeError: a frame file is missing or not a readable image (names the file), or
        the frames differ in size.
    """
    frames = read_frame_folder_list(path, indices, template, short_side)
    if any(f.shape != frames[0].shape for f in frames):
        raise VideoDecodeError(str(path), "frames of different sizes in one folder")
    return np.stack(frames)
