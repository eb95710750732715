"""The training-ready packed format: one file per video holding its JPEG frames and an index.

Why (issue 27): a clip needs 8 of a video's ~300 frames. From H.264 the decoder must decode every
frame from the keyframe before each one (about 10 per kept frame at keyint 16); from JPEG frame
folders each kept frame is one small decode, but Kinetics-400 becomes ~72 million files, which
cluster filesystems and object stores serve badly. A pack keeps the JPEG folder's cost per frame
with one file per video: one ``open``, one read of the header, one read per kept frame (adjacent
frames in one read).

Layout (``.jpack``, all integers little-endian)::

    offset 0   magic       8 bytes  b"TSMJPACK"
    8          version     uint32   1
    12         num_frames  uint32   N >= 1
    16         width       uint32   frame width in pixels (every frame has this size)
    20         height      uint32   frame height
    24         meta_len    uint32   bytes of the JSON metadata
    28         reserved    uint32   0
    32         offsets     (N + 1) x uint64: frame i is bytes [offsets[i], offsets[i + 1]) of the
                           file; offsets[0] = 32 + 8 (N + 1) + meta_len, offsets[N] = file size
    ...        meta        UTF-8 JSON: {"source", "short_side", "quality"} (prepare writes these), data only
    offsets[0] frames      N baseline JPEG images (RGB, 4:2:0), frame i = presentation frame i

Frame ``i`` is the i-th frame in presentation order, counted from 0, as everywhere in
:mod:`tsm_ds.data.video`. The metadata is informative (never executed, never needed to decode).

Damage is detected, never decoded into garbage silently: a bad magic or version, offsets that are
not increasing or do not end at the file size (a truncated or extended file), and a frame that
does not start with the JPEG SOI marker (FF D8) or end with EOI (FF D9) raise
:class:`~tsm_ds.data.video.errors.VideoDecodeError` naming the file and what is wrong; the dataset
replaces such an item like any unreadable video.

Decoding: simplejpeg (libjpeg-turbo: the same pixels as torchvision's ``decode_jpeg``, 10-15 %
less CPU per frame on this machine; torchvision's call decodes a list of frames on CUDA with
nvJPEG, see :func:`decode_jpeg_batch`). When the stored frames are at least twice the size the
consumer needs (``short_side``), frames are decoded at a reduced DCT scale (3/8, 1/4, 1/8 ...:
the smallest of at least 2x whose short side is still >= ``short_side``), which skips most of the
inverse DCT work.
"""
from __future__ import annotations

import io
import json
import os
import struct
from typing import Iterable, Sequence

import numpy as np

from .errors import VideoDecodeError, VideoOpenError

__all__ = ["PACK_EXTENSION", "PACK_MAGIC", "is_packed", "PackedVideo", "write_packed",
           "packed_count", "read_packed_frames", "decode_jpeg_batch", "dct_scale_for"]

#: file extension of packed videos
PACK_EXTENSION = ".jpack"
#: the first 8 bytes of every pack
PACK_MAGIC = b"TSMJPACK"
PACK_VERSION = 1
_HEADER = struct.Struct("<8sIIIIII")          # magic, version, N, width, height, meta_len, reserved
_FIRST_READ = 64 * 1024                        # header + offsets of videos up to ~8,000 frames
_SOI, _EOI = b"\xff\xd8", b"\xff\xd9"


def is_packed(path: str | os.PathLike) -> bool:
    """True when ``path`` names a packed video (its extension is :data:`PACK_EXTENSION`)."""
    return str(path).lower().endswith(PACK_EXTENSION)


