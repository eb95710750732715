"""The README's uint8-items measurement (issue 27): train items/s before and after, interleaved.

``python studies/uint8_items_bench.py --frames-list FRAMES/all.txt --videos DIR --before OLD_SRC``
compares two versions of the package: ``--before`` a folder holding an older ``tsm_ds`` (e.g.
``git archive <commit> tsm_ds | tar -x -C OLD_SRC``), and this checkout. For each of ``--rounds``
rounds, each input (JPEG frame folders from ``tsm-ds prepare --mode frames``, listed in
``--frames-list``; the videos ``DIR/*/*``) and each version, a fresh process with one torch thread
measures for ``--seconds``:

- ``per_item``: ``VideoClipDataset(mode="train", T=8, 224)`` items loaded one by one in the process
  (what one DataLoader worker does), items/s;
- ``loader_1w``: a DataLoader with 1 worker (batch 4), each batch normalised in the main process
  when the version has :func:`tsm_ds.data.transforms.normalize_batch` (a CPU run), items/s.

Prints one JSON line per measurement and the medians with the after/before ratios. The machine may
be shared: compare the ratios of the same round.
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


def measure(kind: str, source: str, seconds: float) -> dict:
    """One version's rates on one input (run in a fresh process; the version is sys.path's)."""
    import time
    import warnings

    import torch
    from torch.utils.data import DataLoader

    from tsm_ds.data import transforms as X
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord, read_video_list

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    recs = (read_video_list(source) if kind == "jpeg"
            else [VideoRecord(str(p), i) for i, p in enumerate(sorted(Path(source).glob("*/*")))])
    ds = VideoClipDataset(recs, num_segments=8, mode="train", img_size=224, seed=0)
    norm = getattr(X, "normalize_batch", None)
    for i in range(len(ds)):   # frame indexes, page cache
        item = ds[i]
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        item = ds[n % len(ds)]
        n += 1
    per_item = n / (time.perf_counter() - t0)

    class Cycle(torch.utils.data.Dataset):
        def __len__(self):
            return 10 ** 6

        def __getitem__(self, i):
            return ds[i % len(ds)]
    it = iter(DataLoader(Cycle(), batch_size=4, num_workers=1, prefetch_factor=4))
    next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = next(it)
        x = norm(b["clip"], *ds.normalization, "cpu", torch.float32) if norm else b["clip"].float()
        n += x.shape[0]
    loader = n / (time.perf_counter() - t0)
    del it
    return {"kind": kind, "dtype": str(item["clip"].dtype), "per_item": per_item, "loader_1w": loader}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames-list", required=True)
    ap.add_argument("--videos", required=True)
    ap.add_argument("--before", required=True, help="folder holding the older tsm_ds package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--measure", nargs=2, metavar=("KIND", "SOURCE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.measure:
        print(json.dumps(measure(a.measure[0], a.measure[1], a.seconds)))
        return 0
    rows: dict = {}
    for r in range(a.rounds):
        for kind, src in (("jpeg", a.frames_list), ("video", a.videos)):
            for ver, path in (("before", a.before), ("after", str(HERE))):
                env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
                out = subprocess.run([sys.executable, __file__, "--frames-list", a.frames_list, "--videos",
                                      a.videos, "--before", a.before, "--seconds", str(a.seconds), "--measure",
                                      kind, src], env=env, capture_output=True, text=True, check=True).stdout
                res = json.loads(out.strip().splitlines()[-1])
                print(r + 1, ver, json.dumps(res), flush=True)
                for k in ("per_item", "loader_1w"):
                    rows.setdefault((kind, k, ver), []).append(res[k])
    for kind in ("jpeg", "video"):
        for k in ("per_item", "loader_1w"):
            b, f = (statistics.median(rows[(kind, k, v)]) for v in ("before", "after"))
            print(f"{kind:5s} {k:9s} before {b:7.1f}  after {f:7.1f} items/s  x{f / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
