"""The decoded-frame cache (tsm_ds.data.clip_cache) and train.py --cache-decoded: the same items as
without it, every video decoded once, sampling and crops still drawn per epoch, a size bound."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tsm_ds.data import video as V
from tsm_ds.data.clip_cache import DecodedFrameCache, attach_frame_cache
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import read_number, write_numbered_video


@pytest.fixture(scope="module")
def recs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    # B-frames and GOPs: decoding every frame must give the same pixels as decoding a clip's frames
    return [VideoRecord(write_numbered_video(root / f"v{i}.mp4", n, gop=7, texture=True), label=i % 2)
            for i, n in enumerate([30, 17, 45])]


def _items(ds, epoch):
    ds.set_epoch(epoch)
    return [ds[i]["clip"] for i in range(len(ds))]


@pytest.mark.parametrize("mode", ["train", "val"])
def test_items_are_bit_identical_with_and_without_the_cache(recs, mode):
    plain = VideoClipDataset(recs, num_segments=8, mode=mode, img_size=32, seed=3)
    cached = VideoClipDataset(recs, num_segments=8, mode=mode, img_size=32, seed=3)
    cache, stats = attach_frame_cache([cached], max_mb=64)
    assert stats["videos"] == 3 and stats["unreadable"] == 0 and stats["skipped"] == 0
    assert cache.nbytes == sum(v.nbytes for v in cache._frames.values()) > 0
    for epoch in (0, 1):
        for a, b in zip(_items(plain, epoch), _items(cached, epoch)):
            assert a.dtype == torch.uint8 and torch.equal(a, b)
    # decoded once, before training: every access afterwards is served from memory
    assert cache.misses == 0 and cache.hits == 2 * len(recs)


def test_sampling_and_crops_are_still_drawn_per_epoch(recs):
    ds = VideoClipDataset(recs, num_segments=8, mode="train", img_size=32, seed=0)
    attach_frame_cache([ds], max_mb=64)
    e0, e1 = _items(ds, 0), _items(ds, 1)
    assert any(not torch.equal(a, b) for a, b in zip(e0, e1))
    assert all(torch.equal(a, b) for a, b in zip(e0, _items(ds, 0)))   # and reproducible per epoch


def test_get_returns_the_frames_decode_frames_returns(recs):
    cache = DecodedFrameCache(max_bytes=2**30)
    path = recs[2].path
    idx = [44, 0, 3, 3, 60, -2]      # any order, repeats, out of range clipped as decode_frames does
    got = cache.get(path, idx)
    want = V.decode_frames(path, idx)
    assert got.dtype == np.uint8 and got.shape == want.shape and np.array_equal(got, want)
    assert [read_number(f) for f in got] == [44, 0, 3, 3, 44, 0]
    got[:] = 0                                             # a clip is a copy: the cache is untouched
    assert np.array_equal(cache.get(path, idx), want)
    assert (cache.misses, cache.hits, len(cache)) == (1, 1, 1)
    assert not cache.video(path).flags.writeable
    with pytest.raises(ValueError, match="no indices"):
        cache.get(path, [])


def test_size_limit_skips_videos_and_warns(recs):
    one = V.decode_frames(recs[0].path, range(30)).nbytes
    cache = DecodedFrameCache(max_bytes=one)          # room for the first video only
    with pytest.warns(RuntimeWarning, match="--cache-decoded-max-mb"):
        for r in recs:
            cache.video(r.path)
    assert len(cache) == 1 and cache.skipped == 2 and cache.nbytes == one
    assert cache.stats()["skipped"] == 2
    cache.video(recs[1].path)                         # not kept: decoded again
    assert cache.misses == 4
    with pytest.raises(ValueError, match="max_bytes"):
        DecodedFrameCache(0)
    with pytest.raises(ValueError, match="max_mb"):
        attach_frame_cache([], max_mb=0)


def test_unreadable_files_are_left_to_the_dataset(recs, tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    ds = VideoClipDataset([*recs, VideoRecord(str(bad), label=0)], num_segments=4, mode="val", img_size=32)
    cache, stats = attach_frame_cache([ds, None], max_mb=64)
    assert stats["unreadable"] == 1 and stats["videos"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        item = ds[3]                                      # replaced by another record, as without the cache
    assert item["bad"] == 1 and item["clip"].shape == (4, 3, 32, 32)


def test_train_rejects_a_non_positive_cache_limit(tmp_path, recs):
    from tsm_ds.cli.train import main

    lst = tmp_path / "train.txt"
    lst.write_text("".join(f"{r.path} {r.label}\n" for r in recs))
    code = main(["--train-list", str(lst), "--deepspeed_config", "cpu_fp32", "--cache-decoded",
                 "--cache-decoded-max-mb", "0", "--output-dir", str(tmp_path / "runs")])
    assert code == 2
