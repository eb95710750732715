"""Batched JPEG decoding of packed clips outside the DataLoader workers (``--decode-device``).

With ``VideoClipDataset(decode_device="cpu" | "cuda")`` a worker does not decode: it opens the
pack, reads the kept frames' JPEG bytes (checking that each is a whole JPEG), draws the crop and
flip from the same (seed, epoch, index) streams as the decoding path and returns a
:class:`PackedClip` as the item's ``"clip"``. :func:`collate_items` (the DataLoader's
``collate_fn``) gathers them into a :class:`PackedBatch`, and
:func:`tsm_ds.data.transforms.normalize_batch` (which every consumer calls once per batch)
decodes the whole batch in one torchvision ``decode_jpeg`` call on the decode device (nvJPEG on
CUDA; on CPU the workers' decoder, simplejpeg), then crops, resizes and flips there with
:meth:`tsm_ds.data.transforms.ClipTransform.apply_frames`. On CPU the result is bit-identical to
the worker path (the same decoder and the same transform, tested) wherever the workers decode at
full size, i.e. unless the stored frames are at least twice the size the crop needs (then the
workers decode at a reduced DCT scale and draw the crop on that size, while the batch path
decodes at full size: the same crop of the picture, slightly different pixels).

Truncated packs and frames without JPEG start / end markers are caught in the worker and the item
is replaced like a bad video. A frame that does not decode in the batch (damage inside it: the
CPU decode is strict; on CUDA a failed batch is decoded frame by frame, then strictly on the CPU)
is replaced by the nearest decoded frame of the same clip, and a RuntimeWarning names the file;
a clip none of whose frames decodes raises :class:`~tsm_ds.data.video.errors.VideoDecodeError`
naming the file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .video.errors import VideoDecodeError, warn_once

__all__ = ["DECODE_DEVICES", "PackedClip", "PackedBatch", "collate_items", "check_decode_device"]

#: where JPEG frames of packs may be decoded in batches (None: in the DataLoader workers)
DECODE_DEVICES = ("cpu", "cuda")


def check_decode_device(device: str | None) -> str | None:
    """Validate a ``--decode-device`` value: None, "cpu", "cuda" or "cuda:k".

    Raises:
        ValueError: another value, or "cuda" on a machine where ``torch.cuda.is_available()`` is
        False (the message says to use "cpu" or leave it unset).
    """
    if device is None:
        return None
    kind = str(device).split(":")[0]
    if kind not in DECODE_DEVICES:
        raise ValueError(f"--decode-device must be one of {DECODE_DEVICES} (or unset: decode in the "
                         f"DataLoader workers), got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("--decode-device cuda: this machine has no CUDA device "
                         "(torch.cuda.is_available() is False); use --decode-device cpu or leave it "
                         "unset to decode in the DataLoader workers")
    return str(device)


@dataclass
class PackedClip:
    """One item's clip, not decoded yet: what a worker returns with ``decode_device`` set.

    Attributes:
        frames: JPEG bytes of the K * T kept frames in sampling order (repeats included).
        boxes: the views drawn for this clip (:meth:`ClipTransform.boxes` output for the stored
            frame size), or None for the official val/test views.
        transform: the dataset's :class:`~tsm_ds.data.transforms.ClipTransform`.
        num_clips: K (test clips per item; 1 otherwise). num_segments: T.
        multi_view: the item is (V, T, 3, C, C) (test mode with more than one view).
        path: the pack (named in warnings and errors).
        decode_device: "cpu" or "cuda[:k]".
    """

    frames: list[bytes]
    boxes: list | None
    transform: Any
    num_clips: int
    num_segments: int
    multi_view: bool
    path: str
    decode_device: str


def stack_views(x: torch.Tensor, num_clips: int, num_segments: int, multi_view: bool) -> torch.Tensor:
    """A transform's output -> the item's clip: (T, 3, S, S), or (V, T, 3, C, C) for test views
    (crop-major: view = crop * num_clips + clip, as the official test script stacks them)."""
    if not multi_view:
        return x.reshape(-1, *x.shape[-3:]) if x.ndim == 5 else x
    if x.ndim == 4:  # one crop: (K*T, 3, S, S)
        x = x.unsqueeze(0)
    return x.reshape(x.shape[0] * num_clips, num_segments, *x.shape[-3:])


class PackedBatch:
    """The :class:`PackedClip` s of one batch (built by :func:`collate_items`).

    ``decode()`` returns the batch's uint8 clips (N, T, 3, S, S) or (N, V, T, 3, C, C) on the
    decode device. ``len()`` is N; ``shape[0]`` too (consumers that count a batch by its clip).
    """

    def __init__(self, clips: Sequence[PackedClip]):
        if not clips:
            raise ValueError("PackedBatch: no clips")
        self.clips = list(clips)
        self.decode_device = self.clips[0].decode_device

    def __len__(self) -> int:
        return len(self.clips)

    @property
    def shape(self) -> tuple[int]:
        """(N,): the batch size (the decoded shape is known only after :meth:`decode`)."""
        return (len(self.clips),)

    def decode(self) -> torch.Tensor:
        """Decode every frame in one ``decode_jpeg`` call on the decode device, then crop,
        resize and flip each clip there.

        Returns:
            uint8 (N, T, 3, S, S) (or (N, V, T, 3, C, C)) on the decode device.

        Raises:
            VideoDecodeError: a clip none of whose frames decodes (names the pack).
        """
        from .video.packed import decode_jpeg_batch

        flat = [f for c in self.clips for f in c.frames]
        dev = self.decode_device
        if dev == "cpu":   # the workers' decoder (strict: a damaged frame fails, it is not decoded)
            images = [_decode_strict(f) for f in flat]
        else:
            try:
                images = decode_jpeg_batch(flat, dev)
            except RuntimeError as e:   # one frame nvJPEG refuses fails the batch: decode one by one
                _count_fallback(e, len(flat))
                images = [_decode_alone(f, dev) for f in flat]
        out, j = [], 0
        for c in self.clips:
            imgs = _fill_missing(images[j:j + len(c.frames)], c.path)
            j += len(c.frames)
            # the worker path's transform, with the boxes the worker drew
            out.append(stack_views(c.transform.apply_frames(imgs, c.boxes), c.num_clips, c.num_segments,
                                   c.multi_view))
        batch = torch.stack(out)
        if dev != "cpu":
            # torchvision's CUDA decode_jpeg can hand back frames whose memory is reused while kernels
            # that read them are still queued (torchvision PR #9606, torchcodec PR #1634): wait for the
            # stream before the decoded frames (``images``) are freed on return
            torch.cuda.current_stream(torch.device(dev)).synchronize()
        return batch


_FALLBACKS = {"batches": 0, "frames": 0}


def nvjpeg_fallbacks() -> dict:
    """``{"batches", "frames"}`` this process decoded one frame at a time after nvJPEG refused a
    whole batch (logged by the trainer as ``data/nvjpeg_fallback_batches``)."""
    return dict(_FALLBACKS)


def _count_fallback(err: Exception, frames: int) -> None:
    """Count a batch nvJPEG refused, and warn once per process with its reason (the frames are then
    decoded one by one: slower, and what cannot decode on the GPU decodes on the CPU)."""
    import warnings

    _FALLBACKS["batches"] += 1
    _FALLBACKS["frames"] += frames
    if _FALLBACKS["batches"] == 1:
        warnings.warn(f"nvJPEG could not decode a batch of {frames} frames ({type(err).__name__}: "
                      f"{str(err).strip()[:300]}); decoding frame by frame instead (slower; counted as "
                      "data/nvjpeg_fallback_batches in TensorBoard; warned once)", RuntimeWarning, stacklevel=3)


def _decode_strict(data: bytes) -> torch.Tensor | None:
    """One JPEG on the CPU as the workers decode it (simplejpeg, strict: the pixels of
    torchvision's decoder, and an error instead of a damaged picture); None when it fails."""
    from .video.packed import _decode_one_chw

    try:
        return _decode_one_chw(data, 1)
    except Exception:
        return None


def _decode_alone(data: bytes, device: str) -> torch.Tensor | None:
    """One JPEG on ``device``; on failure strictly on the CPU (:func:`_decode_strict`) and moved
    there; None when neither can."""
    from .video.packed import decode_jpeg_batch

    try:
        return decode_jpeg_batch([data], device)[0]
    except RuntimeError:
        img = _decode_strict(data)
        return None if img is None else img.to(device)


def _fill_missing(images: list, path: str) -> list:
    """Replace frames that did not decode (None) by the nearest decoded frame of the clip."""
    ok = [i for i, im in enumerate(images) if im is not None]
    if not ok:
        raise VideoDecodeError(path, "no frame of the clip decodes")
    if len(ok) == len(images):
        return images
    bad = [i for i in range(len(images)) if images[i] is None]
    warn_once(path, "batch-decode", f"{path}: {len(bad)} of the clip's {len(images)} frames do not decode "
                                    f"(damaged pack: prepare it again); each is replaced by the nearest "
                                    "frame that does")
    return [im if im is not None else images[min(ok, key=lambda k: abs(k - i))]
            for i, im in enumerate(images)]


def collate_items(items: Sequence[dict]) -> dict:
    """The DataLoader ``collate_fn`` of :class:`~tsm_ds.data.dataset.VideoClipDataset`:
    ``torch.utils.data.default_collate``, except that :class:`PackedClip` clips become one
    :class:`PackedBatch` (decoded later, by :func:`~tsm_ds.data.transforms.normalize_batch`).

    Raises TypeError (default_collate's) for items it cannot stack.
    """
    from torch.utils.data import default_collate

    if not items or not isinstance(items[0].get("clip"), PackedClip):
        return default_collate(items)
    rest = default_collate([{k: v for k, v in it.items() if k != "clip"} for it in items])
    rest["clip"] = PackedBatch([it["clip"] for it in items])
    return rest
