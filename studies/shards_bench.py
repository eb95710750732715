"""Shards vs per-file packs (issue 30): clips/s, opens / requests per clip, cache size and hit rate.

    python studies/shards_bench.py PACKS [--rounds 5] [--box 80]
    # PACKS: a `tsm-ds prepare SRC PACKS --shards MB` output (default short side 256)

Train items as training reads them (T=8 segments, 224 px crops, ``VideoClipDataset`` mode "train",
one torch thread), from three sources of the same clips: the ``.jpack`` files, the local shard folder
``PACKS/shards``, and the same shards served by moto's S3 server on 127.0.0.1 (chunks fetched whole
into a cache bounded at 1000 MiB, a fresh cache per phase so the first fetches are counted).

- DataLoader phase: ``tsm_ds.bench.data_formats.loader_rates_interleaved``: one 1-worker DataLoader
  per source (batches of 4), 2 untimed warm-up batches, then ``--rounds`` rounds of one time box per
  source (at least ``--box`` clips) in a rotating order; median clips/s of the rounds.
- In-process phase: the same items read with ``ds[i]`` in this process, after one untimed warm-up
  item per source, interleaved the same way (``--box`` items a box); here the shard reader's counters
  give litdata samples (frames) read per clip, and the moto log the GETs per clip.
- Layout check (why one litdata sample per frame): per clip, the 8 kept frames read and decoded
  from (a) per-frame samples (``ShardVideo``), (b) one sample per whole pack (the first layout;
  ``PackedVideo.from_bytes`` on ``StreamingDataset[i]``) with litdata's default decode window and
  with ``batch_decode=0``, (c) the ``.jpack`` file; in-process, same frame indices.

Prints markdown tables. Not part of the product (run by hand; about 3 minutes on 2 shared cores).
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _moto(log: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(AWS_ACCESS_KEY_ID="t", AWS_SECRET_ACCESS_KEY="t", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    with open(log, "w") as f:
        srv = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=f, stderr=subprocess.STDOUT)
    import boto3

    for _ in range(400):
        try:
            c = boto3.client("s3")
            c.list_buckets()
            return srv, c
        except Exception:
            time.sleep(0.05)
    srv.terminate()
    raise RuntimeError("moto did not start")


def _gets(log: Path, mark: int) -> tuple[int, int, int]:
    lines = log.read_text().splitlines()
    new = lines[mark:]
    return (sum(1 for ln in new if "GET /bench/" in ln), sum(1 for ln in new if "GET /bench/s/chunk-" in ln),
            len(lines))


def _cache_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("chunk-*.bin"))


def in_process(sources: dict, rounds: int, box: int) -> dict:
    """{source: (clips/s median over rounds, clips)}: ``ds[i]`` in this process, interleaved boxes."""
    from tsm_ds.bench.data_formats import _train_ds

    dss = {k: _train_ds(recs, 20_000) for k, recs in sources.items()}
    pos = dict.fromkeys(sources, 0)
    for k, ds in dss.items():   # warm-up: reader set-up, first chunk
        ds[0]
        pos[k] = 1
    rates = {k: [] for k in sources}
    order = list(sources)
    for r in range(rounds):
        for k in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            for i in range(pos[k], pos[k] + box):
                dss[k][i]
            rates[k].append(box / (time.perf_counter() - t))
            pos[k] += box
    return {k: (statistics.median(v), rounds * box) for k, v in rates.items()}


def layouts(packs: Path, recs_packs, recs_local, n_clips: int) -> list[list[str]]:
    """ms per clip to read + decode the 8 kept frames of a train clip, by layout (in-process)."""
    from litdata import StreamingDataset
    from litdata.streaming.writer import BinaryWriter

    from tsm_ds.data import shards
    from tsm_ds.data.sampling import clip_indices
    from tsm_ds.data.video import PackedVideo

    tmp = Path(tempfile.mkdtemp(prefix="whole_pack_"))
    try:
        w = BinaryWriter(str(tmp), chunk_bytes=int(64e6))
        for i, r in enumerate(recs_packs):
            w.add_item(i, {"key": r.path, "label": int(r.label), "jpack": Path(r.path).read_bytes()})
        w.done()
        w.merge(1)
        whole = {"auto": StreamingDataset(str(tmp), batch_decode="auto"),
                 "0": StreamingDataset(str(tmp), batch_decode=0)}
        reader = shards.get_reader(str(packs / "shards"))
        n = len(recs_packs)
        counts = [PackedVideo(r.path).num_frames for r in recs_packs]
        jobs = [(j % n, clip_indices(counts[j % n], 8, mode="train", rng=np.random.default_rng(j)).reshape(-1))
                for j in range(n_clips)]

        def per_file(v, idx):
            with PackedVideo(recs_packs[v].path) as pv:
                return pv.decode(idx, short_side=224)

        def per_frame(v, idx):
            with reader.video(shards.split_shard_path(recs_local[v].path)[1]) as sv:
                return sv.decode(idx, short_side=224)

        def whole_pack(mode):
            def f(v, idx):
                return PackedVideo.from_bytes(bytes(whole[mode][v]["jpack"]), "x").decode(idx, short_side=224)
            return f

        ways = {"per-file .jpack (8 frames read)": per_file,
                "shards, one litdata sample per frame (8 read)": per_frame,
                "shards, one sample per whole pack, batch_decode=0": whole_pack("0"),
                "shards, one sample per whole pack, litdata default window": whole_pack("auto")}
        ref = [per_file(v, idx) for v, idx in jobs[:n]]
        for name, fn in ways.items():   # same pixels every way; warm-up
            assert all(np.array_equal(fn(v, idx), x) for (v, idx), x in zip(jobs[:n], ref)), name
        times = {k: [] for k in ways}
        for rep in range(3):
            for k in list(ways)[rep % 4:] + list(ways)[:rep % 4]:
                t = time.perf_counter()
                for v, idx in jobs:
                    ways[k](v, idx)
                times[k].append((time.perf_counter() - t) / len(jobs) * 1e3)
        mb = sum(Path(r.path).stat().st_size for r in recs_packs) / n / 1e6
        return [[k, f"{statistics.median(v):.2f}"] for k, v in times.items()] + [["(mean pack size)", f"{mb:.2f} MB"]]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("packs", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--box", type=int, default=80, help="clips per time box (DataLoader: at least)")
    a = ap.parse_args()
    packs = a.packs.resolve()
    from tsm_ds.bench.data_formats import loader_rates_interleaved
    from tsm_ds.data import shards
    from tsm_ds.data.splits import resolve_split

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="shards_bench_"))
    log = work / "moto.log"
    srv, c = _moto(log)
    try:
        c.create_bucket(Bucket="bench")
        sh = packs / "shards"
        for p in sh.iterdir():
            c.upload_file(str(p), "bench", f"s/{p.name}")
        recs = {"per-file .jpack": resolve_split(data=packs, val_fraction=0.0).train,
                "local shard folder": resolve_split(data=sh, val_fraction=0.0).train,
                "S3 (moto, 127.0.0.1)": resolve_split(data="s3://bench/s", val_fraction=0.0).train}
        chunks = sorted(sh.glob("chunk-*.bin"))
        frames = sum(r[3] for r in shards._read_doc(str(sh))[0])
        print(f"{len(recs['per-file .jpack'])} clips, {frames} frames, {len(chunks)} shards of "
              f"{sum(p.stat().st_size for p in chunks) / 1e6:.1f} MB in all; T=8, 224 px train items")

        rows = []
        # in-process
        shards.set_shard_cache(str(work / "cache_inproc"), 1000)
        mark = _gets(log, 0)[2]
        r_in = in_process(recs, a.rounds, a.box)
        local = shards.get_reader(str(sh))
        s3r = shards.get_reader("s3://bench/s")
        gets, chunk_gets, mark = _gets(log, mark)
        n_s3 = a.rounds * a.box + 1
        rows.append(["in-process", "per-file .jpack", r_in["per-file .jpack"], "1 open of the .jpack", "-", "-"])
        rows.append(["in-process", "local shard folder", r_in["local shard folder"],
                     f"{local.samples / local.reads:.2f} frames read (litdata samples); {len(chunks)} chunk files "
                     f"mapped for {local.reads} clips", "-", "-"])
        rows.append(["in-process", "S3 (moto, 127.0.0.1)", r_in["S3 (moto, 127.0.0.1)"],
                     f"{gets / n_s3:.3f} GET ({gets} for {n_s3} clips: {chunk_gets} chunk GETs + index / samples)",
                     f"{_cache_bytes(work / 'cache_inproc') / 2**20:.1f} MiB",
                     f"{1 - chunk_gets / s3r.samples:.2%} of {s3r.samples} frame reads"])
        # one DataLoader worker each
        shards.set_shard_cache(str(work / "cache_worker"), 1000)
        r_dl = loader_rates_interleaved(recs, reps=a.rounds, budget_s=0.0, min_batches=a.box // 4, batch=4)
        gets, chunk_gets, mark = _gets(log, mark)
        n_dl = r_dl["S3 (moto, 127.0.0.1)"]["clips"]
        for k, v in r_dl.items():
            rows.append(["1 DataLoader worker", k, (v["clips_per_s"], v["clips"]),
                         (f"{gets / n_dl:.3f} GET ({gets} while {n_dl} clips were timed, warm-up and prefetch "
                          f"included: {chunk_gets} chunk GETs)") if k.startswith("S3") else "as in-process",
                         f"{_cache_bytes(work / 'cache_worker') / 2**20:.1f} MiB" if k.startswith("S3") else "-",
                         f"{1 - chunk_gets / (n_dl * s3r.samples / s3r.reads):.2%} (frames estimated from the "
                         "in-process frames per clip)" if k.startswith("S3") else "-"])
        print()
        print("| loader | source | clips/s (median of rounds) | clips timed | opens / requests per clip | cache size | "
              "cache hit rate |")
        print("|---|---|---|---|---|---|---|")
        for ld, src, (cps, n), req, size, hit in rows:
            print(f"| {ld} | {src} | {cps:.1f} | {n} | {req} | {size} | {hit} |")
        print()
        print("| layout (in-process, 8 kept frames of a train clip read + decoded at short side 224) | ms per clip |")
        print("|---|---|")
        for k, v in layouts(packs, recs["per-file .jpack"], recs["local shard folder"],
                            4 * len(recs["per-file .jpack"])):
            print(f"| {k} | {v} |")
    finally:
        srv.terminate()
        srv.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
