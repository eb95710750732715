"""``tsm-ds bench data``, format table: training items per core from each data format (issue 27).

For every input and every format, the inputs are prepared with
:func:`tsm_ds.data.prepare.prepare_dataset` and measured:

- ``clips_per_s_per_core``: :class:`~tsm_ds.data.dataset.VideoClipDataset` train items
  (``num_segments=8``, ``img_size=224``: random TSN frames, official multi-scale crop, flip; uint8
  (8, 3, 224, 224)) through a ``torch.utils.data.DataLoader`` with ONE worker process (PyTorch sets
  one torch thread in its workers; this process uses one too), uint8 batches counted in the main
  process, so the rate is what one CPU core delivers. The first batches (worker start, frame
  indexes) are not timed; then ``reps`` rounds, each one time box of ``budget_s`` per format of
  the input, interleaved in a rotating order (:func:`loader_rates_interleaved`), median;
  ``clips_per_cpu_s``: the timed clips per CPU second the worker used (what one core it had to
  itself delivers; a shared machine's load lowers the wall-clock rate, not this). Page cache:
  warm (every file was just written by prepare or read by the correctness check).
- ``bytes_per_clip``: on-disk bytes of a video's prepared file(s) (the folder's files for JPEG
  folders), mean over the videos; ``bytes_per_frame`` = that / frames; ``files_per_video``.
- ``cores_a100`` / ``cores_h100``: the cores the measured rate needs to feed one GPU
  (:data:`GPU_TRAIN_CLIPS_PER_S` / clips_per_s_per_core).
- Ratios side by side: ``vs_raw`` (clips/s over the raw video's on the same input), ``vs_frames``
  (over the JPEG folders'), ``bytes_vs_frames``.
- The profile split of one item, by timing the stages of the item path directly, one torch
  thread, CPU time of the thread, mean over ``profile_items`` items (ms): ``decode_ms`` = ``decode_frames`` (open,
  demux, decode; JPEG: the whole JPEG decode, its YCbCr -> RGB included) minus the conversion;
  ``convert_ms`` = YUV -> RGB (and the scaling to the decode short side done in the same swscale
  pass) of the kept frames, timed on the same decoded ``av.VideoFrame`` s with
  :func:`tsm_ds.data.video.to_rgb` (videos only); ``crop_resize_ms`` =
  :class:`~tsm_ds.data.transforms.ClipTransform` on the decoded frames; ``normalise_ms`` =
  :func:`~tsm_ds.data.transforms.normalize_batch` of a batch of 4 items / 4 (CPU, fp32);
  ``item_ms`` = the whole ``ds[i]`` (what the stages leave out: sampling, index lookups, the
  item dict, returning freed heap).
- ``same_frames`` (generated inputs): the fraction of the frames of 8 segment-centre clips per
  video, decoded from the prepared format, whose drawn frame number is the index asked for.

Inputs: generated Kinetics-like clips (:func:`make_kinetics_like`: H.264 30 fps, GOP 250, 640x360
and 1280x720, smooth multi-scale texture under a camera pan, a moving disc and film grain, the
frame number drawn as a bit grid) and the real clips. JPEG bytes per frame of the generated inputs
are reported next to the real clips' (synthetic content may decode faster than natural video).
"""
from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["GPU_TRAIN_CLIPS_PER_S", "GPU_RATE_SOURCES", "FORMATS", "FORMAT_NAMES", "available_formats",
           "kinetics_like_frame", "make_kinetics_like", "read_grid_number", "prepare_format", "disk_usage",
           "loader_rates_interleaved", "profile_item", "bench_formats", "FORMAT_COLUMNS"]

#: training clips/s one GPU eats (TSM-R50, 8 frames of 224, mixed precision): ResNet-50 trains at
#: about 2,470 images/s on one A100 (NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets
#: README, DGX A100, AMP) = ~300 clips of 8 frames; an H100 / H200 about twice that
GPU_TRAIN_CLIPS_PER_S: dict[str, float] = {"A100": 300.0, "H100/H200": 600.0}
#: where :data:`GPU_TRAIN_CLIPS_PER_S` comes from (printed in reports)
GPU_RATE_SOURCES = ("A100: ResNet-50 ~2,470 img/s mixed precision, 1 GPU of a DGX A100 (NVIDIA "
                    "DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5 README) / 8 frames "
                    "per clip = ~300 clips/s; H100/H200: ~2x the A100 = ~600 clips/s")
