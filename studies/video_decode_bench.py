"""Which libx264 options make ``tsm-ds prepare --mode video`` output cheap to load (issue 27).

``python studies/video_decode_bench.py [--videos DIR] [--work DIR] [--long-minutes 0.5]``

Prepares the real clips (``DIR/*/*``, default ../shared/data/videos) with
:func:`tsm_ds.data.prepare.prepare_video` at the same short side 256, keyint 16, crf 23, preset
veryfast, once per candidate set of x264 options (``CANDIDATES``: ``today`` is the encode before
issue 27, automatic x264 threads and no extra option), and optionally a generated 640x360
textured clip (:func:`tsm_ds.bench.data.make_long_video`, ``--long-minutes``). Then, for each of
``--rounds`` rounds, each input and each candidate (interleaved), a fresh process with one torch
thread measures for ``--seconds`` the ``VideoClipDataset(mode="train", num_segments=8,
img_size=224)`` items loaded one by one (what one DataLoader worker does): items per CPU second
of that one-thread process (= per core; wall-clock rates are skewed by other load on a shared
machine, and are printed in the JSON lines only), and the frames the decoder produced per item.

``--code TAG=DIR`` also measures every candidate with an older ``tsm_ds`` (rows ``NAME@TAG``), for
the loader's own changes. Prints one JSON line per measurement, then per input and candidate: the median items/s, its
ratio to ``today``'s of the same rounds, decoded frames per item, and the bytes of the prepared
files and their ratio to ``today``'s. The machine may be shared: compare ratios, not absolute
rates. Nothing here asserts a time.

Run of the issue-27 change (2 shared cores; ``--rounds 3 --seconds 3 --long-minutes 0.5
--candidates today fastdecode bpyr_none+fastdecode --code old=OLD --code decode_py=MID``, OLD
the package before, MID it with only decode.py's per-packet change; ratios to ``today@old``,
same-round medians; ``bpyr_none+fastdecode`` is prepare_video's default now)::

    input    options                     items/CPU-s  x base  dec/item  bytes x today
    real     today@old                          30.9    1.00      46.6     1.00
    real     today@decode_py                    33.0    1.05      46.6     1.00
    real     today                              34.7    1.14      46.6     1.00
    real     fastdecode@old                     48.0    1.60      46.8     1.06
    real     fastdecode                         61.2    1.98      46.8     1.06
    real     bpyr_none+fastdecode@old           51.4    1.70      43.0     1.08
    real     bpyr_none+fastdecode@decode_py     58.3    1.90      43.0     1.08
    real     bpyr_none+fastdecode               65.8    2.06      43.0     1.08
    textured today@old                          15.2    1.00      39.8     1.00
    textured today                              16.4    1.06      39.8     1.00
    textured fastdecode@old                     31.9    2.06      39.8     1.12
    textured fastdecode                         38.0    2.46      39.8     1.12
    textured bpyr_none+fastdecode@old           36.8    2.49      34.8     1.12
    textured bpyr_none+fastdecode               40.6    2.75      34.8     1.12

An earlier run of every candidate (same method, ratios to ``today``): cabac0 x1.33 / x1.76
(bytes 1.05 / 1.13), nodeblock x1.08 / x1.05 (0.99 / 0.99), bframes0 x1.12 / x0.98 (1.07 /
1.26: every frame a reference, more frames decoded), bpyr_none x1.13 / x1.03 (1.00 / 1.08),
bpyr_none+cabac0 x1.58 / x1.95 (1.06 / 1.24), threads1 x1.00 / x1.01 (0.98 / 0.99).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

def _opts(tune=None, params=None, threads=1) -> dict:
    return {"tune": tune, "x264_params": params, "threads": threads}


#: name -> prepare_video options (tune, x264_params, threads); all at short side 256, keyint 16,
#: crf 23, preset veryfast
CANDIDATES: dict[str, dict] = {
    "today": _opts(threads=0),                  # before issue 27: no tune, automatic threads
    "threads1": _opts(),                        # the same, x264 threads pinned to 1
    "fastdecode": _opts("fastdecode"),          # CAVLC, no deblocking, no weighted prediction
    "cabac0": _opts(params="cabac=0"),
    "nodeblock": _opts(params="no-deblock=1"),
    "ref1": _opts(params="ref=1"),              # veryfast's own ref count already
    "bframes0": _opts(params="bframes=0"),
    "bpyr_none": _opts(params="b-pyramid=none"),   # every B-frame unreferenced: skip_nonref drops it
    "bpyr_none+cabac0": _opts(params="b-pyramid=none:cabac=0"),
    "bpyr_none+nodeblock": _opts(params="b-pyramid=none:no-deblock=1"),
    "bpyr_none+fastdecode": _opts("fastdecode", "b-pyramid=none"),
}


def prepare_all(sources: list[str], src_root: str, out_dir: Path, opts: dict
                ) -> tuple[list[str], int]:
    """Prepare ``sources`` into ``out_dir`` (reused when there); returns (outputs, total bytes)."""
    from tsm_ds.data.prepare import prepare_video

    outs = []
    for s in sources:
        dst = out_dir / (os.path.splitext(os.path.relpath(s, src_root))[0] + ".mp4")
        if not dst.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            prepare_video(s, str(dst), short_side=256, keyint=16, crf=23, preset="veryfast", **opts)
        outs.append(str(dst))
    return outs, sum(os.path.getsize(o) for o in outs)


def measure(files: list[str], seconds: float, copies: int) -> dict:
    """Train items/s of one prepared input, in this process with one torch thread."""
    import time
    import warnings

    import torch

    from tsm_ds.data import video as V
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    recs = [VideoRecord(f, i) for i, f in enumerate(files)] * copies
    ds = VideoClipDataset(recs, num_segments=8, mode="train", img_size=224, seed=0)
    for i in range(len(ds)):   # frame indexes, page cache
        ds[i]
    # per core: items per CPU second of this (one-thread) process; wall time is skewed by
    # whatever else runs on the machine
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.process_time() - c0 < seconds:
        ds[n % len(ds)]
        n += 1
    rate, wall = n / (time.process_time() - c0), n / (time.perf_counter() - t0)
    # frames decoded per item (untimed): the same items again, counting
    real = V.decode_frames
    st = V.DecodeStats()
    V.decode_frames = lambda *a, **k: real(*a, **k, stats=st)
    try:
        for i in range(len(ds)):
            ds[i]
    finally:
        V.decode_frames = real
    return {"items_per_s": rate, "items_per_wall_s": wall, "decoded_per_item": st.decoded / len(ds)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", default=str(HERE.parent / "shared" / "data" / "videos"))
    ap.add_argument("--work", default="/tmp/video_decode_bench", help="prepared files (reused)")
    ap.add_argument("--long-minutes", type=float, default=0.0,
                    help="also a generated 640x360 textured clip of this length (0: none)")
    ap.add_argument("--candidates", nargs="*", default=list(CANDIDATES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--code", action="append", default=[], metavar="TAG=DIR",
                    help="also measure each candidate with the tsm_ds package in DIR (e.g. `git archive "
                    "<commit> tsm_ds | tar -x -C DIR`): rows `NAME@TAG`; repeatable")
    ap.add_argument("--baseline", default="today",
                    help="the row ratios are taken to, e.g. today@old with --code old=DIR")
    ap.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.measure:
        copies = int(a.measure[0])
        print(json.dumps(measure(a.measure[1:], a.seconds, copies)))
        return 0
    if "today" not in a.candidates:
        a.candidates.insert(0, "today")
    work = Path(a.work)
    inputs = {"real": (a.videos, sorted(str(p) for p in Path(a.videos).glob("*/*") if p.is_file()), 1)}
    if a.long_minutes:
        from tsm_ds.bench.data import make_long_video

        src = make_long_video(work / "src" / f"textured_{a.long_minutes:g}min.mp4", a.long_minutes, 16)
        inputs["textured"] = (str(work / "src"), [src], 16)
    prepared: dict = {}
    for kind, (root, sources, copies) in inputs.items():
        for c in a.candidates:
            prepared[(kind, c)] = prepare_all(sources, root, work / kind / c, CANDIDATES[c])
            print(f"prepared {kind} {c}: {prepared[(kind, c)][1]} bytes", flush=True)
    versions = [("", str(HERE))] + [("@" + t.split("=", 1)[0], t.split("=", 1)[1]) for t in a.code]
    rows: dict = {}
    for r in range(a.rounds):
        for kind, (_, _, copies) in inputs.items():
            for c in a.candidates:
                for tag, code in versions:
                    env = {**os.environ, "PYTHONPATH": code, "OMP_NUM_THREADS": "1"}
                    out = subprocess.run([sys.executable, __file__, "--seconds", str(a.seconds), "--measure",
                                          str(copies), *prepared[(kind, c)][0]], env=env,
                                         capture_output=True, text=True, check=True).stdout
                    res = json.loads(out.strip().splitlines()[-1])
                    print(r + 1, kind, c + tag, json.dumps(res), flush=True)
                    rows.setdefault((kind, c + tag), []).append(res)
    print(f"\n{'input':8s} {'options':30s} {'items/s':>8s} {'x base':>7s} {'dec/item':>8s} "
          f"{'bytes':>9s} {'x today':>8s}   (base: {a.baseline}; items per CPU second)")
    for kind in inputs:
        base = [x["items_per_s"] for x in rows[(kind, a.baseline)]]
        b_bytes = prepared[(kind, "today")][1]
        for c in a.candidates:
            for tag, _ in versions:
                rates = [x["items_per_s"] for x in rows[(kind, c + tag)]]
                ratio = statistics.median(x / y for x, y in zip(rates, base))   # same-round ratios
                dec = statistics.median(x["decoded_per_item"] for x in rows[(kind, c + tag)])
                nb = prepared[(kind, c)][1]
                print(f"{kind:8s} {c + tag:30s} {statistics.median(rates):8.1f} {ratio:7.2f} "
                      f"{dec:8.1f} {nb:9d} {nb / b_bytes:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
