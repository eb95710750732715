"""Doctor section ``data``: loader clips/s on the user's clips, alone and sharing the cores with compute.

Everything goes through the real training input path: :func:`tsm_ds.data.splits.resolve_split`
(``--data`` as training reads it, every clip of both sides), :class:`~tsm_ds.data.dataset.VideoClipDataset`
in train mode (random TSN frames, official multi-scale crop, flip; uint8 items, normalised per batch by
the training step's ``prepare`` as the trainer does) at the doctor's
num_segments / img_size, and a ``torch.utils.data.DataLoader`` of the micro-batch. Measured:

0. The data format, from a sample of the records (:func:`detect_format`): ``packed`` (``.jpack``
   files, ``tsm-ds prepare``'s default), ``JPEG folders`` (frame folders), ``re-encoded video`` (a
   video whose keyframe interval is at most :data:`SHORT_KEYINT` frames, as ``tsm-ds prepare --mode
   video --keyint 16`` writes) or ``raw video``.
1. ``0 workers``: clips loaded one by one in this process with one torch thread, as a DataLoader
   worker runs: one worker's rate ``per_worker_clips_per_s``.
2. ``N workers`` for each count of ``--workers`` (default 1, 2, 4, ... up to the cores per device),
   the loader alone (the first batch of each worker is not timed: worker start, frame indexes).
3. The workers needed per device to keep up with compute: ceil(compute clips/s / one worker's
   clips/s), against the cores per device; and the CPU cores one GPU would need at that rate:
   ``cores_per_gpu_a100`` = 300 / one worker's clips/s, ``cores_per_gpu_h100`` = 600 / it (the
   training clips/s of :data:`tsm_ds.bench.data_formats.GPU_TRAIN_CLIPS_PER_S`: ResNet-50 trains
   at ~2,470 images/s on an A100 in mixed precision, NVIDIA DeepLearningExamples PyTorch ConvNets
   README, DGX A100, 1 GPU; 8 frames per clip = ~300 clips/s; H100 / H200 about twice that).
4. The preparation advice, measured (videos only; packed files and JPEG folders are already
   prepared): a sample of the clips is prepared as ``tsm-ds prepare`` does by default, in the
   training-ready packed format (:func:`tsm_ds.data.prepare.pack_video` at ``--short-side``; a
   checkout without it re-encodes as ``--mode video --short-side 256 --keyint 16``:
   :func:`tsm_ds.data.prepare.prepare_video`), into a temporary folder under ``--out``, removed
   afterwards, and the same clips (same frames, same crops) are loaded from both, interleaved clip
   by clip: ``reencode_speedup`` = time on the originals / time on the prepared files
   (``reencode_mode``, ``reencode_command``: what was measured).
5. The whole pipeline: the DataLoader with the cores-per-device workers feeding training steps of
   the compute section's model (its warmed base variant; a new one when compute did not run) in
   this process, so loader and compute share the
   cores as in training: ``pipeline_clips_per_s``, the fraction of the time spent waiting for data,
   and ``pipeline_vs_alone`` = pipeline / min(loader alone, compute alone).

Without data (no ``--data``, no ``$TSM_DS_DATA``, no ../shared/data/videos) the section is
``skipped`` with how to point it at data.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from tsm_ds.doctor.core import Context, section_result
from tsm_ds.doctor.timing import interleaved

__all__ = ["worker_counts", "sample", "loader_rate", "detect_format", "SHORT_KEYINT", "run"]

#: a video whose median keyframe interval is at most this many frames counts as re-encoded for
#: random access (``tsm-ds prepare --mode video --keyint 16``); web videos have 100 - 300
SHORT_KEYINT = 32


def detect_format(records: list, k: int = 8) -> dict[str, Any]:
    """The data format of ``records``, from ``k`` of them spread evenly (:func:`sample`).

    Per record: a ``.jpack`` file -> ``packed``; a folder -> ``JPEG folders``; a video whose median
    keyframe interval (frames between keyframes, from the demux-only index
    :func:`tsm_ds.data.video.get_index`) is at most :data:`SHORT_KEYINT` -> ``re-encoded video``;
    else ``raw video``. Unreadable videos are left out (the dataset replaces them).

    Returns:
        ``{"format": the most frequent (ties: table order), "counts": {format: records},
        "keyframe_interval": median over the sampled videos (frames) or None}``.
    """
    from tsm_ds.data import video

    counts: dict[str, int] = {}
    gaps: list[float] = []
    for r in sample(records, k):
        p = str(r.path)
        if video.is_packed(p):
            f = "packed"
        elif os.path.isdir(p):
            f = "JPEG folders"
        else:
            try:
                idx = video.get_index(p)
            except video.VideoError:
                continue
            g = np.diff(np.append(idx.key_pos, len(idx.pkt_key)))
            gaps.append(float(np.median(g)))
            f = "re-encoded video" if gaps[-1] <= SHORT_KEYINT else "raw video"
        counts[f] = counts.get(f, 0) + 1
    order = ["packed", "JPEG folders", "re-encoded video", "raw video"]
    fmt = max(order, key=lambda f: (counts.get(f, 0), -order.index(f))) if counts else "unknown"
    return {"format": fmt, "counts": counts, "keyframe_interval": float(np.median(gaps)) if gaps else None}


class _Cycle(Dataset):
    """``n`` items cycling over ``ds`` (index i -> ds[i % len(ds)]): a loader runs as long as the
    time box needs, whatever the number of clips."""

    def __init__(self, ds, n: int):
        self.ds, self.n = ds, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.ds[i % len(self.ds)]


def worker_counts(cores_per_device: int, quick: bool) -> list[int]:
    """DataLoader worker counts measured: 1, 2, 4, ... and the cores per device itself
    (``quick``: 1 and the cores per device); at most 32."""
    top = max(1, min(cores_per_device, 32))
    if quick:
        return sorted({1, top})
    out, w = [], 1
    while w < top:
        out.append(w)
        w *= 2
    return out + [top]


def sample(records: list, k: int) -> list:
    """``k`` records spread evenly over ``records`` (deterministic; all when k >= len)."""
    if k >= len(records):
        return list(records)
    if k <= 1:
        return [records[len(records) // 2]]
    return [records[round(i * (len(records) - 1) / (k - 1))] for i in range(k)]


def _one_thread_rate(ds, budget: float, quick: bool) -> tuple[float, int]:
    """(clips/s, clips) loading items one by one in this process with one torch thread."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    pos = [0]

    def one():
        ds[pos[0] % len(ds)]
        pos[0] += 1
    try:
        times, _ = interleaved({"one": one}, budget_s=budget, min_reps=2 if quick else 4, max_reps=10_000)
    finally:
        torch.set_num_threads(old)
    return len(times["one"]) / sum(times["one"]), len(times["one"])


