"""VideoClipDataset: the right frames per mode, determinism, views, bad-file policy, workers."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tsm_ds.data import sampling as S
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord, read_video_list
from tsm_ds.data.testvideo import number_frame, read_number, write_numbered_video


class Identity:
    """Stands in for the transform: returns the decoded uint8 frames, so numbers can be read."""

    num_views = 1

    def __call__(self, frames, rng=None):
        return torch.as_tensor(frames)

    def frames_to_clip(self, frames, rng=None):   # frames one by one, (3, H, W) each (JPEG folders, packs)
        return torch.stack([f.permute(1, 2, 0) for f in frames])


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    lengths = [90, 40, 5, 130]
    recs = [VideoRecord(write_numbered_video(root / f"v{i}.mp4", n, gop=10), label=i)
            for i, n in enumerate(lengths)]
    return recs, lengths


def numbers(clip) -> list[int]:
    return [read_number(f) for f in clip.numpy()]


def test_val_items_are_the_segment_centres(clips):
    recs, lengths = clips
    ds = VideoClipDataset(recs, num_segments=8, mode="val")
    ds.transform = Identity()
    for i, n in enumerate(lengths):
        item = ds[i]
        assert item["label"] == i and item["index"] == i and item["bad"] == 0
        assert numbers(item["clip"]) == S.tsn_val_indices(n, 8).tolist()


def test_train_items_follow_the_seeded_rng(clips):
    recs, lengths = clips
    ds = VideoClipDataset(recs, num_segments=8, mode="train", seed=5)
    ds.transform = Identity()
    ds.set_epoch(3)
    got = numbers(ds[0]["clip"])
    expect = S.tsn_train_indices(90, 8, np.random.default_rng([5, 3, 0, 0, 0])).tolist()
    assert got == expect
    assert all(x * 11 <= v < (x + 1) * 11 for x, v in enumerate(got))  # 90 // 8 = 11


def test_dense_and_multi_clip_test_views(clips):
    recs, lengths = clips
    ds = VideoClipDataset(recs, num_segments=4, mode="test", sampling="dense", num_clips=3,
                          dense_window=16)
    ds.transform = Identity()
    ds.transform.num_views = 1
    clip = ds.load(recs[3], 3)
    assert clip.shape[:2] == (3, 4)
    assert [numbers(c) for c in clip] == S.dense_test_indices(130, 4, num_clips=3, window=16).tolist()


def test_real_transform_shapes_and_determinism(clips):
    recs, _ = clips
    ds = VideoClipDataset(recs, num_segments=4, mode="train", img_size=64, seed=1)
    a, b = ds[1]["clip"], ds[1]["clip"]
    assert a.shape == (4, 3, 64, 64) and a.dtype == torch.uint8 and torch.equal(a, b)
    other = VideoClipDataset(recs, num_segments=4, mode="train", img_size=64, seed=1)
    assert torch.equal(other[1]["clip"], a)  # a fresh instance (another worker) agrees
    ds.set_epoch(1)
    assert not torch.equal(ds[1]["clip"], a)
    t = VideoClipDataset(recs, num_segments=4, mode="test", img_size=64, num_clips=2, num_crops=3)
    assert t[0]["clip"].shape == (6, 4, 3, 73, 73)  # 3 full-res crops of 64 * 256 // 224
    assert t.num_views == 6


def test_frame_folder_list_through_the_same_code(tmp_path):
    from PIL import Image

    d = tmp_path / "frames" / "clip_a"
    d.mkdir(parents=True)
    for i in range(12):
        Image.fromarray(number_frame(i)).save(d / f"img_{i + 1:05d}.jpg", quality=95)
    (tmp_path / "val.txt").write_text("clip_a 12 3\n")
    recs = read_video_list(tmp_path / "val.txt", root=tmp_path / "frames")
    ds = VideoClipDataset(recs, num_segments=4, mode="val")
    ds.transform = Identity()
    item = ds[0]
    assert item["label"] == 3 and numbers(item["clip"]) == S.tsn_val_indices(12, 4).tolist()


def test_bad_file_warned_once_counted_and_replaced_deterministically(clips, tmp_path):
    recs, lengths = clips
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00" * 1000)
    missing = str(tmp_path / "missing.mp4")
    records = [VideoRecord(str(bad), 7), recs[0], VideoRecord(missing, 8), recs[1]]
    ds = VideoClipDataset(records, num_segments=4, mode="val")
    ds.transform = Identity()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        first = ds[0]
        again = ds[0]
        ds[2]
    assert first["bad"] >= 1 and first["index"] == 0
    assert first["label"] in (0, 1) and first["label"] == again["label"]
    assert torch.equal(first["clip"], again["clip"])
    # the replacement is a good record's val clip
    n = lengths[first["label"]]
    assert numbers(first["clip"]) == S.tsn_val_indices(n, 4).tolist()
    texts = [str(x.message) for x in w]
    assert sum(str(bad) in t for t in texts) == 1  # once per file
    assert sum(missing in t and "not found" in t for t in texts) == 1


def test_all_bad_raises_instead_of_looping(tmp_path):
    recs = [VideoRecord(str(tmp_path / f"none{i}.mp4"), 0) for i in range(3)]
    ds = VideoClipDataset(recs, num_segments=4, mode="val", max_replacements=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="6 unreadable files in a row"):
            ds[1]


def test_dataloader_workers_do_not_hang(clips):
    recs, _ = clips
    ds = VideoClipDataset(recs, num_segments=4, mode="train", img_size=32)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, timeout=60)
    batches = list(loader)
    assert [b["clip"].shape for b in batches] == [(2, 4, 3, 32, 32)] * 2
    assert torch.cat([b["index"] for b in batches]).tolist() == [0, 1, 2, 3]
    assert torch.equal(batches[0]["clip"][1], ds[1]["clip"])  # same item in a worker and here


def test_option_errors(clips):
    recs, _ = clips
    with pytest.raises(ValueError):
        VideoClipDataset([], num_segments=4)
    with pytest.raises(ValueError):
        VideoClipDataset(recs, mode="val", num_crops=3)
    with pytest.raises(ValueError):
        VideoClipDataset(recs, mode="train", sampling="bogus")


def test_set_epoch_reaches_persistent_workers(clips):
    recs, _ = clips
    ds = VideoClipDataset(recs[:2], num_segments=4, mode="train", img_size=32, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=1, persistent_workers=True,
                                         timeout=60)
    seen = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        seen.append(next(iter(loader))["clip"])
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert torch.equal(seen[epoch][0], ds[0]["clip"])
    assert not torch.equal(seen[0], seen[1])
