"""Shards vs per-file packs (issue 30): clips/s and opens / requests per clip, cache size and hit rate.

    python studies/shards_bench.py PACKS     # PACKS: a `tsm-ds prepare SRC PACKS --shards MB` output

Reads every clip of PACKS for 3 epochs (train items, 8 segments, 112 px, one process, in order of the
shuffled indices) from: the .jpack files, the local shard folder, and the same shards served by
moto's S3 server on 127.0.0.1 (whole chunks into the cache). Prints a markdown table.
Not part of the product (run by hand).
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch


def main(packs: Path) -> None:
    from tsm_ds.data import shards
    from tsm_ds.data.splits import build_datasets, resolve_split

    torch.set_num_threads(1)
    epochs = 3

    def run(data, val_fraction=0.0):
        sp = resolve_split(data=data, val_fraction=val_fraction)
        ds, _ = build_datasets(sp, num_segments=8, img_size=112, seed=0)
        n = 0
        t = time.perf_counter()
        for e in range(epochs):
            ds.set_epoch(e)
            for i in torch.randperm(len(ds), generator=torch.Generator().manual_seed(e)).tolist():
                ds[i]
                n += 1
        return n / (time.perf_counter() - t), n

    rows = []
    cps, n = run(packs)
    rows.append(["per-file .jpack", f"{cps:.1f}", "1 open", "-", "-"])
    chunks = len(list((packs / "shards").glob("chunk-*.bin")))
    cps, n = run(packs / "shards")
    rows.append(["local shard folder", f"{cps:.1f}", f"{chunks} shard files mapped by the reader / {n} clips", "-", "-"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = packs.parent / "moto_bench.log"
    os.environ.update(AWS_ACCESS_KEY_ID="t", AWS_SECRET_ACCESS_KEY="t", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    with open(log, "w") as f:
        srv = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=f, stderr=subprocess.STDOUT)
    try:
        import boto3
        for _ in range(200):
            try:
                c = boto3.client("s3")
                c.list_buckets()
                break
            except Exception:
                time.sleep(0.05)
        c.create_bucket(Bucket="bench")
        for p in (packs / "shards").iterdir():
            c.upload_file(str(p), "bench", f"s/{p.name}")
        cache = packs.parent / "bench_cache"
        for cache_mb in (1000,):
            shards.set_shard_cache(str(cache), cache_mb)
            mark = len(log.read_text().splitlines())
            cps, n = run("s3://bench/s")
            lines = log.read_text().splitlines()[mark:]
            gets = sum(1 for ln in lines if "GET /bench/s/" in ln)
            chunk_gets = sum(1 for ln in lines if "GET /bench/s/chunk-" in ln)
            size = sum(p.stat().st_size for p in cache.rglob("chunk-*.bin"))
            rows.append([f"S3 (moto, 127.0.0.1), cache bound {cache_mb} MiB", f"{cps:.1f}",
                         f"{gets / n:.3f} GET ({gets} for {n} clips; {chunk_gets} chunk GETs)",
                         f"{size / 2**20:.1f} MiB", f"{1 - chunk_gets / n:.1%}"])
    finally:
        srv.terminate()
    print(f"{n} clip reads ({n // epochs} clips x {epochs} epochs), {chunks} shards")
    print("| source | clips/s | opens / requests per clip | cache size | cache hit rate |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
