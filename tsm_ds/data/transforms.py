"""Clip transforms: the official TSM crops, resize, flip and ImageNet normalisation.

Every frame of a clip gets the same crop and flip. Input: uint8 (T, H, W, 3) RGB frames as
:func:`tsm_ds.data.video.decode_frames` returns them. Output: uint8 (T, 3, S, S), or
(V, T, 3, S, S) for several test crops (issue 27: 4x fewer bytes through the DataLoader's shared
memory and to the device). The ImageNet normalisation is done once per batch by the consumer, on
its device, by :func:`normalize_batch` (float32 ``(x - 255 mean) * (1 / (255 std))``, bit-identical
on CPU to the per-item float path this module had before).

Geometry follows mit-han-lab/temporal-shift-module ``ops/transforms.py``:

- train: ``GroupMultiScaleCrop(S, [1, .875, .75, .66])`` (max_distort 1, the 13 fixed offsets of
  ``fill_fix_offset(more_fix_crop=True)``) then resize to S x S, then a horizontal flip with
  probability 0.5 (``flip=False`` for direction-sensitive datasets such as Something-Something).
  The official Kinetics frames are extracted with a height of 331 (``tools/vid2img_kinetics.py``:
  ``scale=-1:331``); we read raw video, so the crop is computed on the frame scaled to a short side
  of ``train_short_side`` (331 * S / 224 by default; None = native size).
- val / test: the official ``test_models.py`` (commit 23eada75c6e55cdd0b91f2c99f310918260885a1)
  scales the short side to scale_size = S * 256 // 224 (``GroupScale``, PIL bilinear) and crops
  squares of side ``c`` = scale_size with ``--full_res``, else S:

  - 1 crop: ``GroupCenterCrop(c)``;
  - 3 crops: ``GroupFullResSample(c, scale_size, flip=False)``: left, right, centre;
  - 5 crops: ``GroupOverSample(c, scale_size, flip=False)``: 4 corners + centre;
  - 10 crops: ``GroupOverSample(c, scale_size)``: the 5 crops and their flips, ordered crop0,
    flip0, crop1, flip1, ...

  The crops are fed to the network at their own side ``c`` (no resize after the crop).
  ``full_res=None`` keeps this package's pre-issue-18 meaning: full resolution for 3 crops only.

Resizing (val / test), ``resize=``:

- ``"box"`` (default): scaling and cropping in one step: the crop box is computed in the scaled
  frame's coordinates, mapped back to the source frame (corners rounded to whole source pixels),
  and only that region is resized (bilinear, antialiased; ``TF.resized_crop``).
- ``"official"``: the official order: the whole frame's short side is scaled to scale_size
  (bilinear, antialiased, on uint8: torchvision's PIL-compatible uint8 kernel), then the integer
  boxes are cut out. Matches PIL ``GroupScale`` + ``GroupCenterCrop`` within 1 grey level.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "scale_size_for", "train_short_side_for",
           "fill_fix_offset", "multiscale_crop_box", "center_crop_box", "full_res_boxes",
           "oversample_boxes", "official_view_boxes", "RESIZE_MODES", "TEST_CROPS", "ClipTransform",
           "normalize_batch"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SCALES = (1.0, 0.875, 0.75, 0.66)
#: val/test resize modes (see the module docstring).
RESIZE_MODES = ("box", "official")
#: test crops per clip, as the official ``--test_crops``.
TEST_CROPS = (1, 3, 5, 10)


def scale_size_for(img_size: int) -> int:
    """Short side before the centre crop: img_size * 256 // 224 (official ``net.scale_size``)."""
    return img_size * 256 // 224


def train_short_side_for(img_size: int) -> int:
    """Short side of the frames the official Kinetics training crops from: 331 * img_size / 224."""
    return int(round(331 * img_size / 224))


def fill_fix_offset(more_fix_crop: bool, image_w: int, image_h: int, crop_w: int,
                    crop_h: int) -> list[tuple[int, int]]:
    """The official fixed crop offsets (x, y): 5 (corners + centre) or 13 with ``more_fix_crop``.

    Source: ops/transforms.py ``GroupMultiScaleCrop.fill_fix_offset`` (same order).
    """
    w_step = (image_w - crop_w) // 4
    h_step = (image_h - crop_h) // 4
    ret = [(0, 0), (4 * w_step, 0), (0, 4 * h_step), (4 * w_step, 4 * h_step),
           (2 * w_step, 2 * h_step)]
    if more_fix_crop:
        ret += [(0, 2 * h_step), (4 * w_step, 2 * h_step), (2 * w_step, 4 * h_step),
                (2 * w_step, 0), (1 * w_step, 1 * h_step), (3 * w_step, 1 * h_step),
                (1 * w_step, 3 * h_step), (3 * w_step, 3 * h_step)]
    return ret


