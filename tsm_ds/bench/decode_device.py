"""CPU DataLoader workers against batched decoding on a device (``--decode-device``), for
``launch/gpu_check.sh``'s ``gpudecode`` section.

Both paths read the same packs (``tsm-ds prepare`` default mode, short side 256) and make the same
training items (T=8, 224 px, multi-scale crop + flip, crops drawn from (seed, epoch, index)):

- ``cpu_workers``: ``VideoClipDataset`` decodes in DataLoader workers, uint8 batches are moved to
  ``device`` and normalised there (:func:`tsm_ds.data.transforms.normalize_batch`);
- ``decode_device``: the workers only read JPEG bytes and draw crops; the batch is decoded in one
  torchvision ``decode_jpeg`` call on ``device`` (nvJPEG on CUDA), cropped, resized and normalised
  there.

Reported: clips/s of each (a time box per path after one warm-up batch, the same workers), their
ratio, and the pixel difference of the uint8 clips of the two paths on the same items (max and
mean absolute difference in grey levels: JPEG decoders may round differently; 0 on CPU).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["run_decode_bench"]


def _prepare_packs(data: str, out: Path) -> list:
    from tsm_ds.data.prepare import prepare_dataset
    from tsm_ds.data.records import read_class_folders, read_video_list
    from tsm_ds.data.video import is_packed

    records, classes = read_class_folders(data)
    if records and all(is_packed(r.path) for r in records):
        return records
    rows = prepare_dataset(records, data, str(out), mode="packed", classes=classes,
                           workers=max(1, min(8, os.cpu_count() or 1)), progress=False, short_side=256)
    failed = [r for r in rows if r["status"] == "failed"]
    if len(failed) == len(rows):
        raise ValueError(f"{data}: no video could be packed ({failed[0]['reason'] if failed else 'none found'})")
    return read_video_list(out / "all.txt", root=str(out))


def _rate(ds, device: str, workers: int, batch: int, seconds: float) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from tsm_ds.data.packed_batch import collate_items
    from tsm_ds.data.transforms import normalize_batch

    dl = DataLoader(ds, batch_size=batch, shuffle=False, num_workers=workers, collate_fn=collate_items,
                    persistent_workers=workers > 0, drop_last=False)
    mean, std = ds.normalization

    def epochs():
        e = 0
        while True:
            ds.set_epoch(e)
            yield from dl
            e += 1

    it = epochs()
    normalize_batch(next(it)["clip"], mean, std, device)   # warm-up: workers start, CUDA context
    clips, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x = normalize_batch(next(it)["clip"], mean, std, device)
        clips += x.shape[0]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    return {"clips": clips, "seconds": round(secs, 2), "clips_per_s": round(clips / secs, 1)}


def run_decode_bench(data: str, device: str, out_dir: str | os.PathLike, *, seconds: float = 8.0,
                     workers: int | None = None, batch: int = 16, img_size: int = 224,
                     num_segments: int = 8, compare_items: int = 8) -> dict:
    """Measure CPU-worker decoding against batched decoding on ``device``; write
    ``out_dir/doctor.json`` (the name gpu_check.sh embeds in its JSON lines) and return it.

    Args:
        data: a class-folder tree of videos (packed first into ``out_dir/packs``) or of packs.
        device: "cuda" (the GPU check) or "cpu" (the dry run and the tests: pixel difference 0).
        seconds: time box per path. workers: DataLoader workers of both paths (default: the
            CPU count, at most 8). batch: clips per batch.
        img_size, num_segments: the items (224, 8: TSM-R50's).
        compare_items: items compared pixel by pixel.

    Returns:
        {"device", "workers", "batch", "cpu_workers": {clips, seconds, clips_per_s},
        "decode_device": {...}, "ratio" (decode_device / cpu_workers clips/s),
        "pixel_max_abs_diff", "pixel_mean_abs_diff" (uint8 grey levels), "items_compared"}.

    Raises:
        ValueError: no video in ``data`` could be packed, or ``device`` is refused
        (:func:`tsm_ds.data.packed_batch.check_decode_device`).
    """
    import torch

    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.packed_batch import collate_items

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = _prepare_packs(data, out / "packs")
    workers = workers if workers is not None else max(1, min(8, os.cpu_count() or 1))
    common = dict(mode="train", num_segments=num_segments, img_size=img_size, seed=0)
    on_cpu = VideoClipDataset(records, **common)
    on_dev = VideoClipDataset(records, decode_device=device, **common)
    n = min(compare_items, len(records))
    a = torch.stack([on_cpu[i]["clip"] for i in range(n)])
    b = collate_items([on_dev[i] for i in range(n)])["clip"].decode().cpu()
    diff = (a.int() - b.int()).abs()
    res = {"device": device, "workers": workers, "batch": batch, "videos": len(records),
           "cpu_workers": _rate(on_cpu, device, workers, batch, seconds),
           "decode_device": _rate(on_dev, device, workers, batch, seconds),
           "pixel_max_abs_diff": int(diff.max()), "pixel_mean_abs_diff": round(float(diff.float().mean()), 4),
           "items_compared": n}
    res["ratio"] = round(res["decode_device"]["clips_per_s"] / max(res["cpu_workers"]["clips_per_s"], 1e-9), 3)
    (out / "doctor.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"gpudecode on {device}: CPU workers {res['cpu_workers']['clips_per_s']} clips/s, batched decode "
          f"{res['decode_device']['clips_per_s']} clips/s (x{res['ratio']}), {workers} workers; pixels vs the "
          f"CPU path: max {res['pixel_max_abs_diff']}, mean {res['pixel_mean_abs_diff']}", flush=True)
    return res