def loader_rate(ds, workers: int, batch: int, budget: float, *, pin: bool = False,
                step=None, min_batches: int = 2, warm_step: bool = True) -> dict[str, Any]:
    """Clips/s of a DataLoader over ``ds`` (cycled), time-boxed.

    Args:
        ds: a dataset with VideoClipDataset items; workers: worker processes (>= 1);
            batch: clips per batch; budget: seconds of timed batches (at least 2 are timed).
        pin: pin_memory (CUDA).
        step: None (loader alone) or ``step(clips, labels) -> seconds``: each batch is trained on
            (the whole pipeline).
        min_batches: timed batches at least, whatever the budget.
        warm_step: train on the untimed first batch too (a fresh model's first step allocates).

    Returns:
        ``{"clips", "seconds", "clips_per_s", "data_wait_s"}``; the first ``workers`` batches (worker
        start, one batch per worker; with ``step``: the first batch and its step) are not timed.
    """
    from torch.utils.data import DataLoader

    from tsm_ds.data.packed_batch import collate_items

    dl = DataLoader(_Cycle(ds, 10 ** 7), batch_size=batch, num_workers=workers, shuffle=False,
                    pin_memory=pin, persistent_workers=False, collate_fn=collate_items)
    it = iter(dl)
    try:
        for _ in range(1 if step is not None else max(1, workers)):
            b = next(it)
            if step is not None and warm_step:
                step(b["clip"], b["label"])
        clips, wait, batches = 0, 0.0, 0
        t0 = time.perf_counter()
        while batches < min_batches or time.perf_counter() - t0 < budget:
            t = time.perf_counter()
            b = next(it)
            wait += time.perf_counter() - t
            if step is not None:
                step(b["clip"], b["label"])
            clips += int(b["clip"].shape[0])
            batches += 1
        total = time.perf_counter() - t0
    finally:
        del it   # shuts the workers down
    return {"clips": clips, "seconds": total, "clips_per_s": clips / total, "data_wait_s": wait}


