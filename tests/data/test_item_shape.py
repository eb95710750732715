"""Items cut at a per-item shape ``ds[(index, T, crop)]`` (multigrid): the T-segment frames, the base
shape's box resized to the crop, on every decode path; the plain index path unchanged."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tsm_ds.data import VideoClipDataset
from tsm_ds.data import sampling as S
from tsm_ds.data.packed_batch import collate_items
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import number_frame, read_number
from tsm_ds.data.transforms import ClipTransform
from tsm_ds.data.video import packed as P


class WholeFrames:
    """Stands in for the transform: the decoded frames (T, H, W, 3) whole, so their numbers can be read."""

    num_views = 1

    def frames_to_clip(self, frames, rng=None, out_size=None):
        return torch.stack([f.permute(1, 2, 0) for f in frames])


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shape")
    recs = []
    for v in range(4):
        path = root / f"v{v}.jpack"
        P.write_packed(path, [number_frame(i + 100 * v, 160, 128, texture=True, seed=v) for i in range(40 + v)])
        recs.append(VideoRecord(str(path), v % 2))
    return recs


def test_base_shape_tuple_is_the_default_item_bit_for_bit(packs):
    ds = VideoClipDataset(packs, mode="train", num_segments=8, img_size=64, seed=2)
    ds.set_epoch(1)
    for i in range(len(packs)):
        a, b = ds[i], ds[(i, 8, 64)]
        assert torch.equal(a["clip"], b["clip"]) and a["index"] == b["index"] == i and a["label"] == b["label"]


def test_frames_are_the_t_segment_rule_and_the_crop_the_base_box_resized(packs):
    ds = VideoClipDataset(packs, mode="train", num_segments=8, img_size=64, seed=5, flip=False)
    ds.set_epoch(3)
    item = ds[(2, 4, 32)]
    assert item["clip"].shape == (4, 3, 32, 32) and item["clip"].dtype == torch.uint8
    # the frames: TSN's train rule for T=4 with the item's seeded rng (seed, epoch, index, attempt, 0)
    want = S.tsn_train_indices(42, 4, np.random.default_rng([5, 3, 2, 0, 0])).tolist()
    frames = VideoClipDataset(packs, mode="train", num_segments=8, img_size=64, seed=5)
    frames.transform = WholeFrames()
    frames.set_epoch(3)
    assert [read_number(f) - 200 for f in frames[(2, 4, 32)]["clip"].numpy()] == want
    # the box: drawn as at S with the same random choices, only resized to the crop
    t = ds.transform
    base = t.boxes(160, 128, np.random.default_rng([5, 3, 2, 0, 1]))
    small = t.boxes(160, 128, np.random.default_rng([5, 3, 2, 0, 1]), out_size=32)
    assert [b[0] for b in base] == [b[0] for b in small] and base[0][1] == 64 and small[0][1] == 32


def test_decode_device_path_and_a_dataloader_of_shaped_batches(packs):
    ref = VideoClipDataset(packs, mode="train", num_segments=8, img_size=64, seed=3)
    bat = VideoClipDataset(packs, mode="train", num_segments=8, img_size=64, seed=3, decode_device="cpu")
    items = [bat[(i, 2, 40)] for i in range(4)]
    got = collate_items(items)["clip"].decode()
    want = torch.stack([ref[(i, 2, 40)]["clip"] for i in range(4)])
    assert got.shape == (4, 2, 3, 40, 40) and torch.equal(got, want)
    # a batch sampler's lists of (index, T, crop) through a DataLoader with workers
    dl = DataLoader(ref, batch_sampler=[[(0, 2, 40), (3, 2, 40)], [(1, 6, 48)]], num_workers=2,
                    collate_fn=collate_items)
    shapes = [tuple(b["clip"].shape) for b in dl]
    assert shapes == [(2, 2, 3, 40, 40), (1, 6, 3, 48, 48)]


def test_shape_tuples_are_refused_outside_training_and_when_empty(packs):
    val = VideoClipDataset(packs, mode="val", num_segments=8, img_size=64)
    with pytest.raises(ValueError, match="needs train mode"):
        val[(0, 4, 32)]
    tr = VideoClipDataset(packs, mode="train", num_segments=8, img_size=64)
    with pytest.raises(ValueError, match="T >= 1"):
        tr[(0, 0, 32)]
    with pytest.raises(ValueError, match="out_size"):
        ClipTransform("val", 64).boxes(160, 128, out_size=32)
