"""Issue 27's before/after: training items per core from every format, this checkout against an
older one (default 52ba896, the commit before issue 27), on the same inputs.

Run by hand (not installed, not a test)::

    .venv/bin/python studies/feed_gpus_bench.py [--before 52ba896] [--data ../shared/data/videos]
                                                [--rounds 3] [--items 40] [--out bench_out/feed_gpus]

Inputs: the real clips (a class-folder tree) and two generated Kinetics-like clips (10 s, 30 fps,
GOP 250, 640x360 and 1280x720: ``tsm_ds.bench.data_formats.make_kinetics_like``). Each checkout
prepares them with its own ``tsm-ds prepare`` (short side 256; video: ``--keyint 16`` with its own
encoder defaults; frames; packed where it exists) and reads them with its own
``VideoClipDataset(mode="train", num_segments=8, img_size=224)``: items ``ds[i]`` in a fresh
process with one torch thread, timed in this thread's CPU time (``time.thread_time``), so the
number is what one core delivers and a shared machine's load does not lower it (the issue's
"one core, one thread" measure). The old checkout's items are normalised floats (its item path);
this checkout's are uint8 (normalisation moved to the batch on the device), as each version trains.
Rounds interleave every (checkout, format, input) in a rotating order; the table shows medians and
ratios to the old checkout's JPEG folders and video rows.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, sys, time, warnings, torch
torch.set_num_threads(1)
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import read_video_list
recs = read_video_list(sys.argv[1])
n = int(sys.argv[2])
recs = (recs * (n // len(recs) + 2))[:n + 2]
ds = VideoClipDataset(recs, mode="train", num_segments=8, img_size=224, seed=0)
warnings.simplefilter("ignore")
ds[0]; ds[1]                     # first opens, indexes
t = time.thread_time()
for i in range(2, n + 2):
    ds[i]
cpu = time.thread_time() - t
print(json.dumps({"items_per_cpu_s": n / cpu}))
"""


def _run(py: str, src: Path, args: list[str], timeout: int = 3600) -> str:
    env = dict(os.environ, PYTHONPATH=str(src), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    p = subprocess.run([py, *args], cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode not in (0, 1):   # prepare exits 1 when a file failed (reported)
        raise RuntimeError(f"{args[:4]} in {src}: {p.stderr[-2000:]}")
    return p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="52ba896")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "videos"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--out", default=str(REPO / "bench_out" / "feed_gpus"))
    a = ap.parse_args()
    py = sys.executable
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="feed_gpus_", dir=out))
    old = work / "before"
    old.mkdir()
    subprocess.run(f"git -C {REPO} archive {a.before} | tar -x -C {old}", shell=True, check=True)

    # inputs: real clips + generated Kinetics-like clips
    sys.path.insert(0, str(REPO))
    from tsm_ds.bench.data_formats import make_kinetics_like

    gen = work / "generated"
    inputs = {"real clips": Path(a.data)}
    for name, (w, h) in {"gen 360p": (640, 360), "gen 720p": (1280, 720)}.items():
        d = gen / name.replace(" ", "_") / "a"
        d.mkdir(parents=True)
        make_kinetics_like(d / "clip.mp4", 10, w, h)
        inputs[name] = d.parent

    checkouts = {"before": (old, ["video", "frames"]), "now": (REPO, ["video", "frames", "packed"])}
    lists: dict[tuple, Path] = {}
    sizes: dict[tuple, float] = {}
    for ck, (src, modes) in checkouts.items():
        for inp, root in inputs.items():
            for m in modes:
                dst = work / ck / inp.replace(" ", "_") / m
                extra = ["--keyint", "16"] if m == "video" else []
                print(f"prepare {ck} {inp} {m}", flush=True)
                _run(py, src, ["-m", "tsm_ds.cli", "prepare", str(root), str(dst), "--mode", m, "--short-side",
                               "256", "--workers", "2", *extra])
                lists[(ck, inp, m)] = dst / "all.txt"
                files = [f for f in dst.rglob("*") if f.is_file() and f.name not in
                         ("all.txt", "classes.txt", "prepare_report.json")]
                nvid = len((dst / "all.txt").read_text().splitlines())
                sizes[(ck, inp, m)] = sum(f.stat().st_size for f in files) / max(1, nvid)
            lists[(ck, inp, "raw")] = None
    keys = [k for k in lists if lists[k] is not None]
    rates: dict[tuple, list[float]] = {k: [] for k in keys}
    for r in range(a.rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for k in order:
            src = checkouts[k[0]][0]
            res = _run(py, src, ["-c", MEASURE, str(lists[k]), str(a.items)])
            rates[k].append(json.loads(res.strip().splitlines()[-1])["items_per_cpu_s"])
            print(f"round {r + 1}: {k}: {rates[k][-1]:.1f} items per CPU second", flush=True)
    rows = []
    for k in keys:
        med = statistics.median(rates[k])
        row = {"checkout": k[0], "input": k[1], "format": k[2], "items_per_cpu_s": round(med, 1),
               "rounds": [round(x, 1) for x in rates[k]], "bytes_per_video": round(sizes[k])}
        for base in ("frames", "video"):
            b = ("before", k[1], base)
            if b in rates:
                row[f"vs_before_{base}"] = round(med / statistics.median(rates[b]), 2)
        rows.append(row)
    (out / "feed_gpus.json").write_text(json.dumps({"before": a.before, "rows": rows}, indent=2) + "\n")
    print(f"\n{'input':12s} {'checkout':8s} {'format':8s} {'items/CPU-s':>11s} {'vs old frames':>13s} "
          f"{'vs old video':>12s} {'kB/video':>9s}")
    for row in sorted(rows, key=lambda x: (x["input"], x["format"], x["checkout"])):
        print(f"{row['input']:12s} {row['checkout']:8s} {row['format']:8s} {row['items_per_cpu_s']:11.1f} "
              f"{row.get('vs_before_frames', 0):13.2f} {row.get('vs_before_video', 0):12.2f} "
              f"{row['bytes_per_video'] / 1e3:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