def _reencode(ctx: Context, records: list, make_ds) -> dict[str, Any]:
    """Prepare ``records`` as ``tsm-ds prepare`` does by default and compare their loading, interleaved."""
    from tsm_ds.data import prepare
    from tsm_ds.data.records import VideoRecord
    from tsm_ds.data.video import PACK_EXTENSION

    s = ctx.settings
    mode = "packed" if "packed" in getattr(prepare, "MODES", ()) else "video"
    if mode == "packed":
        command = f"tsm-ds prepare SRC OUT --mode packed --short-side {s.short_side}"
    else:
        command = f"tsm-ds prepare SRC OUT --mode video --short-side {s.short_side} --keyint {s.keyint}"
    with tempfile.TemporaryDirectory(prefix="reencoded_sample_", dir=ctx.out) as tmp:
        new, t_prep, size_o, size_r = [], 0.0, 0, 0
        for i, r in enumerate(records):
            ctx.progress.note(f"preparing {i + 1}/{len(records)} ({command})")
            dst = os.path.join(tmp, f"{i:03d}" + (PACK_EXTENSION if mode == "packed" else ".mp4"))
            t = time.perf_counter()
            if mode == "packed":
                prepare.pack_video(r.path, dst, short_side=s.short_side)
            else:
                prepare.prepare_video(r.path, dst, short_side=s.short_side, keyint=s.keyint)
            t_prep += time.perf_counter() - t
            size_o += os.path.getsize(r.path)
            size_r += os.path.getsize(dst)
            new.append(VideoRecord(dst, r.label))
        ds_o, ds_r = make_ds(records), make_ds(new)
        pos = {"original": 0, "reencoded": 0}

        def loader(name, ds):
            def one():
                ds[pos[name] % len(ds)]
                pos[name] += 1
            return one
        import torch
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            ctx.progress.note("original vs re-encoded, clip by clip")
            times, _ = interleaved({"original": loader("original", ds_o), "reencoded": loader("reencoded", ds_r)},
                                   budget_s=ctx.budget("reencode"), min_reps=max(2, len(records)), max_reps=10_000)
        finally:
            torch.set_num_threads(old)
    # the same clips in the same order: the ratio of the total times is the speedup
    n = min(len(times["original"]), len(times["reencoded"]))
    t_o, t_r = sum(times["original"][:n]), sum(times["reencoded"][:n])
    return {"reencode_speedup": t_o / t_r, "reencode_clips": len(records), "reencode_loads": n,
            "reencode_original_clips_per_s": n / t_o, "reencode_reencoded_clips_per_s": n / t_r,
            "reencode_prepare_s_per_clip": t_prep / len(records), "reencode_bytes_ratio": size_r / max(1, size_o),
            "reencode_mode": mode, "reencode_command": command}