def multiscale_crop_box(image_w: int, image_h: int, input_size: int, rng: np.random.Generator,
                        *, scales: Sequence[float] = SCALES, max_distort: int = 1,
                        more_fix_crop: bool = True) -> tuple[int, int, int, int]:
    """One random crop box (x, y, w, h) of the official multi-scale crop, in pixels of the image.

    Crop sides are ``int(min(w, h) * scale)`` (snapped to ``input_size`` when within 3 px), width
    and height scale indices differing by at most ``max_distort``; the offset is one of the fixed
    offsets of :func:`fill_fix_offset`. The caller resizes the box to input_size x input_size.

    Source: ops/transforms.py ``GroupMultiScaleCrop._sample_crop_size`` (fix_crop=True).
    """
    base = min(image_w, image_h)
    sizes = [int(base * s) for s in scales]
    crop_h = [input_size if abs(x - input_size) < 3 else x for x in sizes]
    crop_w = [input_size if abs(x - input_size) < 3 else x for x in sizes]
    pairs = [(w, h) for i, h in enumerate(crop_h) for j, w in enumerate(crop_w)
             if abs(i - j) <= max_distort]
    w, h = pairs[int(rng.integers(len(pairs)))]
    offsets = fill_fix_offset(more_fix_crop, image_w, image_h, w, h)
    x, y = offsets[int(rng.integers(len(offsets)))]
    return x, y, w, h


def center_crop_box(image_w: int, image_h: int, crop: int) -> tuple[int, int, int, int]:
    """Centre crop box (x, y, w, h) as torchvision's CenterCrop: offsets round((side - crop) / 2)."""
    return (int(round((image_w - crop) / 2.0)), int(round((image_h - crop) / 2.0)), crop, crop)


def full_res_boxes(image_w: int, image_h: int, crop: int) -> list[tuple[int, int, int, int]]:
    """Left, right, centre crop boxes (x, y, w, h) of side ``crop``, no flips.

    Source: ops/transforms.py ``GroupFullResSample.__call__`` offsets (w_step = (w - crop) // 4,
    h_step likewise; x = 0, 4 w_step, 2 w_step at y = 2 h_step). The official name says "full
    resolution" because test_models.py passes crop = scale_size with ``--full_res``; without it
    the same offsets are used with crop = S.
    """
    w_step = (image_w - crop) // 4
    h_step = (image_h - crop) // 4
    return [(0, 2 * h_step, crop, crop), (4 * w_step, 2 * h_step, crop, crop),
            (2 * w_step, 2 * h_step, crop, crop)]


def oversample_boxes(image_w: int, image_h: int, crop: int) -> list[tuple[int, int, int, int]]:
    """The 5 boxes (x, y, w, h) of official ``GroupOverSample`` (4 corners, centre); each is used
    unflipped and flipped for 10 crops, unflipped only for 5 (``flip=False``)."""
    return [(x, y, crop, crop) for x, y in fill_fix_offset(False, image_w, image_h, crop, crop)]


def official_view_boxes(image_w: int, image_h: int, crop: int, num_crops: int
                    ) -> list[tuple[tuple[int, int, int, int], bool]]:
    """The test views of an image already scaled to short side scale_size: [(box, flip)].

    Args:
        image_w, image_h: the scaled image's size in pixels.
        crop: crop side (scale_size with full resolution, else S).
        num_crops: 1 (centre), 3 (left/right/centre), 5 (corners + centre), 10 (the 5 + flips,
            ordered crop0, flip0, crop1, ...).

    Returns:
        num_crops (box (x, y, w, h) in integer pixels of the scaled image, flip) pairs.

    Raises:
        ValueError: num_crops not in :data:`TEST_CROPS`.

    Source: test_models.py (commit 23eada75) ``--test_crops`` branches with ops/transforms.py
    ``GroupCenterCrop`` / ``GroupFullResSample(flip=False)`` / ``GroupOverSample(flip=False|True)``.
    """
    if num_crops == 1:
        return [(center_crop_box(image_w, image_h, crop), False)]
    if num_crops == 3:
        return [(b, False) for b in full_res_boxes(image_w, image_h, crop)]
    if num_crops == 5:
        return [(b, False) for b in oversample_boxes(image_w, image_h, crop)]
    if num_crops == 10:
        return [(b, fl) for b in oversample_boxes(image_w, image_h, crop) for fl in (False, True)]
    raise ValueError(f"num_crops must be one of {TEST_CROPS} (official --test_crops), got {num_crops}")


