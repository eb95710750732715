"""Crop geometry and normalisation by value (official ops/transforms.py numbers, worked by hand)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tsm_ds.data import transforms as X

MEAN = torch.tensor(X.IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(X.IMAGENET_STD).view(1, 3, 1, 1)


def coord_frames(t=3, h=48, w=64):
    """uint8 (T, H, W, 3): R = column, G = row, B = 10 * frame (every pixel says where it is)."""
    f = np.zeros((t, h, w, 3), np.uint8)
    f[..., 0] = np.arange(w)[None, None, :]
    f[..., 1] = np.arange(h)[None, :, None]
    f[..., 2] = (10 * np.arange(t))[:, None, None]
    return f


def unnorm(clip: torch.Tensor) -> np.ndarray:
    """(T, 3, H, W) uint8 (the transform's output) or normalised float -> (T, H, W, 3) int grey levels."""
    if clip.dtype == torch.uint8:
        return clip.permute(0, 2, 3, 1).numpy().astype(int)
    x = (clip * STD + MEAN) * 255.0
    return x.round().permute(0, 2, 3, 1).numpy().astype(int)


def test_thirteen_fixed_offsets():
    # 340x256 image, 224 crop: w_step = 116 // 4 = 29, h_step = 32 // 4 = 8
    assert X.fill_fix_offset(True, 340, 256, 224, 224) == [
        (0, 0), (116, 0), (0, 32), (116, 32), (58, 16), (0, 16), (116, 16), (58, 32), (58, 0),
        (29, 8), (87, 8), (29, 24), (87, 24)]
    assert X.fill_fix_offset(False, 340, 256, 224, 224) == [(0, 0), (116, 0), (0, 32), (116, 32),
                                                            (58, 16)]


def test_multiscale_crop_sizes_and_offsets():
    # base 256: sides int(256 * [1, .875, .75, .66]) = 256, 224, 192, 168; |i - j| <= 1
    expect_pairs = {(256, 256), (224, 256), (256, 224), (224, 224), (192, 224), (224, 192),
                    (192, 192), (168, 192), (192, 168), (168, 168)}
    rng = np.random.default_rng(0)
    seen_pairs, seen_offsets = set(), set()
    for _ in range(2000):
        x, y, w, h = X.multiscale_crop_box(340, 256, 224, rng)
        assert (x, y) in X.fill_fix_offset(True, 340, 256, w, h)
        seen_pairs.add((w, h))
        if (w, h) == (224, 224):
            seen_offsets.add((x, y))
    assert seen_pairs == expect_pairs
    assert len(seen_offsets) == 13


def test_val_centre_crop_exact_pixels():
    f = coord_frames()
    t = X.ClipTransform("val", 32, scale_size=48)  # short side already 48: no scaling
    out = t(f)
    assert out.shape == (3, 3, 32, 32) and out.dtype == torch.uint8
    # torchvision CenterCrop: left = round((64 - 32) / 2) = 16, top = round((48 - 32) / 2) = 8
    assert np.array_equal(unnorm(out), f[:, 8:40, 16:48].astype(int))


def test_val_scales_short_side_then_crops():
    f = np.zeros((2, 480, 640, 3), np.uint8)
    f[:, :, 320:] = 255  # right half white
    out = X.ClipTransform("val", 224)(f)  # scale to 341x256, centre crop 224 (left 58)
    assert out.shape == (2, 3, 224, 224)
    img = unnorm(out)[0, :, :, 0]
    # the white edge sits at column 170.5 - 58 = 112.5 of the crop
    assert (img[:, :111] < 5).all() and (img[:, 115:] > 250).all()


def test_train_same_crop_for_every_frame_and_flip():
    f = coord_frames(t=4)
    t = X.ClipTransform("train", 48, train_short_side=None)  # crops of the 64x48 frame -> 48x48
    flips = set()
    for seed in range(60):
        rng = np.random.default_rng(seed)
        (bx, by, bw, bh), side, flip = t.boxes(64, 48, np.random.default_rng(seed))[0]
        out = unnorm(t(f, rng))
        # every frame got the same crop: only the per-frame blue channel differs
        assert np.array_equal(out[1:, ..., :2], np.broadcast_to(out[:1, ..., :2], out[1:, ..., :2].shape))
        assert out[:, 0, 0, 2].tolist() == [0, 10, 20, 30]
        flips.add(flip)
        if (bw, bh) == (48, 48):  # no resize: the exact pixels of the box
            ref = f[:, int(by):int(by) + 48, int(bx):int(bx) + 48].astype(int)
            assert np.array_equal(out, ref[:, :, ::-1] if flip else ref)
    assert flips == {True, False}


def test_train_flip_off():
    t = X.ClipTransform("train", 48, train_short_side=None, flip=False)
    assert not any(t.boxes(64, 48, np.random.default_rng(s))[0][2] for s in range(50))


def test_three_full_res_crops():
    f = coord_frames()
    out = X.ClipTransform("test", 32, num_crops=3, scale_size=48)(f)
    # crops of scale_size 48 at x = 0 (left), 4 * w_step = 16 (right), 2 * w_step = 8 (centre)
    assert out.shape == (3, 3, 3, 48, 48)
    for v, x0 in enumerate([0, 16, 8]):
        assert np.array_equal(unnorm(out[v]), f[:, :, x0:x0 + 48].astype(int))


def test_ten_crops_corners_centre_and_flips():
    f = coord_frames()
    out = X.ClipTransform("test", 32, num_crops=10, scale_size=48)(f)
    assert out.shape == (10, 3, 3, 32, 32)
    # w_step = 8, h_step = 4: (0,0) (32,0) (0,16) (32,16) (16,8); each followed by its flip
    for k, (x0, y0) in enumerate([(0, 0), (32, 0), (0, 16), (32, 16), (16, 8)]):
        ref = f[:, y0:y0 + 32, x0:x0 + 32].astype(int)
        assert np.array_equal(unnorm(out[2 * k]), ref)
        assert np.array_equal(unnorm(out[2 * k + 1]), ref[:, :, ::-1])


def test_imagenet_normalisation_values():
    f = np.zeros((1, 8, 8, 3), np.uint8)
    f[..., :] = (124, 116, 104)
    t = X.ClipTransform("val", 8, scale_size=8)
    out = X.normalize_batch(t(f), *t.normalization)
    assert out.dtype == torch.float32
    expect = [(124 / 255 - 0.485) / 0.229, (116 / 255 - 0.456) / 0.224, (104 / 255 - 0.406) / 0.225]
    assert torch.allclose(out[0, :, 0, 0], torch.tensor(expect), atol=1e-5)


def test_bad_options():
    with pytest.raises(ValueError):
        X.ClipTransform("test", 224, num_crops=4)
    with pytest.raises(ValueError):
        X.ClipTransform("bogus")
    with pytest.raises(ValueError):
        X.ClipTransform("val")(np.zeros((2, 8, 8), np.uint8))