def run(ctx: Context, results: dict) -> dict:
    """The ``data`` section (see the module docstring)."""
    from tsm_ds.bench.data_formats import GPU_TRAIN_CLIPS_PER_S
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.splits import default_data, resolve_split
    from tsm_ds.doctor.compute import TrainStep, micro_batch, recipe_precision
    from tsm_ds.engine.config.recipes import load_config

    s = ctx.settings
    data = s.data or default_data()[0]
    if data is None or not Path(data).exists():
        return section_result("data", title="Data", status="skipped",
                              summary=f"no data at {data}" if data else "no data given",
                              notes=["pass --data DIR (a class-folder tree, train/ + val/, or a folder "
                                     "holding manifest.csv), or set TSM_DS_DATA"])
    records = resolve_split(data=data).side("all")
    fmt = detect_format(records)
    raw = load_config(s.recipe)
    batch = micro_batch(ctx, raw)

    def make_ds(recs):
        return VideoClipDataset(recs, num_segments=s.num_segments, mode="train", img_size=s.img_size, seed=0)

    ds = make_ds(records)
    compute = (results.get("compute") or {}).get("values") or {}
    C = compute.get("clips_per_s")
    have = ctx.cores_per_device
    counts = list(s.workers) if s.workers else worker_counts(have, s.quick)
    rows: list[dict[str, Any]] = []
    values: dict[str, Any] = {"data": str(data), "clips": len(records), "batch": batch,
                              "workers_available": have, "compute_clips_per_s": C, "data_format": fmt["format"],
                              "data_format_counts": fmt["counts"], "keyframe_interval": fmt["keyframe_interval"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # unreadable files are replaced and counted by the dataset
        ctx.progress.note("0 workers (one worker's rate)")
        r1, n1 = _one_thread_rate(ds, ctx.budget("loader"), s.quick)
        rows.append({"measure": "loader alone", "workers": 0, "clips_per_s": r1, "clips": n1,
                     "how": "in this process, 1 torch thread: one worker's rate"})
        rates = {}
        for w in [c for c in counts if c > 0]:
            ctx.progress.note(f"{w} worker(s)")
            got = loader_rate(ds, w, batch, ctx.budget("loader"), pin=ctx.cuda)
            rates[w] = got["clips_per_s"]
            rows.append({"measure": "loader alone", "workers": w, "clips_per_s": got["clips_per_s"],
                         "clips": got["clips"], "how": f"DataLoader, {w} worker process(es), batch {batch}"})
        values["per_worker_clips_per_s"] = r1
        values["cores_per_gpu_a100"] = GPU_TRAIN_CLIPS_PER_S["A100"] / r1
        values["cores_per_gpu_h100"] = GPU_TRAIN_CLIPS_PER_S["H100/H200"] / r1
        top = max([w for w in rates if w <= have] or [0])
        values["loader_workers"] = top
        values["loader_clips_per_s"] = rates.get(top, r1)
        if C:
            values["workers_needed"] = math.ceil(C / r1)
            values["loader_vs_compute"] = values["loader_clips_per_s"] / C
        prepared = fmt["format"] in ("packed", "JPEG folders")
        if s.reencode_clips and not prepared:
            values.update(_reencode(ctx, sample(records, s.reencode_clips), make_ds))
            rows.append({"measure": f"re-encoded sample ({values['reencode_command'][len('tsm-ds '):]})",
                         "workers": 0,
                         "clips_per_s": values["reencode_reencoded_clips_per_s"],
                         "clips": values["reencode_loads"],
                         "how": f"{values['reencode_clips']} clip(s), 1 thread; originals "
                                f"{values['reencode_original_clips_per_s']:.3g} clips/s"})
            if C:
                values["workers_needed_reencoded"] = math.ceil(C / (r1 * values["reencode_speedup"]))
        # the whole pipeline: loader workers and training steps share the cores
        prec = recipe_precision(raw)
        prec = "fp32" if "fp16" in prec and not ctx.cuda else prec
        ctx.progress.note(f"pipeline: {max(1, top)} worker(s) + training steps")
        ts = ctx.shared.get("train_step")
        warm = ts is None                       # the compute section's model is built and warmed
        ts = ts or TrainStep(ctx, prec, batch=batch)
        pw = max(1, top)
        got = loader_rate(ds, pw, batch, ctx.budget("pipeline"), pin=ctx.cuda, min_batches=1 if s.quick else 2,
                          warm_step=warm,
                          step=lambda x, y: ts.step(ts.prepare(x, ds.normalization), (y % s.num_classes).to(ts.device)))
    values.update(pipeline_workers=pw, pipeline_clips_per_s=got["clips_per_s"],
                  pipeline_data_wait_fraction=got["data_wait_s"] / got["seconds"])
    rows.append({"measure": "pipeline (loader + training steps)", "workers": pw,
                 "clips_per_s": got["clips_per_s"], "clips": got["clips"],
                 "how": f"data wait {100 * values['pipeline_data_wait_fraction']:.0f} % of the time"})
    alone = [v for v in (values["loader_clips_per_s"] if top else None, C) if v]
    if alone:
        values["pipeline_vs_alone"] = got["clips_per_s"] / min(alone)
    line = (f"{len(records)} clips ({fmt['format']}): one worker {r1:.3g} clips/s "
            f"(A100 ~300 clips/s: {values['cores_per_gpu_a100']:.3g} cores per GPU; H100/H200 ~600: "
            f"{values['cores_per_gpu_h100']:.3g}), {top} worker(s) "
            f"{values['loader_clips_per_s']:.3g} clips/s alone, pipeline {got['clips_per_s']:.3g} clips/s")
    if "workers_needed" in values:
        line += f"; {values['workers_needed']} worker(s) per device needed, {have} core(s) per device"
    if "reencode_speedup" in values:
        line += f"; re-encoded x{values['reencode_speedup']:.2f}"
    notes = []
    if prepared and s.reencode_clips:
        notes.append(f"the clips are already prepared ({fmt['format']}): no preparation sample measured")
    if not C:
        notes.append("compute was not measured: workers needed and the verdict need it (run without --only)")
    return section_result("data", title="Data", summary=line, values=values, rows=rows, notes=notes)