def _scaled_size(w: int, h: int, short: int | None) -> tuple[int, int, float]:
    """(w', h', factor source/scaled) after scaling the short side to ``short`` (torchvision
    Resize(int) rule: the long side is int(short * long / short_side))."""
    if short is None:
        return w, h, 1.0
    if w <= h:
        nw, nh = short, int(short * h / w)
        return nw, nh, w / nw
    nw, nh = int(short * w / h), short
    return nw, nh, h / nh


def normalize_batch(clip: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """A batch of uint8 clips -> the network's normalised input, on ``device``, once per batch.

    Args:
        clip: uint8 (..., 3, H, W), e.g. (N, T, 3, S, S) or (N, V, T, 3, C, C) as the DataLoader
            stacks :class:`ClipTransform` outputs; or a :class:`~tsm_ds.data.packed_batch.PackedBatch`
            (``--decode-device``), decoded, cropped and resized first on its decode device. A floating
            tensor is taken as already normalised (hand-made datasets, synthetic batches) and only
            moved and cast.
        mean, std: per-channel values for pixels in [0, 1] (the dataset's
            ``normalization``; ImageNet by default).
        device: where the result goes (None: where ``clip`` is); the uint8 batch is moved first,
            so that a quarter of the bytes cross the bus and the arithmetic runs on the device.
        dtype: the result's dtype (None: float32); the normalisation itself is always float32,
            the cast (bf16 / fp16 engines) comes after it.

    Returns:
        ``(float32(clip) - 255 mean) * (1 / (255 std))`` cast to ``dtype``, same shape and strides
        as ``clip`` (``Tensor.float`` preserves the memory format). On CPU bit-identical to
        normalising each item separately, as the per-item path did before issue 27.
    """
    from .packed_batch import PackedBatch

    if isinstance(clip, PackedBatch):   # --decode-device: JPEG frames decoded here, batched
        clip = clip.decode()
    if device is not None:   # host -> accelerator copies may overlap (pinned batches)
        clip = clip.to(device, non_blocking=torch.device(device).type != "cpu")
    if clip.is_floating_point():
        return clip if dtype is None else clip.to(dtype)
    m = (torch.tensor(mean, dtype=torch.float32).view(3, 1, 1) * 255.0).to(clip.device)
    inv = (1.0 / (torch.tensor(std, dtype=torch.float32).view(3, 1, 1) * 255.0)).to(clip.device)
    # in place: no clip-sized temporaries beyond the float copy
    out = clip.float().sub_(m).mul_(inv)
    return out if dtype is None or dtype == torch.float32 else out.to(dtype)


class ClipTransform:
    """uint8 (T, H, W, 3) frames -> uint8 (T, 3, S, S) (or (V, T, 3, C, C)) crops, not normalised.

    Args:
        mode: "train" (multi-scale crop + flip), "val" (scale + centre crop) or "test".
        img_size: S, the network input side (224).
        flip: random horizontal flip in training (p = 0.5).
        num_crops: test views per clip: 1 (centre), 3 (left/right/centre), 5 (corners + centre)
            or 10 (the 5 and their flips); see :func:`official_view_boxes`.
        full_res: test crops of side scale_size (official ``--full_res``) instead of S; None:
            True for 3 crops only (this package's meaning of 3 crops before issue 18).
        resize: val/test scaling, ``"box"`` (default, one resized_crop per view) or
            ``"official"`` (scale the whole frame, then crop; see the module docstring).
        scale_size: short side for val/test (default img_size * 256 // 224).
        train_short_side: short side training crops are computed on (default 331 * S / 224,
            the official Kinetics frame height; None: the decoded frame as is).
        mean, std: the normalisation the consumer applies (ImageNet by default; kept as
            :attr:`normalization` for :func:`normalize_batch`), for pixels scaled to [0, 1].

    Call ``t(frames, rng)``; ``rng`` (numpy Generator) supplies every random choice, so one clip
    gets one crop and one flip decision for all its frames. Raises ValueError for bad options.
    """

    def __init__(self, mode: str = "train", img_size: int = 224, *, flip: bool = True,
                 num_crops: int = 1, full_res: bool | None = None, resize: str = "box",
                 scale_size: int | None = None, train_short_side: int | None | str = "auto",
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD):
        if mode not in ("train", "val", "test"):
            raise ValueError(f"mode must be train/val/test, got {mode!r}")
        if num_crops not in TEST_CROPS:
            raise ValueError(f"num_crops must be one of {TEST_CROPS} (official test crops), got {num_crops}")
        if resize not in RESIZE_MODES:
            raise ValueError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
        self.mode, self.img_size, self.flip, self.num_crops = mode, img_size, flip, int(num_crops)
        self.full_res = bool(num_crops == 3 if full_res is None else full_res) and mode == "test"
        self.resize = resize
        self.scale_size = scale_size or scale_size_for(img_size)
        self.train_short_side = (train_short_side_for(img_size) if train_short_side == "auto"
                                 else train_short_side)
        self.normalization = (tuple(float(v) for v in mean), tuple(float(v) for v in std))

    @property
    def num_views(self) -> int:
        """Views per clip this transform makes: num_crops in test mode, else 1."""
        return self.num_crops if self.mode == "test" else 1

    @property
    def crop_size(self) -> int:
        """Side of the val/test crops and of the output: scale_size with full_res, else S."""
        return self.scale_size if self.full_res else self.img_size

    def scaled_boxes(self, width: int, height: int) -> tuple[tuple[int, int], list]:
        """Val/test views in the frame scaled to short side scale_size.

        Returns ((scaled w, scaled h), [(integer box (x, y, w, h), flip)]), the official boxes.
        """
        sw, sh, _ = _scaled_size(width, height, self.scale_size)
        return (sw, sh), official_view_boxes(sw, sh, self.crop_size, self.num_views)

    def boxes(self, width: int, height: int, rng: np.random.Generator | None = None, *,
              out_size: int | None = None) -> list[tuple[tuple[float, float, float, float], int, bool]]:
        """The views of a width x height frame: [(source box (x, y, w, h), output side, flip)].

        ``out_size`` (train mode only; multigrid's per-step crop): the same box as at S, drawn with the
        same random choices, resized to ``out_size`` instead of S: the crop covers what it covers at
        the base shape on a coarser pixel grid (the multigrid paper, Sec. 3: a coarser sampling grid;
        PySlowFast scales its jitter range by crop / base crop for the same reason). Raises
        ValueError for ``out_size`` outside train mode or < 1.
        """
        if out_size is not None and (self.mode != "train" or int(out_size) < 1):
            raise ValueError(f"out_size={out_size}: a per-item crop side applies to train mode (>= 1 px), "
                             f"this transform is {self.mode!r}")
        if self.mode == "train":
            sw, sh, f = _scaled_size(width, height, self.train_short_side)
            x, y, w, h = multiscale_crop_box(sw, sh, self.img_size, rng)
            flip = bool(self.flip and rng.random() < 0.5)
            return [((x * f, y * f, w * f, h * f), self.img_size if out_size is None else int(out_size), flip)]
        f = _scaled_size(width, height, self.scale_size)[2]
        return [((x * f, y * f, w * f, h * f), self.crop_size, fl)
                for (x, y, w, h), fl in self.scaled_boxes(width, height)[1]]

    def _official_views(self, x: torch.Tensor) -> list[tuple[torch.Tensor, bool]]:
        """Scale the whole (T, 3, H, W) uint8 clip, then cut the integer boxes (official order)."""
        height, width = x.shape[-2:]
        (sw, sh), views = self.scaled_boxes(width, height)
        if (sw, sh) != (width, height):
            x = TF.resize(x, [sh, sw], interpolation=InterpolationMode.BILINEAR, antialias=True)
        return [(x[..., by:by + bh, bx:bx + bw], fl) for (bx, by, bw, bh), fl in views]

    def __call__(self, frames: np.ndarray | torch.Tensor, rng: np.random.Generator | None = None, *,
                 out_size: int | None = None) -> torch.Tensor:
        """Transform one clip (or several clips stacked as (K*T, H, W, 3) for test views);
        ``out_size``: the train crop's output side instead of S (:meth:`boxes`).

        Returns uint8 (T, 3, S, S) when there is one view, else (V, T, 3, C, C), C the
        :attr:`crop_size` (S, or scale_size with full_res); normalise batches of them with
        ``normalize_batch(clips, *self.normalization)``.
        """
        x = torch.as_tensor(frames)
        if x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"frames must be (T, H, W, 3) uint8, got shape {tuple(x.shape)}")
        x = x.permute(0, 3, 1, 2)  # (T, 3, H, W), a view
        boxes = (None if self.resize == "official" and self.mode != "train"
                 else self.boxes(x.shape[-1], x.shape[-2], rng, out_size=out_size))
        return self.apply(x, boxes)

    def apply_frames(self, frames: Sequence[torch.Tensor], boxes: list | None) -> torch.Tensor:
        """:meth:`apply` for frames given one by one, uint8 (3, H, W) each (decoded JPEGs): each
        view is cut out of every frame and only the crops are stacked and resized, so the
        whole frames are never copied into one clip tensor. ``boxes`` None: the official
        val/test views (the frames are stacked whole for them).

        Returns what :meth:`__call__` returns, on the frames' device. Raises ValueError when the
        frames differ in size.
        """
        h0, w0 = frames[0].shape[-2:]
        if any(f.shape[-2:] != (h0, w0) for f in frames):
            raise ValueError(f"frames of different sizes: {sorted({tuple(f.shape) for f in frames})}")
        if boxes is None:
            return self.apply(torch.stack(list(frames)), None)
        views = []
        for (bx, by, bw, bh), side, flip in boxes:
            top, left = int(round(by)), int(round(bx))
            h, w = max(1, int(round(bh))), max(1, int(round(bw)))
            # a copy of the crops only, as (T, h, w, 3) memory: the uint8 resize's fast layout
            crop = torch.stack([TF.crop(f, top, left, h, w).permute(1, 2, 0) for f in frames]).permute(0, 3, 1, 2)
            if (h, w) != (side, side):
                crop = TF.resize(crop, [side, side], interpolation=InterpolationMode.BILINEAR, antialias=True)
            views.append(TF.horizontal_flip(crop) if flip else crop)
        return views[0] if len(views) == 1 else torch.stack(views)

    def frames_to_clip(self, frames: Sequence[torch.Tensor], rng: np.random.Generator | None = None, *,
                       out_size: int | None = None) -> torch.Tensor:
        """:meth:`__call__` for frames given one by one, uint8 (3, H, W) each: the views drawn
        for their size with ``rng`` (:meth:`boxes`, ``out_size`` as there), then :meth:`apply_frames`."""
        official = self.resize == "official" and self.mode != "train"
        h, w = frames[0].shape[-2:]
        return self.apply_frames(frames, None if official else self.boxes(w, h, rng, out_size=out_size))

    def apply(self, x: torch.Tensor, boxes: list | None) -> torch.Tensor:
        """Cut and scale the views ``boxes`` (from :meth:`boxes`, drawn for this clip's frame
        size) out of uint8 frames ``x`` (T, 3, H, W) on any device; ``boxes`` None: the
        official val/test views (``resize="official"``, no random choice).

        Returns what :meth:`__call__` returns, on ``x``'s device. The batched decoder
        (:mod:`tsm_ds.data.packed_batch`) calls it with the boxes a worker drew.
        """
        if boxes is None:
            views = self._official_views(x)
        else:
            views = []
            for (bx, by, bw, bh), side, flip in boxes:
                top, left = int(round(by)), int(round(bx))
                h, w = max(1, int(round(bh))), max(1, int(round(bw)))
                views.append((TF.resized_crop(x, top, left, h, w, [side, side],
                                              interpolation=InterpolationMode.BILINEAR,
                                              antialias=True), flip))
        base = x.untyped_storage().data_ptr()
        # a crop that needed no resizing is a view of the frames (maybe a cache's): copied, in the
        # layout Tensor.float() gave the per-item float path (memory format preserved)
        out = [TF.horizontal_flip(v) if flip else v.clone() if v.untyped_storage().data_ptr() == base else v
               for v, flip in views]
        return out[0] if len(out) == 1 else torch.stack(out)
