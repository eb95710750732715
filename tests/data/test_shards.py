"""Shards (issue 30): packs written into litdata chunks and read back by index, locally and from an
S3-compatible server (moto) on 127.0.0.1, give the per-file packs' items; our sampler drives them."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("litdata")

from tsm_ds.data import shards  # noqa: E402
from tsm_ds.data.options import ReaderOptions
from tsm_ds.data.splits import build_datasets, resolve_split  # noqa: E402
from tsm_ds.data.video import write_packed  # noqa: E402

CLASSES = ("a", "b", "c")


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """3 classes x 3 small packs (12 frames of 40x48, each frame its own grey level), and their
    frames in shards of 20 kB (several shards) in OUT/shards."""
    out = tmp_path_factory.mktemp("packs")
    rows = []
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        for v in range(3):
            rel = f"{name}/v{v}.jpack"
            (out / name).mkdir(exist_ok=True)
            frames = [np.full((40, 48, 3), int(x), np.uint8) + rng.integers(0, 20, (40, 48, 3), dtype=np.uint8)
                      for x in rng.integers(0, 200, 12)]
            write_packed(out / rel, frames)
            rows.append((rel, c))
    info = shards.write_shards(out, rows, out / "shards", shard_mb=0.02, classes=list(CLASSES))
    assert info["samples"] == 9 and info["frames"] == 9 * 12 and info["shards"] >= 3
    return out


def _items(ds, epoch=1):
    ds.set_epoch(epoch)
    return [ds[i] for i in range(len(ds))]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x["clip"], y["clip"]) and x["label"] == y["label"] and x["index"] == y["index"]


def test_shard_items_equal_per_file_items(packs):
    per_file, sharded = resolve_split(data=packs), resolve_split(data=packs / "shards")
    assert (per_file.kind, sharded.kind) == ("holdout", "shards")   # the shard folder is no class folder
    assert per_file.class_names == sharded.class_names == list(CLASSES)
    assert [os.path.relpath(r.path, packs) for r in per_file.train] == \
           [shards.split_shard_path(r.path)[1] for r in sharded.train]
    for dd in (None, "cpu"):
        a = build_datasets(per_file, num_segments=3, img_size=24, seed=7, decode_device=dd)
        b = build_datasets(sharded, num_segments=3, img_size=24, seed=7, decode_device=dd)
        for x, y in zip(a, b):
            if dd is None:
                _same(_items(x), _items(y))
            else:   # PackedClip: the same JPEG bytes and crop boxes
                for p, q in zip(_items(x), _items(y)):
                    assert p["clip"].frames == q["clip"].frames and p["clip"].boxes == q["clip"].boxes


def test_bad_sample_replaced_and_named(packs, tmp_path):
    """A frame damaged inside a chunk (no JPEG SOI marker) is replaced like a bad video and named
    <shard folder>!/<pack path>; a damaged pack is refused when the shards are written."""
    import shutil

    from tsm_ds.data.video import PackedVideo, VideoDecodeError

    shutil.copytree(packs / "shards", tmp_path / "shards")
    with PackedVideo(packs / "b/v1.jpack") as pv:
        frames = pv.read_encoded(range(pv.num_frames))
    hit = 0
    for chunk in (tmp_path / "shards").glob("chunk-*.bin"):
        data = bytearray(chunk.read_bytes())
        for jpeg in frames.values():
            at = data.find(jpeg)
            if at >= 0:
                data[at:at + 2] = b"\x00\x00"
                hit += 1
        chunk.write_bytes(bytes(data))
    assert hit == len(frames)
    sp = resolve_split(data=tmp_path / "shards", val_fraction=0.0)
    ds, _ = build_datasets(sp, num_segments=2, img_size=24, seed=1)
    ds.warn_bad_files = False
    i = [shards.split_shard_path(r.path)[1] for r in ds.records].index("b/v1.jpack")
    item = ds[i]
    assert item["bad"] == 1
    (path, reason), = json.loads(item["bad_files"])
    assert path == f"{tmp_path / 'shards'}{shards.SHARD_SEP}b/v1.jpack" and "not a whole JPEG" in reason
    assert torch.equal(item["clip"], ds[i]["clip"])   # replaced deterministically

    rows = [(f"{c}/v{v}.jpack", i) for i, c in enumerate(CLASSES) for v in range(3)]
    bad = tmp_path / "src"
    shutil.copytree(packs, bad, ignore=shutil.ignore_patterns("shards"))
    (bad / "b/v1.jpack").write_bytes((bad / "b/v1.jpack").read_bytes()[:-100])
    with pytest.raises(VideoDecodeError, match="v1.jpack.*truncated"):
        shards.write_shards(bad, rows, tmp_path / "s2", shard_mb=0.02, classes=list(CLASSES))
    assert not (tmp_path / "s2" / shards.SAMPLES_FILE).exists()


def test_items_read_only_the_kept_frames(packs):
    """One litdata sample per frame: a T=3 train item reads at most 3 samples (not the whole video)."""
    sp = resolve_split(data=packs / "shards", val_fraction=0.0)
    ds, _ = build_datasets(sp, num_segments=3, img_size=24, seed=2)
    reader = shards.get_reader(str(packs / "shards"))
    before = reader.samples
    ds.set_epoch(0)
    for i in range(len(ds)):
        ds[i]
    assert 0 < reader.samples - before <= 3 * len(ds)
    rows, _ = shards._read_doc(str(packs / "shards"))
    assert sum(r[3] for r in rows) == 9 * 12 and [r[2] for r in rows] == [12 * v for v in range(9)]


def test_litdata_private_switch_still_there():
    """The one private litdata attribute tsm_ds sets (shards._litdata_plain_http_s3): fails loudly
    when a litdata upgrade removes it, so the plain-http S3 path is re-checked."""
    import litdata
    import litdata.streaming.downloader as dl

    assert hasattr(dl, "_OBSTORE_AVAILABLE"), (
        f"litdata {litdata.__version__} has no downloader._OBSTORE_AVAILABLE: re-check "
        "tsm_ds.data.shards._litdata_plain_http_s3 (written for litdata 0.2.76)")
    old = dl._OBSTORE_AVAILABLE
    try:
        shards._litdata_plain_http_s3()
        assert not dl._OBSTORE_AVAILABLE
    finally:
        dl._OBSTORE_AVAILABLE = old


def test_index_with_other_serializers_refused(packs, tmp_path):
    import shutil

    shutil.copytree(packs / "shards", tmp_path / "s")
    idx = json.loads((tmp_path / "s" / "index.json").read_text())
    idx["config"]["data_format"] = ["int", "int", "pickle"]
    (tmp_path / "s" / "index.json").write_text(json.dumps(idx))
    with pytest.raises(ValueError, match="nothing else is unpickled"):
        shards.ShardReader(str(tmp_path / "s"))
    with pytest.raises(ValueError, match="nothing else is unpickled"):   # at start-up, in the main process
        shards.shard_records(str(tmp_path / "s"))


def test_sampler_drives_the_shard_reader_clip_count_and_resume(packs):
    """Which samples the shard reader serves is what ResumableDistributedSampler decides: per epoch
    each index at most once over 2 ranks except the padding (< world size), and resuming mid-epoch
    at world size 1 reads exactly the remaining indices of the uninterrupted 2-rank epoch."""
    from tsm_ds.engine.loop.loaders import ResumableDistributedSampler

    sp = resolve_split(data=packs / "shards", val_fraction=0.0)
    ds, _ = build_datasets(sp, num_segments=2, img_size=24, seed=3)
    ds.set_epoch(2)
    n, world = len(ds), 2

    def order(rank, world, skip=0):
        s = ResumableDistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=3)
        s.set_epoch(2)
        s.skip = skip
        return list(s)

    ranks = [order(r, world) for r in range(world)]
    flat = [i for r in ranks for i in r]
    counts = np.bincount(flat, minlength=n)
    assert counts.min() >= 1 and (counts > 1).sum() == world * len(ranks[0]) - n < world
    reader = shards.get_reader(str(packs / "shards"))
    before, frames = reader.reads, reader.samples
    keys = [shards.split_shard_path(ds.records[i].path)[1] for i in ranks[0][:3]]
    got = [ds[i]["index"] for i in ranks[0][:3]]
    assert got == ranks[0][:3] and reader.reads - before == 3 and len(set(keys)) == 3
    assert 3 <= reader.samples - frames <= 3 * 2   # 2 segments: at most 2 frames a video
    # resume after 2 micro-steps per rank of world 2, at world 1: the rest of the interleaved order
    done = 2
    whole = [ranks[k % world][k // world] for k in range(world * len(ranks[0]))]
    rest = order(0, 1, skip=done * world)
    assert rest == whole[done * world:n]   # the permutation's rest, without world 2's padding
    assert sorted(set(rest) | set(whole[:done * world])) == list(range(n))


@pytest.fixture()
def s3(packs, tmp_path, moto_s3):
    """The shards at s3://data/shards on moto's server (conftest ``moto_s3``): the URL, the server's
    request log and the datasets' options (the shard cache in the test's folder)."""
    url = moto_s3(packs / "shards", "shards")
    return url, tmp_path / "moto.log", ReaderOptions(shard_cache=str(tmp_path / "cache"), shard_cache_mb=1000)


def test_items_from_s3_server_equal_per_file(packs, s3, tmp_path):
    url, log, opts = s3
    sp = resolve_split(data=url)
    assert sp.kind == "shards" and sp.data == url
    a = build_datasets(resolve_split(data=packs), num_segments=3, img_size=24, seed=7)
    b = build_datasets(sp, num_segments=3, img_size=24, seed=7, reader_options=opts)
    for x, y in zip(a, b):
        _same(_items(x), _items(y))
    cached = [p for p in (tmp_path / "cache").rglob("chunk-*.bin")]
    assert cached   # the chunks were fetched into the bounded cache
    chunk_gets = sum(1 for ln in log.read_text().splitlines() if "GET /data/shards/chunk-" in ln
                     or ("GET" in ln and "chunk-" in ln))
    assert chunk_gets <= len(list((packs / "shards").glob("chunk-*.bin")))   # each chunk fetched once


def test_prepare_shards_flag_errors(tmp_path, capsys):
    from tsm_ds.cli import prepare as prepare_cli

    assert prepare_cli.main([str(tmp_path), str(tmp_path / "o"), "--mode", "video", "--shards", "64"]) == 2
    assert "--mode packed" in capsys.readouterr().err
    assert prepare_cli.main([str(tmp_path), str(tmp_path / "o"), "--shards", "0"]) == 2
