"""JPEG frame folders: the official TSM layout of one folder per video, ``img_00001.jpg`` ...

Frame ``i`` (0-based, as everywhere in :mod:`tsm_ds.data.video`) is the file
``FRAME_TEMPLATE.format(i + 1)`` (1-indexed names, as the official ``TSNDataSet`` reads them).
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from .errors import VideoDecodeError

__all__ = ["FRAME_TEMPLATE", "is_frame_folder", "frame_folder_count", "read_frame_folder"]

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


def read_frame_folder(path: str | os.PathLike, indices: Sequence[int],
                      template: str = FRAME_TEMPLATE, short_side: int | None = None) -> np.ndarray:
    """Read frames ``indices`` (0-based, any order, repeats allowed; not clipped) of a frame folder.

    Each distinct frame is read and decoded once (torchvision ``decode_image``, RGB). With
    ``short_side``, JPEG frames at least twice that size are decoded at a reduced DCT scale
    (:func:`~tsm_ds.data.video.packed.dct_scale_for`, simplejpeg), as packs are.

    Returns:
        np.uint8 array (T, H, W, 3), RGB, T = len(indices), in the order of ``indices``.

    Raises:
        VideoDecodeError: a frame file is missing or not a readable image (names the file).
    """
    import torch
    from torchvision.io import ImageReadMode, decode_image, read_file

    from .packed import _decode_one, dct_scale_for

    path = str(path)
    cache: dict[int, np.ndarray] = {}
    out = []
    scale = None   # the DCT scale, from the first frame's size
    for i in indices:
        if i not in cache:
            f = os.path.join(path, template.format(i + 1))
            try:
                if short_side and scale is None:
                    from PIL import Image

                    with Image.open(f) as im:   # the header only
                        scale = dct_scale_for(*im.size, short_side) if im.format == "JPEG" else 1
                if scale and scale > 1:
                    with open(f, "rb") as fh:
                        cache[i] = _decode_one(fh.read(), scale, short_side)
                else:
                    img = decode_image(read_file(f), mode=ImageReadMode.RGB)
                    cache[i] = img.permute(1, 2, 0).contiguous().numpy()
            except Exception as e:
                raise VideoDecodeError(f, f"cannot read frame: {type(e).__name__}: {e}") from None
        out.append(cache[i])
    del torch
    return np.stack(out)