#: the formats measured, in table order
FORMATS: tuple[str, ...] = ("raw", "video", "frames", "packed")
#: how a format is named in the tables (and by the doctor)
FORMAT_NAMES = {"raw": "raw video", "video": "re-encoded video", "frames": "JPEG folders", "packed": "packed"}
#: the prepare options of each prepared format (the defaults `tsm-ds prepare` advises)
FORMAT_OPTIONS: dict[str, dict[str, Any]] = {"video": {"short_side": 256, "keyint": 16},
                                             "frames": {"short_side": 256}, "packed": {"short_side": 256}}
#: columns of the format table
FORMAT_COLUMNS = ["input", "format", "clips_per_s_per_core", "clips_per_cpu_s", "vs_raw", "vs_frames", "cores_a100",
                  "cores_h100", "bytes_per_clip", "bytes_vs_frames", "bytes_per_frame", "files_per_video", "decode_ms",
                  "convert_ms", "crop_resize_ms", "normalise_ms", "item_ms", "frames_decoded_per_clip",
                  "same_frames"]


def available_formats() -> tuple[str, ...]:
    """The formats of :data:`FORMATS` this checkout can prepare (``packed`` needs the packed
    mode of ``tsm-ds prepare``: :data:`tsm_ds.data.prepare.MODES`)."""
    from tsm_ds.data import prepare

    modes = getattr(prepare, "MODES", ("video", "frames"))
    return tuple(f for f in FORMATS if f == "raw" or f in modes)


# ---------------------------------------------------------------------------------------------
# generated Kinetics-like inputs