class PackedVideo:
    """An open packed video: the header read once, frames read with ``os.pread``.

    Args:
        path: a ``.jpack`` file.

    Attributes:
        path, num_frames (N), width, height (pixels), meta (dict, the JSON metadata),
        offsets (np.int64 (N + 1,), byte offsets of the frames).

    Raises:
        VideoOpenError: the file cannot be opened (missing, permissions).
        VideoDecodeError: not a pack, unknown version, or a damaged / truncated index (the
            message says which).

    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._buf = None
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise VideoOpenError(self.path, f"cannot open: {e.strerror or e}") from None
        try:
            self._read_header()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> "PackedVideo":
        """A pack held in memory (e.g. one sample of a shard, :mod:`tsm_ds.data.shards`).

        Args:
            data: the whole ``.jpack`` file's bytes.
            name: what errors call it (a shard sample: ``<shard folder>!/<class>/<video>.jpack``).

        Raises:
            VideoDecodeError: as the constructor (not a pack, damaged index), naming ``name``.
        """
        self = cls.__new__(cls)
        self.path, self._fd, self._buf = str(name), None, memoryview(data)
        self._read_header()
        return self

    def _pread(self, size: int, offset: int) -> bytes:
        if self._buf is not None:
            return bytes(self._buf[offset:offset + size])
        return os.pread(self._fd, size, offset)

    def _bad(self, what: str) -> VideoDecodeError:
        return VideoDecodeError(self.path, f"damaged pack: {what} (prepare the video again: "
                                           "tsm-ds prepare replaces it when it is deleted)")

    def _read_header(self) -> None:
        size = len(self._buf) if self._buf is not None else os.fstat(self._fd).st_size
        head = self._pread(_FIRST_READ, 0)
        if len(head) < _HEADER.size or head[:8] != PACK_MAGIC:
            raise self._bad(f"not a packed video (no {PACK_MAGIC!r} header)")
        _, version, n, w, h, meta_len, _ = _HEADER.unpack_from(head)
        if version != PACK_VERSION:
            raise self._bad(f"version {version}, this reader knows {PACK_VERSION}")
        if n < 1 or w < 1 or h < 1:
            raise self._bad(f"header says {n} frames of {w}x{h}")
        table_end = _HEADER.size + 8 * (n + 1)
        need = table_end + meta_len
        if need > size:
            raise self._bad(f"the index needs {need} bytes, the file has {size} (truncated)")
        if need > len(head):
            head = self._pread(need, 0)
        offsets = np.frombuffer(head, dtype="<u8", count=n + 1, offset=_HEADER.size).astype(np.int64)
        if offsets[0] != need or offsets[-1] != size or np.any(np.diff(offsets) <= 0):
            why = ("truncated" if offsets[-1] > size else "extended" if offsets[-1] < size
                   else "frame offsets out of order")
            raise self._bad(f"index does not match the file ({why}: {size} bytes, index ends at "
                            f"{int(offsets[-1])})")
        try:
            self.meta = json.loads(head[table_end:need].decode("utf-8")) if meta_len else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._bad(f"metadata is not JSON ({e})") from None
        self.num_frames, self.width, self.height, self.offsets = int(n), int(w), int(h), offsets

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self._fd = getattr(self, "_fd", None), None
        self._buf = None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "PackedVideo":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def read_encoded(self, indices: Iterable[int]) -> dict[int, bytes]:
        """The JPEG bytes of frames ``indices`` (0-based, clipped to [0, N - 1], repeats read once).

        Adjacent frames come from one ``pread``.

        Returns:
            {frame index: JPEG bytes}.

        Raises:
            VideoDecodeError: a frame is short (file changed under us) or is not a whole JPEG
            (no SOI / EOI marker).
        """
        n = self.num_frames
        want = sorted({min(max(int(i), 0), n - 1) for i in indices})
        out: dict[int, bytes] = {}
        j = 0
        while j < len(want):
            k = j
            while k + 1 < len(want) and want[k + 1] == want[k] + 1:
                k += 1
            lo, hi = int(self.offsets[want[j]]), int(self.offsets[want[k] + 1])
            buf = self._pread(hi - lo, lo)
            if len(buf) != hi - lo:
                raise self._bad(f"frames {want[j]}-{want[k]} are cut short")
            for i in want[j:k + 1]:
                a, b = int(self.offsets[i]) - lo, int(self.offsets[i + 1]) - lo
                data = buf[a:b]
                if data[:2] != _SOI or data[-2:] != _EOI:
                    raise self._bad(f"frame {i} is not a whole JPEG image")
                out[i] = data
            j = k + 1
        return out

    def decode_chw(self, indices: Sequence[int], *, short_side: int | None = None) -> list:
        """Decode frames ``indices`` (any order, repeats allowed; clipped to [0, N - 1]) as tensors.

        Args: as :meth:`decode`.

        Returns:
            a list of uint8 (3, H, W) RGB tensors in the order of ``indices`` (a repeated index
            is the same tensor), not copied into one array (the dataset crops them one by one).

        Raises:
            ValueError: no indices. VideoDecodeError: a damaged frame (names the file and frame).
        """
        idx = [min(max(int(i), 0), self.num_frames - 1) for i in indices]
        if not idx:
            raise ValueError("PackedVideo.decode: no indices requested")
        enc = self.read_encoded(idx)
        scale = dct_scale_for(self.width, self.height, short_side)
        frames = {}
        for i, data in enc.items():
            try:
                frames[i] = _decode_one_chw(data, scale, short_side)
            except Exception as e:
                raise self._bad(f"frame {i} does not decode ({type(e).__name__}: {e})") from None
        size = frames[idx[0]].shape
        for i, f in frames.items():
            if f.shape != size:
                raise self._bad(f"frame {i} is {f.shape[2]}x{f.shape[1]}, frame {idx[0]} {size[2]}x{size[1]}")
        return [frames[i] for i in idx]

    def decode(self, indices: Sequence[int], *, short_side: int | None = None) -> np.ndarray:
        """Decode frames ``indices`` (any order, repeats allowed; clipped to [0, N - 1]).

        Args:
            indices: frame indices.
            short_side: the short side the consumer needs; when the stored frames are at least
                twice as large, they are decoded at the largest reduced DCT scale whose short
                side is still >= ``short_side`` (:func:`dct_scale_for`). None: full size.

        Returns:
            np.uint8 (T, H, W, 3) RGB in the order of ``indices`` (H, W: the stored size, or the
            reduced one).

        Raises:
            ValueError: no indices. VideoDecodeError: a damaged frame (names the file and frame).
        """
        # the (3, H, W) tensors are views of the decoder's (H, W, 3) arrays: permuted back, stacked
        return np.stack([f.permute(1, 2, 0).numpy() for f in self.decode_chw(indices, short_side=short_side)])


def dct_scale_for(width: int, height: int, short_side: int | None) -> int:
    """The JPEG DCT scale denominator (1, 2, 4 or 8) to decode a width x height frame at.

    The largest d with ``min(width, height) / d >= short_side``: reduced-scale decoding is used
    only where the stored frames are at least twice what the consumer needs. None or 0: 1.
    """
    if not short_side:
        return 1
    d = 1
    while d < 8 and min(width, height) / (2 * d) >= short_side:
        d *= 2
    return d


def _decode_one_chw(data: bytes, scale: int, short_side: int | None = None):
    """One JPEG -> uint8 (3, H, W) tensor, a view of :func:`_decode_one`'s (H, W, 3) array."""
    import torch

    return torch.from_numpy(_decode_one(data, scale, short_side)).permute(2, 0, 1)


