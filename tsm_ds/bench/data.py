"""``tsm-ds bench data``: clip decoding throughput, our loader against the alternatives.

For each input, every loader fetches the same clips of 8 segment-centre frames (TSN validation
sampling, one decoding thread) and we report clips/s (median of interleaved repetitions), frames
decoded per clip where the loader can tell, and whether its frames are the frames a full in-order
decode gives at those positions.

Timing: each repetition loads every clip once with every loader, interleaved per clip in a
rotating order; clips_per_s uses the median repetition, best_clips_per_s the fastest.

Inputs: the real clips (``--data``: a class-folder tree, default ../shared/data/videos), and a
generated textured 640x360 25 fps video (5 minutes; ``--quick``: 1 minute) encoded twice, with a
keyframe every 250 frames (long GOP, as many web videos) and every 25 frames (short GOP).

Loaders:
- ``tsm_ds``: :func:`tsm_ds.data.video.decode_frames` (cached packet index; seek only when the
  next keyframe lies ahead; converts only the requested frames). The index is built once per file
  before timing (``index_ms`` reports that one-time cost).
- ``tsm_ds_short256``: the same, scaling frames to a short side of 256 during the RGB conversion
  (what VideoClipDataset does for val/test); its frames are smaller on purpose (same_frames n/a).
- ``decode_all``: decode every frame in order, convert each to RGB, then index (the naive way).
- ``torchcodec_exact`` / ``torchcodec_approx``: ``torchcodec.decoders.VideoDecoder(path,
  seek_mode=..., num_ffmpeg_threads=1).get_frames_at(indices)``, a new decoder per clip (as a
  dataset item does), when torchcodec imports.
- ``decord``: ``decord.VideoReader(path, num_threads=1).get_batch(indices)``, when decord imports.

Then the whole training pipeline on the real clips (VideoClipDataset in train mode: decode, official
multi-scale crop, flip; uint8 items, not normalised: the consumer normalises per batch on its device)
through a DataLoader with 0 and 2 worker processes.

Then the format table (:mod:`tsm_ds.bench.data_formats`, issue 27): generated Kinetics-like
clips (10 s at 30 fps, 640x360 and 1280x720, GOP 250; ``--quick``: 2 s) and the real clips, each
as raw video, ``prepare --mode video --short-side 256 --keyint 16``, ``prepare --mode frames``
(JPEG folders) and ``prepare --mode packed``: training items (T=8, 224, uint8) per core from one
DataLoader worker, bytes and files per video, the cores one GPU needs, the profile split of an
item, JPEG bytes per frame of the generated inputs next to the real clips'. Its rows are in
``data.json`` (``"table": "formats"``) and a second table of ``data.md``.

Frames are "same" when the mean absolute difference to the reference is below 3 grey levels
(other FFmpeg builds convert YUV to RGB slightly differently). Writes ``data.json`` / ``data.md``.
The machine may be shared: numbers are medians of interleaved repetitions; compare the ratios.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tsm_ds.data.splits import default_data, resolve_split

__all__ = ["DEFAULT_DATA", "LOADERS", "available_loaders", "make_long_video", "bench_input",
           "bench_dataset", "run_data_bench"]

_LOG = logging.getLogger(__name__)

#: the real clips: the training default (``$TSM_DS_DATA``, else ../shared/data/videos beside the
#: source checkout; :func:`tsm_ds.data.splits.default_data`), None when neither exists
DEFAULT_DATA = default_data()[0]
#: every loader :func:`available_loaders` knows, in table order
LOADERS: tuple[str, ...] = ("tsm_ds", "tsm_ds_short256", "decode_all", "torchcodec_exact",
                            "torchcodec_approx", "decord")


# ---------------------------------------------------------------------------------------------
def _tsm_ds(path: str, idx: list[int]) -> tuple[np.ndarray, int | None]:
    from tsm_ds.data import video

    st = video.DecodeStats()
    return video.decode_frames(path, idx, stats=st), st.decoded


def _tsm_ds_short(path: str, idx: list[int]) -> tuple[np.ndarray, int | None]:
    from tsm_ds.data import video

    st = video.DecodeStats()
    return video.decode_frames(path, idx, stats=st, short_side=256), st.decoded


def _decode_all(path: str, idx: list[int]) -> tuple[np.ndarray, int | None]:
    """Decode and convert every frame in order, keep the requested ones (holding all frames
    would need 1 GB for a 1-minute 360p video; the work is the same)."""
    from tsm_ds.data import video

    want = set(idx)
    kept: dict[int, np.ndarray] = {}
    n = 0
    frames = video.iter_decoded(path, thread_count=1)  # stops quietly at a decode error
    try:
        for frame in frames:
            try:
                img = video.to_rgb(frame)
            except Exception:  # a conversion error ends the pass like a decode error
                break
            if n in want:
                kept[n] = img
            n += 1
    finally:
        frames.close()
    last = max(kept) if kept else None
    return np.stack([kept.get(i, kept[last] if last is not None else None) for i in idx]), n


def _torchcodec(mode: str) -> Callable:
    from torchcodec.decoders import VideoDecoder

    def load(path: str, idx: list[int]):
        d = VideoDecoder(path, seek_mode=mode, num_ffmpeg_threads=1, dimension_order="NHWC")
        n = len(d)
        return d.get_frames_at([min(i, n - 1) for i in idx]).data.numpy(), None
    return load


def _decord() -> Callable:
    import decord

    def load(path: str, idx: list[int]):
        vr = decord.VideoReader(path, num_threads=1)
        n = len(vr)
        out = vr.get_batch([min(i, n - 1) for i in idx]).asnumpy()
        del vr
        return out, None
    return load


def available_loaders(names: list[str]) -> tuple[dict[str, Callable], dict[str, str]]:
    """{name: loader} for the loaders that import, and {name: why not} for the others."""
    loaders, missing = {}, {}
    for name in names:
        try:
            if name == "tsm_ds":
                loaders[name] = _tsm_ds
            elif name == "tsm_ds_short256":
                loaders[name] = _tsm_ds_short
            elif name == "decode_all":
                loaders[name] = _decode_all
            elif name.startswith("torchcodec_"):
                loaders[name] = _torchcodec("exact" if name.endswith("exact") else "approximate")
            elif name == "decord":
                loaders[name] = _decord()
            else:
                missing[name] = "unknown loader"
        except Exception as e:  # ImportError, or torchcodec without FFmpeg shared libraries
            missing[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return loaders, missing


def make_long_video(path: Path, minutes: float, keyint: int) -> str:
    """A textured 640x360 25 fps H.264 video (B-frames, fixed keyframe interval), made once.

    Returns ``str(path)``; an existing file is reused. The file is written atomically (a crash
    never leaves a truncated video under ``path``).
    """
    from tsm_ds.data.testvideo import write_numbered_video
    from tsm_ds.utils.io import atomic_path

    if path.is_file():
        return str(path)
    with atomic_path(path, suffix=path.suffix) as tmp:   # PyAV picks the container by extension
        write_numbered_video(tmp, int(minutes * 60 * 25), width=640, height=360, fps=25, gop=keyint,
                             bframes=3, texture=True, crf=28, preset="veryfast")
    return str(path)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()) < 3.0


def bench_input(name: str, files: list[str], loaders: dict[str, Callable], reps: int) -> list[dict]:
    """Time every loader on ``files`` (one 8-frame centre clip per file), interleaved."""
    from tsm_ds.data import video
    from tsm_ds.data.sampling import tsn_val_indices

    t0 = time.perf_counter()
    clips = [(f, tsn_val_indices(video.count_frames(f), 8).tolist()) for f in files]
    index_ms = (time.perf_counter() - t0) * 1e3 / len(files)
    # reference frames (decode everything in order) and a correctness pass per loader
    ref = {}
    for f, idx in clips:
        ref[f] = _decode_all(f, idx)[0]
    times: dict[str, list[float]] = {k: [] for k in loaders}
    decoded: dict[str, list[int]] = {k: [] for k in loaders}
    same: dict[str, float] = {}
    errors: dict[str, str] = {}
    for k, load in loaders.items():
        ok = tot = 0
        try:
            for f, idx in clips:
                out, nd = load(f, idx)
                if "short" in k:  # a smaller output on purpose: compare after scaling down
                    ok += len(idx) if out.shape[0] == len(idx) else 0
                else:
                    ok += sum(_same(out[j], ref[f][j]) for j in range(len(idx)))
                tot += len(idx)
                if nd is not None:
                    decoded[k].append(nd)
            same[k] = ok / tot
        except Exception as e:
            errors[k] = f"{type(e).__name__}: {e}"[:200]
    run = [(k, v) for k, v in loaders.items() if k not in errors]
    for rep in range(reps):
        # interleaved per clip, in a rotating order: a load change on the (shared) machine hits
        # every loader alike instead of whichever ran during it
        total = {k: 0.0 for k, _ in run}
        for c, (f, idx) in enumerate(clips):
            r = (rep + c) % len(run)
            for k, load in run[r:] + run[:r]:
                t = time.perf_counter()
                load(f, idx)
                total[k] += time.perf_counter() - t
        for k in total:
            times[k].append(total[k])
    rows = []
    for k in loaders:
        if k in errors:
            rows.append({"input": name, "loader": k, "clips_per_s": None, "error": errors[k]})
            continue
        med = statistics.median(times[k])
        rows.append({"input": name, "loader": k, "clips": len(clips),
                     "clips_per_s": len(clips) / med, "ms_per_clip": med * 1e3 / len(clips),
                     "best_clips_per_s": len(clips) / min(times[k]),
                     "frames_decoded_per_clip": (statistics.mean(decoded[k]) if decoded[k] else None),
                     "same_frames": None if "short" in k else same[k],
                     "index_ms_per_file": index_ms if k == "tsm_ds" else None})
    best_other = max((r["clips_per_s"] for r in rows if not r["loader"].startswith("tsm_ds")
                      and r.get("clips_per_s") is not None), default=None)
    for r in rows:
        if r["loader"].startswith("tsm_ds") and best_other and r.get("clips_per_s"):
            r["ratio_vs_best_other"] = r["clips_per_s"] / best_other
    return rows


def bench_dataset(files_labels: list[tuple[str, int]], workers: tuple[int, ...], reps: int) -> list[dict]:
    """Whole pipeline (decode + official train crop, uint8 items) through a DataLoader:
    clips/s of VideoClipDataset(mode="train", 8 segments, 224) with 0 and more worker processes."""
    import torch
    from torch.utils.data import DataLoader

    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord

    ds = VideoClipDataset([VideoRecord(p, label) for p, label in files_labels], num_segments=8,
                          mode="train", img_size=224)
    rows = []
    for w in workers:
        loader = DataLoader(ds, batch_size=4, num_workers=w, persistent_workers=w > 0,
                            shuffle=False)
        for _ in loader:  # warm up (worker start, frame indexes)
            pass
        times = []
        for epoch in range(reps):
            ds.set_epoch(epoch + 1)
            t = time.perf_counter()
            n = sum(b["clip"].shape[0] for b in loader)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        rows.append({"input": f"real clips ({len(ds)}), train items (decode + crop, uint8)",
                     "loader": f"VideoClipDataset, DataLoader workers={w}", "clips": n,
                     "clips_per_s": n / med, "ms_per_clip": med * 1e3 / n,
                     "torch_threads": torch.get_num_threads()})
        del loader
    return rows


def run_data_bench(out_dir: str | os.PathLike = "bench_out", *, data: str | os.PathLike | None = DEFAULT_DATA,
                   quick: bool = False, reps: int | None = None, minutes: float | None = None,
                   cache: str | os.PathLike | None = None, loaders: Sequence[str] = LOADERS,
                   formats: Sequence[str] | None = None, seconds: float | None = None,
                   format_clips: int | None = None,
                   log: Callable[[str], Any] = _LOG.info) -> tuple[list[dict], Path, Path]:
    """Run the loader benchmark (``tsm-ds bench data``) and write ``data.json`` / ``data.md``.

    Inputs: the real clips under ``data`` (a class-folder tree; skipped when it is not a folder)
    and two generated textured 360p videos of ``minutes`` minutes (keyframe every 250 and every
    25 frames, cached in ``cache``). Every available loader of ``loaders`` (:data:`LOADERS`) is
    timed on each (:func:`bench_input`), then the training pipeline through a DataLoader with 0
    and 2 workers on the real clips (:func:`bench_dataset`), then the format table
    (:func:`tsm_ds.bench.data_formats.bench_formats`) on generated Kinetics-like clips of
    ``seconds`` (640x360 and 1280x720) and ``format_clips`` of the real clips.

    Args:
        out_dir: folder of the report (created).
        quick: defaults for a CPU: 3 repetitions, 1-minute videos (explicit values win).
        reps: repetitions (default 5; quick 3); minutes: generated video length (default 5;
            quick 1); cache: folder of the generated videos (default ``out_dir/bench_videos``).
        formats: of :data:`tsm_ds.bench.data_formats.FORMATS` (default all; ``()``: no format
            table); seconds: generated Kinetics-like clip length (default 10; quick 2);
            format_clips: real clips in the format table (default all; quick 3, spread evenly).
        log: progress lines (skipped loaders, the input being measured).

    Returns:
        (rows, data.json path, data.md path); no rows when nothing could be measured. Rows of
        the format table carry ``"table": "formats"`` (and no ``loader``).

    Raises:
        OSError: ``out_dir`` or ``cache`` is not writable.
    """
    from tsm_ds.utils.io import append_markdown, write_report

    reps = reps or (3 if quick else 5)
    minutes = minutes or (1.0 if quick else 5.0)
    out_dir = Path(out_dir)
    cache = Path(cache) if cache else out_dir / "bench_videos"
    found, missing = available_loaders(list(loaders))
    for k, why in missing.items():
        log(f"bench data: loader {k} skipped ({why})")

    inputs: list[tuple[str, list[str]]] = []
    recs = []
    if data is not None and Path(data).is_dir():
        # every clip of the folder, resolved as training resolves --data (a manifest root or its
        # videos/ folder, train/ + val/ folders, a class-folder tree)
        recs = resolve_split(data=data).side("all")
        inputs.append((f"real clips ({len(recs)})", [r.path for r in recs]))
    else:
        log(f"bench data: no real clips at {data}; generated videos only")
    t = time.perf_counter()
    for keyint in (250, 25):
        p = make_long_video(cache / f"textured_{minutes:g}min_360p_key{keyint}.mp4", minutes, keyint)
        inputs.append((f"{minutes:g}-min 360p, keyframe every {keyint}", [p]))
    gen_s = time.perf_counter() - t

    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, files in inputs:
            log(f"bench data: {name} ...")
            rows += bench_input(name, files, found, reps)
        if recs:
            log("bench data: VideoClipDataset through a DataLoader ...")
            rows += bench_dataset([(r.path, r.label) for r in recs], (0, 2), max(2, reps - 1))
    fmt_rows, fmt_meta = _format_table(out_dir, cache, recs, data, quick=quick, reps=reps, formats=formats,
                                       seconds=seconds, format_clips=format_clips, log=log)
    meta = {"clip": "8 segment-centre frames (TSN val), 1 decoding thread", "repetitions": reps,
            "statistic": "clips_per_s: median over repetitions (loaders interleaved per clip in a "
                         "rotating order); best_clips_per_s: fastest repetition", "generated_video_minutes": minutes,
            "generation_s": round(gen_s, 1), "skipped_loaders": missing or "none",
            "note": "shared 2-core machine: compare ratios within one run"}
    cols = ["input", "loader", "clips_per_s", "best_clips_per_s", "ms_per_clip", "frames_decoded_per_clip",
            "same_frames", "ratio_vs_best_other", "index_ms_per_file"]
    jp, mp = write_report("data", rows + fmt_rows, out_dir, meta={**meta, "formats": fmt_meta}, columns=cols,
                          title="Clip decoding: tsm_ds loader vs alternatives")
    append_markdown(mp, _markdown(rows, cols, meta, fmt_rows, fmt_meta), replace=True)
    return rows + fmt_rows, jp, mp


def _format_table(out_dir: Path, cache: Path, recs: list, data, *, quick: bool, reps: int, formats, seconds,
                  format_clips, log) -> tuple[list[dict], dict]:
    """The inputs of the format table and its rows (:func:`tsm_ds.bench.data_formats.bench_formats`)."""
    from tsm_ds.bench import data_formats as F
    from tsm_ds.data.records import VideoRecord

    formats = F.FORMATS if formats is None else tuple(formats)
    if not formats:
        return [], {"skipped": "no formats asked for"}
    seconds = seconds or (2.0 if quick else 10.0)
    inputs = []
    for w, h in ((640, 360), (1280, 720)):
        p = F.make_kinetics_like(cache / f"kinetics_like_{seconds:g}s_{h}p_gop250.mp4", seconds, w, h)
        inputs.append({"name": f"generated {w}x{h} {seconds:g} s 30 fps GOP 250", "records": [VideoRecord(p, 0)],
                       "root": str(cache), "src_height": h})
    if recs:
        k = format_clips or (3 if quick else len(recs))
        pick = recs if k >= len(recs) else [recs[round(i * (len(recs) - 1) / max(1, k - 1))] for i in range(k)]
        inputs.append({"name": f"real clips ({len(pick)} of {len(recs)})", "records": pick, "root": str(data),
                       "src_height": None})
    rows, meta = F.bench_formats(inputs, out_dir / "bench_formats", formats=formats,
                                 reps=1 if quick else reps, budget_s=0.3 if quick else 3.0, batch=2 if quick else 4,
                                 profile_items=2 if quick else 8, log=log)
    for r in rows:
        r["table"] = "formats"
    return rows, meta


def _markdown(rows: list[dict], cols: list[str], meta: dict, fmt_rows: list[dict], fmt_meta: dict) -> str:
    """data.md: the loader table and its notes, then the format table and its notes."""
    from tsm_ds.bench.data_formats import FORMAT_COLUMNS
    from tsm_ds.utils.io import markdown_table

    md = "## Clip decoding: tsm_ds loader vs alternatives\n\n" + markdown_table(rows, cols) + "\n"
    md += "\n".join(f"- {k}: {v}" for k, v in meta.items()) + "\n"
    if fmt_rows:
        md += ("\n## Training items per core by data format\n\n" + markdown_table(fmt_rows, FORMAT_COLUMNS) + "\n"
               + "\n".join(f"- {k}: {v}" for k, v in fmt_meta.items()) + "\n")
    return md
