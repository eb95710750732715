"""Step time per multigrid shape against the ideal (clips x frames x pixels), the loader's share included.

The shapes are those of the default long cycle of :func:`tsm_ds.engine.loop.multigrid.build_schedule`
(T/4, T/2, T/2, T frames at crops S/sqrt 2 (rounded to 8 px), S/sqrt 2, S, S with the global batch x8,
x4, x2, x1) and the short cycle's extra crops at the base shape (S/2 x4, S/sqrt 2 x2), at a small base
batch. For each shape, interleaved over ``--reps`` rounds after a warm-up, on one thread:

- model: one training step of the TSM model built for T at the base shape (it takes T from the batch):
  forward, cross-entropy, backward and an SGD step (momentum 0.9) on uint8 clips normalised as the
  trainer does, clips (N, T, 3, crop, crop);
- loader: the step's N items cut at (T, crop) by ``VideoClipDataset`` (``ds[(index, T, crop)]``,
  train mode, packs of the real clips: what one DataLoader worker does for the batch).

Prints a markdown table: medians in ms, each shape's cost relative to the base step (ideal: 1.00
everywhere) and the loader's share of loader + model. The clips are packed once into ``--packs``
(``tsm-ds prepare``'s pack format, short side 256) from ``--videos`` (class folders; default the
shared real clips).

    python studies/multigrid_shapes_bench.py [--arch resnet18] [--frames 8] [--crop 112] [--batch 2] [--reps 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.prepare import pack_video
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.transforms import normalize_batch
from tsm_ds.engine.loop.multigrid import build_schedule
from tsm_ds.models import build_model

ROOT = Path(__file__).resolve().parents[1]


def packed_records(videos: Path, packs: Path) -> list[VideoRecord]:
    """One pack per readable video of ``videos/<class>/*`` (packed once, kept in ``packs``)."""
    classes = sorted(p.name for p in videos.iterdir() if p.is_dir())
    recs = []
    for label, c in enumerate(classes):
        for src in sorted((videos / c).iterdir()):
            dst = packs / c / (src.stem + ".jpack")
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    pack_video(str(src), str(dst))
                except Exception as e:   # an unreadable file is left out of the bench
                    print(f"skipped {src}: {e}")
                    continue
            recs.append(VideoRecord(str(dst), label))
    return recs


def shapes(frames: int, crop: int, batch: int) -> list[tuple[str, int, int, int]]:
    """(name, T, crop, clips) of the long cycle's shapes and the short cycle's extra crops at the base."""
    s = build_schedule(frames=frames, crop=crop, global_batch=batch, epochs=100, lr_steps=[50], mode="long+short")
    first = [st for st in s.stages if st.long_cycle is not None and st.lr_stage == 0]   # one per long-cycle shape
    long = [st.shapes[-1] for st in first]
    short = first[-1].shapes[:-1]
    out = [(f"long {i}", sh.frames, sh.crop, sh.global_batch) for i, sh in enumerate(long)]
    return out + [(f"short {i}", sh.frames, sh.crop, sh.global_batch) for i, sh in enumerate(short)]


def cpu_name() -> str:
    """The CPU's model name and the cores this process may use (Linux), else the platform's word."""
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--frames", type=int, default=8, help="base T")
    ap.add_argument("--crop", type=int, default=112, help="base crop side S")
    ap.add_argument("--batch", type=int, default=2, help="base clips per step")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--videos", default=str(ROOT.parent / "shared" / "data" / "videos"))
    ap.add_argument("--packs", default="/tmp/tsm_ds_multigrid_bench_packs")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    recs = packed_records(Path(a.videos), Path(a.packs))
    ds = VideoClipDataset(recs, num_segments=a.frames, mode="train", img_size=a.crop, seed=0)
    torch.manual_seed(0)
    model = build_model(a.arch, 400, num_segments=a.frames).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rows = shapes(a.frames, a.crop, a.batch)
    data = {name: torch.randint(0, 256, (n, t, 3, c, c), dtype=torch.uint8) for name, t, c, n in rows}
    labels = {name: torch.randint(0, 400, (n,)) for name, t, c, n in rows}
    times: dict[str, dict[str, list[float]]] = {name: {"model": [], "loader": []} for name, *_ in rows}
    cursor = 0

    def step(name: str) -> float:
        t0 = time.perf_counter()
        x = normalize_batch(data[name], *ds.normalization)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), labels[name]).backward()
        opt.step()
        return time.perf_counter() - t0

    def load(t: int, c: int, n: int) -> float:
        nonlocal cursor
        t0 = time.perf_counter()
        clips = [ds[((cursor + k) % len(ds), t, c)]["clip"] for k in range(n)]
        cursor += n
        assert clips[0].shape == (t, 3, c, c)
        return time.perf_counter() - t0

    for name, t, c, n in rows:   # warm-up: allocator, frame indexes, page cache
        step(name)
        load(t, c, n)
    for _ in range(a.reps):
        for name, t, c, n in rows:
            times[name]["model"].append(step(name))
            times[name]["loader"].append(load(t, c, n))
    med = {name: {k: statistics.median(v) for k, v in d.items()} for name, d in times.items()}
    base_name = rows[3][0]
    base = {k: med[base_name][k] for k in ("model", "loader")}
    base_cost = a.batch * a.frames * a.crop ** 2
    print(f"{date.today()}, {cpu_name()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread, {a.arch}, base T={a.frames} {a.crop} px {a.batch} clips a step, "
          f"{len(recs)} packed real clips, median of {a.reps} interleaved rounds")
    print()
    print("| shape | T | crop | clips | ideal cost | model ms | model / base | loader ms | loader / base "
          "| loader share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t, c, n in rows:
        m, ld = med[name]["model"], med[name]["loader"]
        print(f"| {name} | {t} | {c} | {n} | {n * t * c * c / base_cost:.2f} | {1e3 * m:.0f} | {m / base['model']:.2f} "
              f"| {1e3 * ld:.0f} | {ld / base['loader']:.2f} | {ld / (ld + m):.0%} |")


if __name__ == "__main__":
    main()
