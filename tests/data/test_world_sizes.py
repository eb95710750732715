"""Every rank reads every sample (issue 36): for each data source the README documents, the items
an epoch gives per rank of world 2 and 4 (the environment a launcher sets: WORLD_SIZE, RANK,
LOCAL_RANK; the trainer's own loaders, DataLoader workers included) equal by index, label and
pixels what world 1 gives for the same (seed, epoch, index); the ranks' union is the epoch, and
nothing is replaced.

Before the fix, a shard reader built under WORLD_SIZE=N (litdata's distributed view) could read
only the first 1/N of the samples and the dataset replaced the rest: these tests failed with
``bad`` > 0 at world 2 and 4 for the shard sources, local and S3.
"""
from __future__ import annotations

import json

import pytest
import torch

from tsm_ds.data import shards
from tsm_ds.data.options import ReaderOptions
from tsm_ds.data.splits import build_datasets, resolve_split
from tsm_ds.data.testvideo import write_numbered_video

SEED, EPOCH, T, SIZE = 11, 1, 3, 32
CLASSES = ("a", "b", "c")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """3 classes x 4 numbered H.264 videos (18 frames of 128 x 64, per-class GOPs); their list
    files; their packs (tsm-ds prepare, with shards of 20 kB: several chunks); their JPEG frame
    folders (tsm-ds prepare --mode frames)."""
    from tsm_ds.cli import prepare as prepare_cli

    root = tmp_path_factory.mktemp("world_sizes")
    src = root / "videos"
    rows = []
    for c, name in enumerate(CLASSES):
        (src / name).mkdir(parents=True)
        for v in range(4):
            write_numbered_video(src / name / f"{name}{v}.mp4", 18, width=128, height=64, gop=6 + c, bframes=1)
            rows.append((f"{name}/{name}{v}.mp4", c))
    (root / "train.txt").write_text("".join(f"{p} {c}\n" for p, c in rows if not p.endswith("0.mp4")))
    (root / "val.txt").write_text("".join(f"{p} {c}\n" for p, c in rows if p.endswith("0.mp4")))
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    common = ["--short-side", "48", "--workers", "1"]
    assert prepare_cli.main([str(src), str(root / "packs"), *common, "--shards", "0.02"]) == 0
    assert prepare_cli.main([str(src), str(root / "frames"), *common, "--mode", "frames"]) == 0
    assert len(list((root / "packs" / "shards").glob("chunk-*.bin"))) >= 3
    return root


def _split(sources, name, url=None):
    if name == "list":
        return resolve_split(data=sources / "videos", train_list=sources / "train.txt", val_list=sources / "val.txt",
                             classes=sources / "classes.txt")
    data = {"videos": sources / "videos", "frames": sources / "frames", "packs": sources / "packs",
            "packs_decode_cpu": sources / "packs", "shards": sources / "packs" / "shards", "s3": url}[name]
    return resolve_split(data=data, val_fraction=0.25)


def _decoded(batch) -> torch.Tensor:
    clip = batch["clip"]
    return clip.decode() if hasattr(clip, "decode") else clip   # --decode-device cpu: decoded per batch


