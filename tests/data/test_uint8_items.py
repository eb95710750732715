"""Issue 27: items are uint8; ``normalize_batch`` once per batch gives, on CPU, bit for bit the clips
(values and strides) that the per-item float path (ClipTransform before issue 27) gave."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import write_numbered_video
from tsm_ds.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ClipTransform, normalize_batch


def old_float_item(clip_u8: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """The reference: the per-item float path of ClipTransform before issue 27, view by view
    (``v.float().sub_(mean * 255).mul_(1 / (std * 255))`` with (1, 3, 1, 1) tensors), then stacked."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    inv = 1.0 / (torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0)
    if clip_u8.dim() == 4:
        return clip_u8.float().sub_(m).mul_(inv)
    return torch.stack([v.float().sub_(m).mul_(inv) for v in clip_u8])


def _check(ds: VideoClipDataset, indices) -> int:
    """Old per-item float batches == normalize_batch(uint8 batch), values and strides; the item count."""
    items = [ds[i] for i in indices]
    assert all(it["clip"].dtype == torch.uint8 for it in items)
    old = default_collate([{**it, "clip": old_float_item(it["clip"], *ds.normalization)} for it in items])["clip"]
    new = normalize_batch(default_collate(items)["clip"], *ds.normalization, "cpu", torch.float32)
    assert new.dtype == torch.float32 and new.shape == old.shape
    assert torch.equal(new, old) and new.stride() == old.stride()
    # and it is the normalisation it claims to be
    m = torch.tensor(ds.normalization[0], dtype=torch.float64).view(3, 1, 1)
    s = torch.tensor(ds.normalization[1], dtype=torch.float64).view(3, 1, 1)
    u8 = default_collate(items)["clip"]
    assert torch.allclose(new.double(), (u8.double() / 255 - m) / s, atol=1e-5)
    return len(items)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("u8")
    return [VideoRecord(write_numbered_video(root / f"v{i}.mp4", n, gop=7, texture=True), label=i)
            for i, n in enumerate([30, 17, 45])]


@pytest.mark.parametrize("kw", [dict(mode="train", img_size=64), dict(mode="val", img_size=64),
                                dict(mode="test", img_size=64, num_clips=2, num_crops=3),
                                dict(mode="test", img_size=32, num_crops=10, resize="official")])
def test_uint8_then_normalize_batch_is_the_old_float_path_on_synthetic_videos(synthetic, kw):
    ds = VideoClipDataset(synthetic, num_segments=4, seed=2, **kw)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert _check(ds, range(len(ds))) == 3


@pytest.mark.parametrize("mode", ["train", "val"])
def test_uint8_then_normalize_batch_is_the_old_float_path_on_real_clips(shared_data, mode):
    paths = sorted(Path(shared_data, "videos").rglob("*.*"))[::4][:4]
    assert len(paths) >= 2
    ds = VideoClipDataset([VideoRecord(str(p), i) for i, p in enumerate(paths)], num_segments=8, mode=mode,
                          img_size=224, seed=0)
    item = ds[0]["clip"]
    assert item.shape == (8, 3, 224, 224) and item.dtype == torch.uint8
    assert item.stride() == (3 * 224 * 224, 1, 3 * 224, 3)   # channels-last per frame, as the float items were
    assert _check(ds, range(len(ds))) == len(paths)


def test_normalize_batch_device_dtype_and_floats_pass_through():
    x = torch.randint(0, 256, (2, 3, 3, 4, 4), dtype=torch.uint8)
    f32 = normalize_batch(x)
    assert f32.dtype == torch.float32
    assert torch.equal(normalize_batch(x, dtype=torch.bfloat16), f32.to(torch.bfloat16))  # cast after fp32
    assert float(normalize_batch(torch.full((1, 3, 1, 1), 255, dtype=torch.uint8), (0.5,) * 3, (0.5,) * 3)
                 .max()) == pytest.approx(1.0)
    already = torch.randn(2, 3, 4, 4)
    assert normalize_batch(already, device="cpu") is already   # a float batch is taken as normalised


def test_transform_keeps_its_normalization_and_copies_uncropped_views():
    t = ClipTransform("test", 32, num_crops=1, resize="official", scale_size=32, mean=(0.1, 0.2, 0.3))
    frames = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
    out = t(frames)
    assert t.normalization == ((0.1, 0.2, 0.3), IMAGENET_STD)
    assert out.dtype == torch.uint8 and torch.equal(out, frames.permute(0, 3, 1, 2))
    out[0, 0, 0, 0] = 255 - int(frames[0, 0, 0, 0])   # not a view of the frames (a frame cache's)
    assert int(frames[0, 0, 0, 0]) != int(out[0, 0, 0, 0])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