def _decode_one(data: bytes, scale: int, short_side: int | None = None) -> np.ndarray:
    """One JPEG -> np.uint8 (H, W, 3) RGB with simplejpeg (libjpeg-turbo; the same pixels as
    torchvision's ``decode_jpeg``, 10-15 % less CPU per frame here). ``scale`` > 1
    (:func:`dct_scale_for`): decoded at the smallest DCT scale of at least 2x whose sides are still
    >= ``short_side``. ``strict``: a damaged image raises ValueError instead of decoding garbage."""
    import simplejpeg

    if scale == 1 or not short_side:
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=short_side, min_width=short_side,
                                  min_factor=2)


def packed_count(path: str | os.PathLike) -> int:
    """Frames in a packed video (reads the header only).

    Raises VideoOpenError / VideoDecodeError as :class:`PackedVideo`.
    """
    with PackedVideo(path) as pv:
        return pv.num_frames


def read_packed_frames(path: str | os.PathLike, indices: Sequence[int], *,
                       short_side: int | None = None) -> np.ndarray:
    """Frames ``indices`` of the pack ``path``: np.uint8 (T, H, W, 3) RGB (see
    :meth:`PackedVideo.decode`). Raises VideoOpenError / VideoDecodeError / ValueError as it."""
    with PackedVideo(path) as pv:
        return pv.decode(indices, short_side=short_side)


