"""The README's "Memory in long epochs" measurement: one decoding process over 10,000 distinct clips.

``python studies/memory_long_epoch.py OUT_DIR [--items 10000] [--mode trim|none|mallopt]`` writes
24 small H.264 clips of 24 frame sizes (128-480 x 64-288, 48 frames) into ``OUT_DIR`` and
``--items`` hard links to them (distinct paths: distinct frame indexes, as in a real epoch), then
decodes one training item per link (8 frames, 112 px) with :class:`~tsm_ds.data.dataset.VideoClipDataset`
and prints the anonymous resident memory (``RssAnon``) and glibc's heap (``mallinfo2``: total,
used, free) after 100 items and every 2,000. Modes: ``trim`` (the dataset's ``malloc_trim`` after
every item, as in a DataLoader worker), ``none`` (``TSM_DS_MALLOC_TRIM=0``: the behaviour before),
``mallopt`` (no trim; ``M_MMAP_THRESHOLD`` = ``M_TRIM_THRESHOLD`` = 128 KiB). For
``MALLOC_ARENA_MAX`` run ``none`` with the variable set. Linux + glibc only.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import time


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--mode", choices=["trim", "none", "mallopt"], default="trim")
    args = p.parse_args()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    if args.mode != "trim":
        os.environ["TSM_DS_MALLOC_TRIM"] = "0"
    if args.mode == "mallopt":
        libc.mallopt(-3, 128 * 1024)   # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)   # M_TRIM_THRESHOLD
    import torch

    import tsm_ds.data.memory as memory
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord
    from tsm_ds.data.testvideo import write_numbered_video

    torch.set_num_threads(1)
    memory.MAIN_PROCESS_EVERY = 1   # trim after every item, as a DataLoader worker does
    os.makedirs(args.out_dir, exist_ok=True)
    srcs = []
    for w in (128, 192, 256, 320, 384, 480):
        for h in (96, 144, 240, 288):
            srcs.append(os.path.join(args.out_dir, f"s{w}x{h}.mp4"))
            if not os.path.exists(srcs[-1]):
                write_numbered_video(srcs[-1], 48, width=w, height=h, texture=True)
    links = []
    for i in range(args.items):
        links.append(os.path.join(args.out_dir, f"c{i:05d}.mp4"))
        if not os.path.exists(links[-1]):
            os.link(srcs[i % len(srcs)], links[-1])
    ds = VideoClipDataset([VideoRecord(f, 0) for f in links], num_segments=8, mode="train", img_size=112, seed=0)
    t0 = time.time()
    for i in range(args.items):
        ds[i]
        if i + 1 == 100 or (i + 1) % 2000 == 0:
            m = libc.mallinfo2()
            print(f"{args.mode} items {i + 1}: anonymous RSS {_anon_mb():.0f} MB; heap {m.arena / 2**20:.0f} MB, "
                  f"used {m.uordblks / 2**20:.0f}, free {m.fordblks / 2**20:.0f} ({time.time() - t0:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