def _epoch(split, *, world: int, rank: int, decode_device, monkeypatch, reader_options=None) -> dict:
    """This rank's items of epoch EPOCH through the trainer's loaders (2 DataLoader workers, forked
    under this rank's environment): {"train": {index: item}, "val": {index: item}}."""
    from tsm_ds.engine.loop.loaders import build_loaders

    for k, v in dict(WORLD_SIZE=world, RANK=rank, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=world, GLOBAL_RANK=rank).items():
        monkeypatch.setenv(k, str(v))
    shards._READERS.clear()   # this process's readers are built again under this rank's environment
    train_set, val_set = build_datasets(split, num_segments=T, img_size=SIZE, seed=SEED, decode_device=decode_device,
                                        reader_options=reader_options)
    sampler, gen, loader, val_loader = build_loaders(train_set, val_set, micro=1, world=world, rank=rank, seed=SEED,
                                                     num_workers=2)
    sampler.set_epoch(EPOCH)
    train_set.set_epoch(EPOCH)
    gen.manual_seed(SEED * 100_003 + EPOCH)   # as the trainer does per epoch
    out = {"train": {}, "val": {}}
    for side, ld, ds in (("train", loader, train_set), ("val", val_loader, val_set)):
        if side == "val":
            ds.set_epoch(0)   # validation's views are epoch 0's (engine.evaluate.validate)
        for b in ld:
            for j, i in enumerate(b["index"].tolist()):
                out[side][i] = {"clip": _decoded(b)[j], "label": int(b["label"][j]), "bad": int(b["bad"][j]),
                                "bad_files": b["bad_files"][j]}
    out["sizes"] = {"train": len(train_set), "val": len(val_set)}
    return out


@pytest.fixture()
def s3_url(sources, tmp_path, moto_s3):
    """(the URL on moto's server, the datasets' options: the shard cache in the test's folder)."""
    return moto_s3(sources / "packs" / "shards", "shards"), ReaderOptions(shard_cache=str(tmp_path / "cache"),
                                                                          shard_cache_mb=100)


@pytest.mark.parametrize("name", ["videos", "list", "frames", "packs", "packs_decode_cpu", "shards", "s3"])
def test_every_rank_reads_every_sample_as_world_one_does(sources, name, request, monkeypatch):
    url, opts = request.getfixturevalue("s3_url") if name == "s3" else (None, None)
    split = _split(sources, name, url)
    assert split.class_names == list(CLASSES) and len(split.train) == 9 and len(split.val) == 3
    dd = "cpu" if name == "packs_decode_cpu" else None
    ref = _epoch(split, world=1, rank=0, decode_device=dd, monkeypatch=monkeypatch, reader_options=opts)
    for side in ("train", "val"):
        assert sorted(ref[side]) == list(range(ref["sizes"][side]))
        assert all(it["bad"] == 0 and it["bad_files"] == "" for it in ref[side].values()), (name, side)
    for world in (2, 4):
        seen = {"train": set(), "val": set()}
        for rank in range(world):
            got = _epoch(split, world=world, rank=rank, decode_device=dd, monkeypatch=monkeypatch, reader_options=opts)
            for side in ("train", "val"):
                per_rank = -(-ref["sizes"][side] // world)   # DistributedSampler's share, padding included
                assert 1 <= len(got[side]) <= per_rank
                for i, it in got[side].items():
                    want = ref[side][i]
                    assert it["bad"] == 0 and it["bad_files"] == "", (name, world, rank, side, i, it["bad_files"])
                    assert it["label"] == want["label"], (name, world, rank, side, i)
                    assert torch.equal(it["clip"], want["clip"]), (name, world, rank, side, i)
                seen[side] |= set(got[side])
        assert seen == {s: set(range(ref["sizes"][s])) for s in seen}, (name, world)   # the union is the epoch


def test_shard_reader_under_world_size_four_reads_the_last_sample(sources, monkeypatch):
    """The defect itself: a reader made under WORLD_SIZE=4 (litdata's view holds 1/4 of the
    frames) reads the last frame of the last video, byte-equal to the reader made at world 1."""
    root = str(sources / "packs" / "shards")
    last = max(shards.ShardReader(root).index.items(), key=lambda kv: kv[1][1])
    key, (v, first, n, _, _) = last
    want = shards.ShardReader(root).frame(key, v, first, n - 1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    reader = shards.ShardReader(root)
    assert len(reader._ds) < first + n   # litdata's distributed view: fewer samples than exist
    assert reader.frame(key, v, first, n - 1) == want
    doc = json.loads((sources / "packs" / "shards" / shards.SAMPLES_FILE).read_text())
    assert first + n == sum(r[3] for r in doc["samples"])   # it was the very last sample