def _canvas(width: int, height: int, frames: int, seed: int = 0) -> np.ndarray:
    """float32 (H + pad, W + pan, 3) smooth multi-scale texture (octaves of bilinearly upsampled
    noise, larger features stronger: a 1/f-like spectrum as in natural images)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    H, W = height + 64, width + 2 * frames + 64
    img = torch.zeros(3, H, W)
    for cell, amp in ((96, 1.0), (32, 0.6), (12, 0.35), (4, 0.18)):
        noise = torch.rand(1, 3, H // cell + 2, W // cell + 2, generator=g)
        img += amp * F.interpolate(noise, size=(H, W), mode="bicubic", align_corners=False)[0]
    img -= img.amin(dim=(1, 2), keepdim=True)
    img *= 255.0 / img.amax(dim=(1, 2), keepdim=True).clamp_min(1e-6)
    return img.permute(1, 2, 0).contiguous().numpy()


def _cell(height: int) -> int:
    """Side of one bit cell of the frame-number grid: ~1/15 of the height (>= 16 px after a
    prepare to a short side of 256)."""
    return max(16, int(round(height / 15)))


def kinetics_like_frame(i: int, canvas: np.ndarray, width: int, height: int, *, seed: int = 0) -> np.ndarray:
    """Frame ``i`` of a generated clip: uint8 (height, width, 3) RGB.

    The view pans 2 px per frame over ``canvas`` (:func:`make_kinetics_like` builds it), a
    shaded disc crosses the picture, film grain (+-4 grey levels) changes every frame, and the
    frame number ``i`` (< 65536) is drawn as a 2 x 8 grid of flat black / white cells at the top
    left (:func:`read_grid_number` reads it back).
    """
    y0 = int(16 + 16 * math.sin(i / 20.0))
    img = canvas[y0:y0 + height, 2 * i:2 * i + width].copy()
    cx, cy, r = (0.2 + 0.6 * ((i % 150) / 150)) * width, 0.6 * height, 0.12 * height
    ya, yb, xa, xb = int(cy - r - 1), int(cy + r + 2), max(0, int(cx - r - 1)), min(width, int(cx + r + 2))
    yy, xx = np.ogrid[ya:yb, xa:xb]
    disc = np.clip(r - np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2), 0, 1).astype(np.float32)[..., None]
    shade = (200 - 60 * (yy / height)).astype(np.float32)[..., None]
    img[ya:yb, xa:xb] = img[ya:yb, xa:xb] * (1 - disc) + disc * shade
    rng = np.random.default_rng([seed, i])
    img += rng.integers(-4, 5, img.shape[:2], dtype=np.int8)[..., None]
    out = np.clip(img, 0, 255).astype(np.uint8)
    c = _cell(height)
    for b in range(16):
        row, col = divmod(b, 8)
        out[row * c:(row + 1) * c, col * c:(col + 1) * c] = 255 if (i >> b) & 1 else 0
    return out


def read_grid_number(img: np.ndarray, src_height: int) -> int:
    """The number :func:`kinetics_like_frame` drew into a frame of a clip ``src_height`` pixels high,
    from ``img`` (uint8 (h, w, 3), the frame at any scale: the grid scales with it)."""
    c = _cell(src_height) * img.shape[0] / src_height
    n = 0
    for b in range(16):
        row, col = divmod(b, 8)
        y, x = int((row + 0.5) * c), int((col + 0.5) * c)
        q = max(1, int(c / 4))
        if img[y - q:y + q, x - q:x + q].mean() > 128:
            n |= 1 << b
    return n


def make_kinetics_like(path: str | os.PathLike, seconds: float, width: int, height: int, *, fps: int = 30,
                       gop: int = 250, crf: int = 23, seed: int = 0) -> str:
    """A Kinetics-like H.264 clip (:func:`kinetics_like_frame` frames), made once.

    libx264 (FFmpeg through PyAV), yuv420p, ``fps`` frames/s, a keyframe every ``gop`` frames
    (scene cuts off), 3 B-frames, ``crf``, preset veryfast: as a typical web download. An existing
    file is reused; the file is written atomically.

    Returns:
        ``str(path)``.

    Raises:
        OSError: the folder is not writable.
    """
    import av

    from tsm_ds.utils.io import atomic_path

    path = Path(path)
    if path.is_file():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = int(round(seconds * fps))
    canvas = _canvas(width, height, n, seed)
    with atomic_path(path, suffix=path.suffix) as tmp, av.open(str(tmp), "w") as out:
        s = out.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.codec_context.thread_count = 0
        s.options = {"crf": str(crf), "preset": "veryfast",
                     "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=3"}
        for i in range(n):
            f = av.VideoFrame.from_ndarray(kinetics_like_frame(i, canvas, width, height, seed=seed), format="rgb24")
            f.pts = i
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return str(path)


# ---------------------------------------------------------------------------------------------
# preparing and measuring one format

def disk_usage(path: str | os.PathLike) -> tuple[int, int]:
    """(bytes, files) on disk of a prepared video: the file, or every file of a JPEG folder."""
    if os.path.isdir(path):
        sizes = [e.stat().st_size for e in os.scandir(path) if e.is_file()]
        return sum(sizes), len(sizes)
    return os.path.getsize(path), 1


def prepare_format(records: Sequence, src_root: str | os.PathLike, out_root: str | os.PathLike,
                   fmt: str) -> tuple[list, list[str]]:
    """Prepare ``records`` in format ``fmt`` (``raw``: the records themselves) under ``out_root``.

    Uses :func:`tsm_ds.data.prepare.prepare_dataset` with :data:`FORMAT_OPTIONS` (one process, an
    existing output is reused).

    Returns:
        (the prepared ``VideoRecord`` s, in record order, ``num_frames`` set for JPEG folders;
        ``"src: reason"`` of the files prepare could not read).

    Raises:
        ValueError: an unknown format. OSError: ``out_root`` is not writable.
    """
    from tsm_ds.data.prepare import prepare_dataset
    from tsm_ds.data.records import VideoRecord

    if fmt == "raw":
        return list(records), []
    if fmt not in FORMAT_OPTIONS:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = prepare_dataset(records, str(src_root), str(out_root), mode=fmt, workers=1, progress=False,
                               **FORMAT_OPTIONS[fmt])
    out = [VideoRecord(os.path.join(out_root, r["out"]), r["label"],
                       r["num_frames"] if fmt == "frames" else None) for r in rows if r["status"] != "failed"]
    return out, [f"{r['src']}: {r['reason']}" for r in rows if r["status"] == "failed"]


def _train_ds(records: Sequence, length: int | None = None):
    from tsm_ds.data.dataset import VideoClipDataset

    recs = list(records)
    if length:
        recs = (recs * (length // len(recs) + 1))[:length]
    return VideoClipDataset(recs, num_segments=8, mode="train", img_size=224, seed=0)


class _OneWorker:
    """A one-worker DataLoader over ``records`` kept open, so that time boxes of several formats
    can be interleaved (the worker of a format not being timed waits with a full queue)."""

    def __init__(self, records: Sequence, batch: int):
        from torch.utils.data import DataLoader

        self.dl = DataLoader(_train_ds(records, 20_000), batch_size=batch, num_workers=1, shuffle=False,
                             persistent_workers=False, prefetch_factor=2)
        self.it = iter(self.dl)
        self.prefetch = 2

    def worker_cpu_s(self) -> float | None:
        """CPU seconds (user + system) the worker process has used (Linux /proc), None elsewhere."""
        try:
            pid = self.it._workers[0].pid
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (AttributeError, IndexError, OSError, ValueError):
            return None

    def box(self, budget_s: float, min_batches: int) -> tuple[int, float, float | None]:
        """Drain the batches prepared while waiting (untimed), then count clips for ``budget_s``;
        returns (clips, wall seconds, the worker's CPU seconds meanwhile or None)."""
        import torch

        for _ in range(self.prefetch):
            next(self.it)
        c0 = self.worker_cpu_s()
        n, b, t0 = 0, 0, time.perf_counter()
        while b < min_batches or time.perf_counter() - t0 < budget_s:
            x = next(self.it)["clip"]
            assert x.dtype == torch.uint8
            n += int(x.shape[0])
            b += 1
        wall, c1 = time.perf_counter() - t0, self.worker_cpu_s()
        return n, wall, (c1 - c0) if c0 is not None and c1 is not None else None

    def close(self) -> None:
        """Stop the worker."""
        del self.it


def loader_rates_interleaved(prepared: dict[str, Sequence], *, reps: int = 3, budget_s: float = 2.0,
                             batch: int = 4, min_batches: int = 2) -> dict[str, dict[str, Any]]:
    """Training items per second from ONE DataLoader worker per format, uint8 batches counted
    here, the formats' time boxes interleaved (round r times the formats in an order rotated by r),
    so that a shared machine's load falls on every format alike.

    Args:
        prepared: {format: its (prepared) records}; records are cycled (each index draws its own
            frames and crop).
        reps: rounds; each round one time box of ``budget_s`` seconds (at least ``min_batches``
            batches) per format, after draining the batches its worker prepared while waiting.
        batch: clips per batch.

    Returns:
        {format: ``{"clips_per_s": median over the rounds, "best_clips_per_s", "clips": timed
        clips, "reps": [clips/s of each round], "clips_per_cpu_s": timed clips per CPU second of
        the worker (user + system, /proc; None where unavailable): the rate of one core the worker
        had to itself, which a shared machine's load does not lower}``}.

    Raises:
        RuntimeError: a dataset gave up on unreadable files (VideoClipDataset).
    """
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    loaders = {}
    try:
        for f, recs in prepared.items():
            loaders[f] = _OneWorker(recs, batch)
            for _ in range(2):   # worker start, frame indexes
                next(loaders[f].it)
        rates: dict[str, list[float]] = {f: [] for f in prepared}
        total, cpu = dict.fromkeys(prepared, 0), dict.fromkeys(prepared, 0.0)
        order = list(prepared)
        for r in range(reps):
            for f in order[r % len(order):] + order[:r % len(order)]:
                n, secs, cpu_s = loaders[f].box(budget_s, min_batches)
                rates[f].append(n / secs)
                total[f] += n
                cpu[f] = None if cpu_s is None or cpu[f] is None else cpu[f] + cpu_s
    finally:
        for ld in loaders.values():
            ld.close()
        torch.set_num_threads(old)
    return {f: {"clips_per_s": statistics.median(v), "best_clips_per_s": max(v), "clips": total[f], "reps": v,
                "clips_per_cpu_s": total[f] / cpu[f] if cpu[f] else None}
            for f, v in rates.items()}


def _kept_av_frames(path: str, targets: Sequence[int]) -> list:
    """The decoded ``av.VideoFrame`` s of frame indices ``targets`` (a sequential pass)."""
    from tsm_ds.data import video

    want, kept = set(targets), []
    frames = video.iter_decoded(path, thread_count=1)
    try:
        for k, f in enumerate(frames):
            if k in want:
                kept.append(f)
            if k >= max(want):
                break
    finally:
        frames.close()
    return kept


def profile_item(records: Sequence, n: int = 8) -> dict[str, float | None]:
    """The stages of ``n`` train items timed directly (ms per item, means; see the module docstring).

    Times are this thread's CPU time (``time.thread_time``; one torch thread, one decoder thread,
    so every stage runs on this thread): a shared machine's load does not inflate them.

    Returns:
        ``{"decode_ms", "convert_ms" (None for JPEG formats: inside the JPEG decoder),
        "crop_resize_ms", "normalise_ms", "item_ms", "frames_decoded_per_clip" (None for JPEG)}``.
    """
    import torch

    from tsm_ds.data import video
    from tsm_ds.data.sampling import clip_indices
    from tsm_ds.data.transforms import normalize_batch
    from tsm_ds.data.video.convert import _out_size

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    ds = _train_ds(records, max(n, len(records)))
    dec, conv, crop, item, decoded = [], [], [], [], []
    clips = []
    try:
        for i in range(n):
            rec = ds.records[i]
            is_video = not os.path.isdir(rec.path) and not rec.path.endswith(video.PACK_EXTENSION)
            nf = rec.num_frames if rec.num_frames and os.path.isdir(rec.path) else video.count_frames(rec.path)
            idx = clip_indices(nf, 8, mode="train", rng=np.random.default_rng([0, i])).reshape(-1)
            st = video.DecodeStats()
            t = time.thread_time()
            frames = video.decode_frames(rec.path, idx, num_frames=nf, short_side=ds.decode_short_side, stats=st)
            dec.append(time.thread_time() - t)
            if is_video:
                decoded.append(st.decoded)
                avf = _kept_av_frames(rec.path, sorted(set(int(j) for j in idx)))
                t = time.thread_time()
                for f in avf:
                    video.to_rgb(f, _out_size(f, ds.decode_short_side))
                conv.append(time.thread_time() - t)
            t = time.thread_time()
            clips.append(ds.transform(frames, np.random.default_rng([1, i])))
            crop.append(time.thread_time() - t)
            t = time.thread_time()
            ds[i]
            item.append(time.thread_time() - t)
        b = torch.stack(clips[:4])
        norm = []
        for _ in range(3):
            t = time.thread_time()
            normalize_batch(b, *ds.normalization)
            norm.append((time.thread_time() - t) / b.shape[0])
    finally:
        torch.set_num_threads(old)
    c = 1e3 * statistics.mean(conv) if conv else None
    return {"decode_ms": 1e3 * statistics.mean(dec) - (c or 0.0), "convert_ms": c,
            "crop_resize_ms": 1e3 * statistics.mean(crop), "normalise_ms": 1e3 * min(norm),
            "item_ms": 1e3 * statistics.mean(item),
            "frames_decoded_per_clip": statistics.mean(decoded) if decoded else None}


def _same_frames(records: Sequence, src_height: int) -> float:
    """Fraction of 8 segment-centre frames per record whose drawn number is the index asked for."""
    from tsm_ds.data import video
    from tsm_ds.data.sampling import tsn_val_indices

    ok = tot = 0
    for r in records:
        nf = r.num_frames if r.num_frames and os.path.isdir(r.path) else video.count_frames(r.path)
        idx = tsn_val_indices(nf, 8).tolist()
        frames = video.decode_frames(r.path, idx, num_frames=nf)
        ok += sum(read_grid_number(f, src_height) == i for f, i in zip(frames, idx))
        tot += len(idx)
    return ok / max(1, tot)


def bench_formats(inputs: Sequence[dict[str, Any]], work_dir: str | os.PathLike, *,
                  formats: Sequence[str] = FORMATS, reps: int = 3, budget_s: float = 2.0, batch: int = 4,
                  profile_items: int = 8, log: Callable[[str], Any] = print) -> tuple[list[dict], dict[str, Any]]:
    """The format table (module docstring): every input prepared in every format and measured.

    Args:
        inputs: ``{"name", "records" (VideoRecord s), "root" (the folder their paths are relative
            to), "src_height" (generated inputs: the height the frame-number grid was drawn at;
            None for real clips)}`` each.
        work_dir: where the prepared copies go (``<work_dir>/<input #>/<format>``; reused when
            present).
        formats: of :data:`FORMATS`; those :func:`available_formats` lacks are skipped (in meta).
        reps, budget_s, batch: :func:`loader_rates_interleaved`; profile_items: :func:`profile_item`.
        log: progress lines.

    Returns:
        (rows with :data:`FORMAT_COLUMNS` and ``input_kind`` / ``prepare_s`` / ``failed``,
        meta: GPU rates and sources, skipped formats, JPEG bytes per frame of every input and
        the generated / real ratio, page-cache state, how it was timed).

    Raises:
        OSError: ``work_dir`` is not writable.
    """
    have = available_formats()
    skipped = {f: "tsm-ds prepare has no such mode in this checkout" for f in formats if f not in have}
    run = [f for f in formats if f in have]
    rows: list[dict[str, Any]] = []
    for k, inp in enumerate(inputs):
        recs = list(inp["records"])
        to_time: dict[str, tuple] = {}
        for fmt in run:
            log(f"bench data: formats: {inp['name']}: {FORMAT_NAMES[fmt]} ...")
            t = time.perf_counter()
            prepared, failed = prepare_format(recs, inp["root"], Path(work_dir) / f"input{k}" / fmt, fmt)
            prep_s = time.perf_counter() - t
            row: dict[str, Any] = {"input": inp["name"], "format": FORMAT_NAMES[fmt],
                                   "input_kind": "generated" if inp.get("src_height") else "real",
                                   "videos": len(prepared), "prepare_s_per_video": prep_s / max(1, len(recs)),
                                   "failed": failed}
            if not prepared:
                rows.append({**row, "error": "nothing prepared"})
                continue
            use = [disk_usage(r.path) for r in prepared]
            nframes = []
            from tsm_ds.data import video
            for r in prepared:
                nframes.append(r.num_frames if r.num_frames and os.path.isdir(r.path) else video.count_frames(r.path))
            row["bytes_per_clip"] = statistics.mean(b for b, _ in use)
            row["files_per_video"] = statistics.mean(f for _, f in use)
            row["bytes_per_frame"] = sum(b for b, _ in use) / sum(nframes)
            row["frames_per_video"] = statistics.mean(nframes)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if inp.get("src_height"):
                    row["same_frames"] = _same_frames(prepared, inp["src_height"])
                row.update(profile_item(prepared, profile_items))
            rows.append(row)
            to_time[fmt] = (row, prepared)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = loader_rates_interleaved({f: p for f, (_, p) in to_time.items()}, reps=reps,
                                           budget_s=budget_s, batch=batch)
        for f, (row, _) in to_time.items():
            cps = got[f]["clips_per_s"]
            row.update(clips_per_s_per_core=cps, clips_per_cpu_s=got[f]["clips_per_cpu_s"],
                       best_clips_per_s_per_core=got[f]["best_clips_per_s"],
                       timed_clips=got[f]["clips"], cores_a100=GPU_TRAIN_CLIPS_PER_S["A100"] / cps,
                       cores_h100=GPU_TRAIN_CLIPS_PER_S["H100/H200"] / cps)
        base = {r["format"]: r for r in rows if r["input"] == inp["name"] and r.get("clips_per_s_per_core")}
        for r in rows:
            if r["input"] != inp["name"] or not r.get("clips_per_s_per_core"):
                continue
            if "raw video" in base:
                r["vs_raw"] = r["clips_per_s_per_core"] / base["raw video"]["clips_per_s_per_core"]
            if "JPEG folders" in base:
                r["vs_frames"] = r["clips_per_s_per_core"] / base["JPEG folders"]["clips_per_s_per_core"]
                r["bytes_vs_frames"] = r["bytes_per_clip"] / base["JPEG folders"]["bytes_per_clip"]
    jpeg = {r["input"]: r["bytes_per_frame"] for r in rows if r["format"] == "JPEG folders" and "bytes_per_frame" in r}
    gen = [v for r in rows for k, v in jpeg.items() if r["input"] == k and r["input_kind"] == "generated"]
    real = [v for r in rows for k, v in jpeg.items() if r["input"] == k and r["input_kind"] == "real"]
    meta: dict[str, Any] = {
        "gpu_train_clips_per_s": GPU_TRAIN_CLIPS_PER_S, "gpu_rate_sources": GPU_RATE_SOURCES,
        "items": "VideoClipDataset train, 8 segments, 224 crop, uint8 (8, 3, 224, 224)",
        "timing": f"1 DataLoader worker (1 torch thread) per format, batch {batch}, uint8 batches counted in "
                  f"the main process (1 torch thread); first 2 batches untimed, then {reps} round(s) of one "
                  f"{budget_s:g} s time box per format, interleaved in rotating order, median",
        "page_cache": "warm: every file was just written by prepare or read by the checks",
        "profile": "stages of the item path timed directly, 1 thread (bench/data_formats.py profile_item)",
        "jpeg_bytes_per_frame": jpeg, "skipped_formats": skipped or "none"}
    if gen and real:
        meta["jpeg_bytes_per_frame_generated_vs_real"] = statistics.mean(gen) / statistics.mean(real)
    return rows, meta