def write_packed(path: str | os.PathLike, frames: Iterable[np.ndarray], *, quality: int = 90,
                 meta: dict | None = None) -> int:
    """Encode ``frames`` as JPEG and write them as one pack at ``path``, atomically.

    The frames are encoded with Pillow (libjpeg-turbo, baseline, 4:2:0, ``quality``), as
    ``tsm-ds prepare --mode frames`` writes JPEG folders, so a pack holds the same JPEG bytes as
    the folder would. Encoded frames are spooled to a temporary file (memory stays flat for long
    videos), then the header and frames are written under a temporary name and renamed.

    Args:
        path: destination (``.jpack``).
        frames: np.uint8 (H, W, 3) RGB frames in presentation order, all the same size.
        quality: JPEG quality (1-95).
        meta: JSON-serialisable metadata stored in the header (source, fps, ...).

    Returns:
        the number of frames written.

    Raises:
        VideoDecodeError: no frame (nothing is written). ValueError: frames of different sizes.
        OSError: the destination is not writable.
    """
    import tempfile

    from PIL import Image

    from tsm_ds.utils.io import atomic_path

    path = str(path)
    sizes: list[int] = []
    shape = None
    with tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(path))) as spool:
        for img in frames:
            if shape is None:
                shape = img.shape
            elif img.shape != shape:
                raise ValueError(f"{path}: frame {len(sizes)} is {img.shape}, frame 0 {shape}")
            b = io.BytesIO()
            Image.fromarray(img).save(b, format="JPEG", quality=quality)
            spool.write(b.getbuffer())
            sizes.append(b.tell())
        if not sizes:
            raise VideoDecodeError(path, "no frame to pack")
        meta_b = json.dumps(dict(meta or {}, quality=quality), sort_keys=True).encode("utf-8")
        n = len(sizes)
        first = _HEADER.size + 8 * (n + 1) + len(meta_b)
        offsets = np.concatenate([[first], first + np.cumsum(sizes)]).astype("<u8")
        header = _HEADER.pack(PACK_MAGIC, PACK_VERSION, n, shape[1], shape[0], len(meta_b), 0)
        spool.seek(0)
        with atomic_path(path, suffix=PACK_EXTENSION) as tmp, open(tmp, "wb") as f:
            f.write(header)
            f.write(offsets.tobytes())
            f.write(meta_b)
            while chunk := spool.read(1 << 20):
                f.write(chunk)
    return n


def decode_jpeg_batch(data: Sequence[bytes], device: str = "cpu") -> list:
    """Decode a list of JPEG images in one call: torchvision ``decode_jpeg`` on ``device``.

    Args:
        data: JPEG bytes (or uint8 1-D tensors) of the images.
        device: "cpu" (libjpeg-turbo) or "cuda[:k]" (nvJPEG, batched).

    Returns:
        a list of uint8 (3, H, W) RGB tensors on ``device``.

    Raises:
        RuntimeError: a device without CUDA when "cuda" is asked (torchvision's message), or an
        image that does not decode.
    """
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    ts = [d if isinstance(d, torch.Tensor) else torch.frombuffer(bytearray(d), dtype=torch.uint8)
          for d in data]
    return decode_jpeg(ts, mode=ImageReadMode.RGB, device=device)
