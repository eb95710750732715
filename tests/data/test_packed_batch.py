"""``--decode-device``: packs decoded in whole batches outside the workers, bit-identical on CPU."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from tsm_ds.data import VideoClipDataset, normalize_batch
from tsm_ds.data.packed_batch import PackedBatch, PackedClip, collate_items
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import number_frame, read_number
from tsm_ds.data.video import packed as P


@pytest.fixture()
def packs(tmp_path):
    recs = []
    for v in range(4):
        path = tmp_path / f"v{v}.jpack"
        P.write_packed(path, [number_frame(i + 100 * v, 160, 128, texture=True, seed=v) for i in range(24 + v)])
        recs.append(VideoRecord(str(path), v % 2))
    return recs


@pytest.mark.parametrize("mode, kwargs", [
    ("train", {}),
    ("val", {}),
    ("test", {"num_clips": 2, "num_crops": 3}),
    ("test", {"num_clips": 1, "num_crops": 1, "resize": "official"}),
])
def test_cpu_batched_decode_is_bit_identical_to_the_worker_path(packs, mode, kwargs):
    common = dict(mode=mode, num_segments=4, img_size=64, seed=3, **kwargs)
    ref = VideoClipDataset(packs, **common)
    bat = VideoClipDataset(packs, decode_device="cpu", **common)
    for epoch in (0, 1):
        ref.set_epoch(epoch)
        bat.set_epoch(epoch)
        items = [bat[i] for i in range(len(packs))]
        assert all(isinstance(it["clip"], PackedClip) for it in items)
        batch = collate_items(items)
        assert isinstance(batch["clip"], PackedBatch) and batch["clip"].shape == (4,)
        assert batch["label"].tolist() == [0, 1, 0, 1] and batch["index"].tolist() == [0, 1, 2, 3]
        want = torch.stack([ref[i]["clip"] for i in range(len(packs))])
        got = batch["clip"].decode()
        assert got.dtype == torch.uint8 and got.shape == want.shape
        assert torch.equal(got, want)
        # and through the consumers' one call, normalised
        assert torch.equal(normalize_batch(collate_items(items)["clip"], *bat.normalization),
                           normalize_batch(want, *ref.normalization))


def test_dataloader_with_workers_and_the_frames_kept(packs):
    ds = VideoClipDataset(packs, mode="val", num_segments=4, img_size=64, decode_device="cpu")
    dl = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate_items)
    batches = list(dl)
    clips = torch.cat([b["clip"].decode() for b in batches])
    assert clips.shape == (4, 4, 3, 64, 64)
    # val sampling: the segment centres of 24 + v frames, whose numbers the JPEGs carry
    kept = [c.frames for b in batches for c in b["clip"].clips]
    for v in range(4):
        seg = (24 + v) / 4
        want = [int(seg / 2 + seg * t) for t in range(4)]
        with P.PackedVideo(packs[v].path) as pv:
            dec = pv.decode(want)
            assert kept[v] == [pv.read_encoded([i])[i] for i in want]
        assert [read_number(f) for f in dec] == [100 * v + i for i in want]


def test_decode_device_refusals(packs, tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            VideoClipDataset(packs, decode_device="cuda")
    with pytest.raises(ValueError, match="must be one of"):
        VideoClipDataset(packs, decode_device="tpu")
    with pytest.raises(ValueError, match="packed videos only.*video.mp4"):
        VideoClipDataset(packs + [VideoRecord(str(tmp_path / "video.mp4"), 0)], decode_device="cpu")


def test_a_frame_that_does_not_decode_is_replaced_and_named(packs):
    ds = VideoClipDataset(packs[:1], mode="val", num_segments=4, img_size=64, decode_device="cpu")
    item = ds[0]
    good = collate_items([item])["clip"].decode()
    broken = list(item["clip"].frames)
    broken[2] = broken[2][:2] + b"\x00" * 40 + broken[2][-2:]   # markers intact, no image inside
    item["clip"].frames = broken
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = collate_items([item])["clip"].decode()
    assert any(packs[0].path in str(x.message) for x in w)
    assert torch.equal(out[0, [0, 1, 3]], good[0, [0, 1, 3]])
    assert torch.equal(out[0, 2], good[0, 1]) or torch.equal(out[0, 2], good[0, 3])
