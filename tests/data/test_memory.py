"""Flat memory: a DataLoader worker does not keep the heap its clips freed.

Decoding allocates and frees tens of MB per clip; glibc kept the freed heap resident (the issue's
878 MB after 200 clips, 1,092 MB after 5,000; the README's 10,000-clip measurement). Here one
DataLoader worker of a fresh process (``python tests/data/test_memory.py DIR ITEMS``) decodes 200
training items (16 frames, 224 px) cycling over 24 clips of 24 frame sizes, and its anonymous
resident memory after the first item is compared with the largest value after items 50..200.
Measured on the 2-core CI machine, two runs each: +54.1 and +57.3 MB before the fix
(``TSM_DS_MALLOC_TRIM=0`` restores it) against +9.7 and +9.7 MB after (the frame indexes and
per-size state of the first 24 clips; then flat within 0.2 MB).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ITEMS = 200
BOUND_MB = 20.0


def _rss_mb() -> float:
    """This process's anonymous resident memory (``RssAnon``, MB): the heap. File-backed pages (the ~400 MB of
    library code) are left out: the kernel drops and re-reads them under memory pressure, which
    moved ``VmRSS`` by tens of MB on the shared CI machine."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class _Probe:
    """The dataset's items as a DataLoader worker decodes them; each item is the worker's anonymous
    RSS (MB) measured right after it (where the dataset trims)."""

    def __init__(self, ds, items: int):
        self.ds, self.items = ds, items

    def __len__(self):
        return self.items

    def __getitem__(self, i):
        self.ds.set_epoch(i // len(self.ds))
        self.ds[i % len(self.ds)]
        return _rss_mb()


def _worker(folder: str, items: int) -> None:
    """Decode ``items`` training items (16 frames, 224 px) in one DataLoader worker, cycling over 24
    clips of 24 frame sizes; print the worker's anonymous RSS (MB) after the first item and after
    every 50 as one JSON list."""
    import torch

    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord
    from tsm_ds.data.testvideo import write_numbered_video

    files = []
    for w in (128, 192, 256, 320, 384, 480):
        for h in (64, 144, 240, 288):   # a frame size per clip: allocations of many sizes
            files.append(os.path.join(folder, f"c{w}x{h}.mp4"))
            write_numbered_video(files[-1], 40, width=w, height=h, texture=True)
    ds = VideoClipDataset([VideoRecord(p, 0) for p in files], num_segments=16, mode="train", img_size=224, seed=0)
    loader = torch.utils.data.DataLoader(_Probe(ds, items), batch_size=None, num_workers=1, timeout=300)
    rss = [r for i, r in enumerate(loader) if i == 0 or (i + 1) % 50 == 0]
    print(json.dumps(rss))


def _run(tmp_path: Path, env: dict) -> list[float]:
    p = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path), str(ITEMS)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RSS is read from /proc (Linux)")
def test_worker_anonymous_rss_stays_flat_over_200_items(tmp_path):
    rss = _run(tmp_path, {})
    growth = max(rss[1:]) - rss[0]                 # after items 50, 100, ... vs after the first item
    assert growth < BOUND_MB, f"anonymous RSS grew {growth:.1f} MB over {ITEMS} items (MB: {rss})"


def test_release_freed_heap_switch(shared_data, monkeypatch):
    """--no-malloc-trim is the dataset's option: its items call the trim or not (counted), and no
    process-wide switch is left behind."""
    from tsm_ds.cli.train import parse_config
    from tsm_ds.data import dataset as dataset_mod
    from tsm_ds.data.options import ReaderOptions
    from tsm_ds.data.records import VideoRecord

    calls = []
    monkeypatch.setattr(dataset_mod, "release_freed_heap", lambda: calls.append(1) or True)
    video = next((shared_data / "videos").rglob("*.mp4"))
    for trim, want in ((False, 0), (True, 2)):
        ds = dataset_mod.VideoClipDataset([VideoRecord(str(video), 0)] * 2, num_segments=2, img_size=32,
                                          mode="val", reader_options=ReaderOptions(malloc_trim=trim))
        calls.clear()
        _ = (ds[0], ds[1])
        assert len(calls) == want, trim
    # the switch's field: --no-malloc-trim, or TSM_DS_MALLOC_TRIM=0 when the flag is not given
    assert parse_config([], environ={})[0].data.malloc_trim is True
    assert parse_config(["--no-malloc-trim"], environ={})[0].data.malloc_trim is False
    assert parse_config([], environ={"TSM_DS_MALLOC_TRIM": "0"})[0].data.malloc_trim is False


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))
