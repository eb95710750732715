"""Does ghost BatchNorm make CPU steps cheaper? One training step of 16 clips, forward + backward:
(a) two micro-batches of 8 clips with gradient accumulation, (b) one micro-batch of 16 clips with
BatchNorm over groups of 8 (``use_ghost_bn``), (c) one micro-batch of 16 with plain BatchNorm (the
statistics the paper does not use). Interleaved repetitions, medians; ratios printed side by side.

    python studies/ghost_bn_bench.py [--arch resnet18] [--size 112] [--segments 8] [--reps 7]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from tsm_ds.models import build_model
from tsm_ds.models.large_batch import use_ghost_bn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--clips", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    plain = build_model(a.arch, 400, num_segments=a.segments).train()
    ghost = copy.deepcopy(plain)
    use_ghost_bn(ghost, a.group)
    x = torch.randn(a.clips, a.segments, 3, a.size, a.size)
    y = torch.randint(0, 400, (a.clips,))

    def accumulate():
        for part_x, part_y in zip(x.split(a.group), y.split(a.group)):
            (F.cross_entropy(plain(part_x), part_y) * part_x.shape[0] / a.clips).backward()

    def one(model):
        return lambda: F.cross_entropy(model(x), y).backward()
    cases = {f"accumulate {a.clips // a.group} x {a.group}": accumulate, f"ghost BN {a.clips} / {a.group}": one(ghost),
             f"plain BN {a.clips}": one(plain)}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for f in cases.values():   # warm-up
        f()
    for _ in range(a.reps):
        for k, f in cases.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    ref = statistics.median(times[next(iter(cases))])
    print(f"{a.arch} T={a.segments} {a.size}px, {a.clips} clips a step, {torch.get_num_threads()} threads, "
          f"median of {a.reps}:")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:24s} {1e3 * m:8.1f} ms   x{ref / m:.2f} vs accumulation")


if __name__ == "__main__":
    main()
