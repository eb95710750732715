"""``tsm-ds bench models``: throughput, cost and gradient size of TSM against its baselines.

Measures, side by side in one run (the machine may be shared, so every timed configuration is
repeated in an interleaved order - rep 1 of every model, then rep 2, ... - and medians and spreads
are reported, never single timings):

1. Model zoo: training step (forward + backward + SGD step) and inference (no-grad forward)
   clips/s for TSM-R50, TSN-R50, I3D-R50 at 32 frames in both reference layouts (``I3D-R50-32f``:
   non-local paper / mmaction2; ``I3D-R50-32f-release``: released non-local code) and
   torchvision's r2plus1d_18, r3d_18 and s3d, all at the same batch and image size; parameters,
   multiply-adds and FLOPs per clip; gradient bytes per step (= all-reduce payload) in fp32 /
   fp16 / bf16; ratios to TSM.
2. Shift overhead: TSM (fused in-place shift, the default), TSM with the official out-of-place
   shift, and TSN, ResNet-50 training steps at each ``--shift-sizes`` (default 112 and 224 px):
   the TSM/TSN step-time ratio (goal <= 1.03).
3. The shift op alone on a layer1-sized activation: the official out-of-place shift (zero-filled
   copy), the ``torch.cat`` reference, and the fused path's in-place shift + restore, against the
   memory-traffic bound (bytes that must move / measured copy bandwidth).

Each timing records wall time and the process's CPU time (``time.process_time``). On a shared
machine CPU time is the steadier measure (it counts only the cycles this process got); with
``--threads 1`` it equals the compute time of the step. Both ratios are printed and saved.

Source of the comparison: TSM paper (Lin et al., ICCV 2019) Table 1 / Sec. 5 (throughput vs I3D).
torchvision's s3d ends in a fixed 2x7x7 average pool; here it is replaced by a global average pool
so that it runs at any clip size (no multiply-adds change).

Kept whole: the three measurements share one interleaved timing harness (``_Runner``,
``_interleaved``, ``_stats``) and one entry point, :func:`run_models_bench`.
"""
from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from tsm_ds.utils.io import write_report

__all__ = ["build_zoo", "zoo_labels", "shift_overhead", "shift_op", "model_zoo", "run_models_bench"]

_LOG = logging.getLogger(__name__)
#: a progress callback: one line of text (the command passes ``print``)
Log = Callable[[str], Any]


class _NCTHW(nn.Module):
    """Adapter: torchvision video models take (N, 3, T, H, W); ours take (N, T, 3, H, W)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.transpose(1, 2))


def _video_model(name: str, num_classes: int) -> nn.Module:
    import torchvision.models.video as tvv

    net = getattr(tvv, name)(weights=None, num_classes=num_classes)
    if name == "s3d":
        net.avgpool = nn.AdaptiveAvgPool3d(1)
    return _NCTHW(net)


def build_zoo(num_classes: int, frames: int, video_frames: int
              ) -> list[tuple[str, Callable[[], nn.Module], int]]:
    """(label, factory, frames per clip) for every benchmarked model.

    The I3D rows are the two reference layouts at 32 frames (:mod:`tsm_ds.models.i3d`):
    ``I3D-R50-32f`` = the non-local paper's / mmaction2's ``i3d_r50`` (33.1 GMACs at 224 px),
    ``I3D-R50-32f-release`` = the released video-nonlocal-net code (113.6 GMACs).
    """
    from tsm_ds.models import build_model

    return [
        ("TSM-R50", lambda: build_model("resnet50", num_classes, num_segments=frames), frames),
        ("TSN-R50", lambda: build_model("resnet50", num_classes, num_segments=frames, shift=None),
         frames),
        ("I3D-R50-32f", lambda: build_model("i3d_resnet50", num_classes, num_segments=32,
                                            shift=None), 32),
        ("I3D-R50-32f-release", lambda: build_model("i3d_resnet50_release", num_classes,
                                                    num_segments=32, shift=None), 32),
        ("r2plus1d_18", lambda: _video_model("r2plus1d_18", num_classes), video_frames),
        ("r3d_18", lambda: _video_model("r3d_18", num_classes), video_frames),
        ("s3d", lambda: _video_model("s3d", num_classes), video_frames),
    ]


def zoo_labels() -> list[str]:
    """Labels of the benchmarked models, in table order (``TSM-R50``, ``TSN-R50``, ...)."""
    return [label for label, _, _ in build_zoo(400, 8, 16)]


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) since ``t0``."""
    w, c = _clock()
    return w - t0[0], c - t0[1]


class _Runner:
    """One model with its optimizer and a fixed random batch; ``train_step()`` / ``infer()`` time
    one step: (wall seconds, process CPU seconds)."""

    def __init__(self, model: nn.Module, batch: int, frames: int, img: int, num_classes: int):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(batch, frames, 3, img, img, generator=g)
        self.y = torch.randint(0, num_classes, (batch,), generator=g)

    def train_step(self) -> float:
        self.model.train()
        t0 = _clock()
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return _since(t0)

    def infer(self) -> float:
        self.model.eval()
        t0 = _clock()
        with torch.no_grad():
            self.model(self.x)
        return _since(t0)


def _interleaved(runners: dict[str, Callable[[], tuple[float, float]]], reps: int,
                 warmup: int = 1) -> dict[str, list[tuple[float, float]]]:
    """Run rep 1 of every runner, then rep 2, ... (load on a shared machine hits all alike); the
    order rotates by one each rep so that no runner always follows the same neighbour."""
    for _ in range(warmup):
        for fn in runners.values():
            fn()
    names = list(runners)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
    for r in range(reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(runners[k]())
    return times


def _stats(ts: list[tuple[float, float]]) -> dict[str, float]:
    """Median / min / max / spread of wall times, plus the median CPU time of the process.

    CPU time (``time.process_time``) counts only the cycles this process got, so on a shared
    machine it is far steadier than wall time; ratios are given for both.
    """
    wall = [w for w, _ in ts]
    cpu = [c for _, c in ts]
    med = statistics.median(wall)
    return {"median_s": med, "min_s": min(wall), "max_s": max(wall),
            "spread_pct": 100.0 * (max(wall) - min(wall)) / med,
            "cpu_median_s": statistics.median(cpu),
            "cpu_spread_pct": 100.0 * (max(cpu) - min(cpu)) / statistics.median(cpu)}


def shift_overhead(sizes: list[int], batch: int, frames: int, reps: int, num_classes: int = 400,
                   log: Log = _LOG.info) -> list[dict[str, Any]]:
    """TSM (fused) / TSM (official out-of-place shift) / TSN ResNet-50 training steps, interleaved.

    Returns one row per (image size, variant) with median/min/max step time and the ratio of the
    median to TSN's median at the same size.
    """
    from tsm_ds.models import build_model, use_fused_shift

    rows = []
    for img in sizes:
        tsm = build_model("resnet50", num_classes, num_segments=frames)
        tsn = build_model("resnet50", num_classes, num_segments=frames, shift=None)
        tsn.load_state_dict(tsm.state_dict())
        ref = build_model("resnet50", num_classes, num_segments=frames)
        ref.load_state_dict(tsm.state_dict())
        use_fused_shift(ref, False)   # the official out-of-place shift on this copy
        runners = {
            "TSM (fused shift)": _Runner(tsm, batch, frames, img, num_classes).train_step,
            "TSM (official out-of-place shift)": _Runner(ref, batch, frames, img, num_classes).train_step,
            "TSN (no shift)": _Runner(tsn, batch, frames, img, num_classes).train_step,
        }
        _official_patch(ref)
        times = _interleaved(runners, reps)
        base = _stats(times["TSN (no shift)"])
        for k, ts in times.items():
            st = _stats(ts)
            rows.append({"img_size": img, "variant": k, "batch": batch, "frames": frames, **st,
                         "ratio_to_TSN": st["median_s"] / base["median_s"],
                         "cpu_ratio_to_TSN": st["cpu_median_s"] / base["cpu_median_s"],
                         "reps": len(ts)})
            log(f"  {img}px {k:34s} wall median {st['median_s'] * 1e3:7.1f} ms "
                f"(min {st['min_s'] * 1e3:.1f}, max {st['max_s'] * 1e3:.1f}) x{rows[-1]['ratio_to_TSN']:.3f}"
                f" of TSN | CPU median {st['cpu_median_s'] * 1e3:7.1f} ms "
                f"(spread {st['cpu_spread_pct']:.0f}%) x{rows[-1]['cpu_ratio_to_TSN']:.3f} of TSN")
    return rows


def _official_patch(model: nn.Module) -> None:
    """Make the shift convs of ``model`` use the official zeros_like + slice-copy shift."""
    from tsm_ds.models.shift import ShiftConv2d, temporal_shift_official

    for m in model.modules():
        if isinstance(m, ShiftConv2d):
            def fwd(x, m=m):
                return nn.Conv2d.forward(m, temporal_shift_official(x, m.num_segments, m.shift_div,
                                                                    m.online))
            m.forward = fwd


def shift_op(batch: int, frames: int, img: int, reps: int, log: Log = _LOG.info) -> list[dict[str, Any]]:
    """Time the shift alone on a ResNet-50 layer1 input (N*T, 256, img/4, img/4), float32.

    Rows: official out-of-place (zeros_like + slices), torch.cat reference, fused path's in-place
    shift + restore, and the copy of the whole tensor (measures memory bandwidth). Each row has
    the bytes that must move and the bound = bytes / measured bandwidth.
    """
    from tsm_ds.models.shift import _moves, _shift_inplace, _unshift_inplace, temporal_shift, temporal_shift_official

    c, hw = 256, img // 4
    x = torch.randn(batch * frames, c, hw, hw)
    dst = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    moves = _moves(c, 8, False)
    x5 = x.view(batch, frames, c, hw, hw)

    def inplace():
        saved = _shift_inplace(x5, moves, save=True)
        _unshift_inplace(x5, moves, saved)

    fns = {
        "copy (bandwidth probe)": lambda: dst.copy_(x),
        "official out-of-place (zeros_like + slices)": lambda: temporal_shift_official(x, frames),
        "reference out-of-place (torch.cat)": lambda: temporal_shift(x, frames),
        "fused path: in-place shift + restore": inplace,
    }
    # bytes each must read + write at minimum
    moved = {"copy (bandwidth probe)": 2 * nbytes,
             "official out-of-place (zeros_like + slices)": 2 * nbytes,
             "reference out-of-place (torch.cat)": 2 * nbytes,
             "fused path: in-place shift + restore": 2 * 2 * (2 * nbytes // 8)}
    inner = 20

    def timed(fn):
        def run():
            t0 = _clock()
            for _ in range(inner):
                fn()
            w, c = _since(t0)
            return w / inner, c / inner
        return run

    times = _interleaved({k: timed(f) for k, f in fns.items()}, reps)
    bw = moved["copy (bandwidth probe)"] / _stats(times["copy (bandwidth probe)"])["median_s"]
    rows = []
    for k, ts in times.items():
        st = _stats(ts)
        bound = moved[k] / bw
        rows.append({"op": k, "shape": f"({batch * frames}, {c}, {hw}, {hw})",
                     "bytes_moved_min": moved[k], **st, "bound_s": bound,
                     "x_bound": st["median_s"] / bound, "bandwidth_GBps": bw / 1e9})
        log(f"  {k:44s} median {st['median_s'] * 1e6:9.1f} us, bound {bound * 1e6:8.1f} us "
            f"(x{st['median_s'] / bound:.2f})")
    return rows


def model_zoo(batch: int, img: int, frames: int, video_frames: int, reps: int,
              num_classes: int, only: Sequence[str] | None = None, log: Log = _LOG.info
              ) -> list[dict[str, Any]]:
    """Train and inference clips/s, params, MACs/FLOPs, gradient bytes for every zoo model."""
    from tsm_ds.models import complexity

    zoo = [z for z in build_zoo(num_classes, frames, video_frames) if not only or z[0] in only]
    runners, info = {}, {}
    for label, factory, t in zoo:
        model = factory()
        layout = "NCTHW" if isinstance(model, _NCTHW) else "NTCHW"
        target = model.net if isinstance(model, _NCTHW) else model
        c = complexity(target, num_segments=t, img_size=img, layout=layout)
        n_grad = sum(p.numel() for p in model.parameters() if p.requires_grad)
        info[label] = {"frames": t, **c, "grad_params": n_grad}
        r = _Runner(model, batch, t, img, num_classes)
        runners[label + "/train"] = r.train_step
        runners[label + "/infer"] = r.infer
    times = _interleaved(runners, reps)
    ref = "TSM-R50" if "TSM-R50" in info else next(iter(info))
    rows = []
    for label, d in info.items():
        tr, inf = _stats(times[label + "/train"]), _stats(times[label + "/infer"])
        rows.append({
            "model": label, "frames": d["frames"], "img_size": img, "batch": batch,
            "params_M": d["params"] / 1e6, "GMACs_per_clip": d["macs"] / 1e9,
            "GFLOPs_per_clip": d["flops"] / 1e9,
            "train_clips_per_s": batch / tr["median_s"], "train_spread_pct": tr["spread_pct"],
            "infer_clips_per_s": batch / inf["median_s"], "infer_spread_pct": inf["spread_pct"],
            "grad_MB_fp32": d["grad_params"] * 4 / 1e6, "grad_MB_fp16": d["grad_params"] * 2 / 1e6,
            "grad_MB_bf16": d["grad_params"] * 2 / 1e6,
            "train_step_s": tr["median_s"], "infer_step_s": inf["median_s"],
            "train_clips_per_cpu_s": batch / tr["cpu_median_s"],
            "infer_clips_per_cpu_s": batch / inf["cpu_median_s"],
            "train_cpu_spread_pct": tr["cpu_spread_pct"],
        })
    tsm_row = next(r for r in rows if r["model"] == ref)
    for r in rows:
        r["train_throughput_vs_TSM"] = r["train_clips_per_s"] / tsm_row["train_clips_per_s"]
        r["infer_throughput_vs_TSM"] = r["infer_clips_per_s"] / tsm_row["infer_clips_per_s"]
        r["train_cpu_throughput_vs_TSM"] = (r["train_clips_per_cpu_s"]
                                            / tsm_row["train_clips_per_cpu_s"])
        r["infer_cpu_throughput_vs_TSM"] = (r["infer_clips_per_cpu_s"]
                                            / tsm_row["infer_clips_per_cpu_s"])
        log(f"  {r['model']:12s} {r['frames']:3d}f train {r['train_clips_per_s']:7.3f} clips/s "
            f"(x{r['train_throughput_vs_TSM']:.2f} of TSM, spread {r['train_spread_pct']:.0f}%; "
            f"per CPU-s x{r['train_cpu_throughput_vs_TSM']:.2f})  "
            f"infer {r['infer_clips_per_s']:7.3f} clips/s (x{r['infer_throughput_vs_TSM']:.2f}; "
            f"per CPU-s x{r['infer_cpu_throughput_vs_TSM']:.2f})  "
            f"{r['GMACs_per_clip']:.1f} GMACs  {r['params_M']:.2f} M params  "
            f"grad {r['grad_MB_fp32']:.1f} MB fp32")
    return rows


def run_models_bench(out_dir: str | Path = "bench_out", *, img_size: int = 224, batch: int = 2,
                     frames: int = 8, video_frames: int = 16, reps: int = 5,
                     shift_sizes: Sequence[int] = (112, 224), shift_batch: int | None = None,
                     num_classes: int = 400, models: Sequence[str] | None = None,
                     skip: Sequence[str] = (), threads: int | None = None, quick: bool = False,
                     log: Log = _LOG.info) -> dict[str, Path]:
    """Run the models benchmark (``tsm-ds bench models``) and write its reports to ``out_dir``.

    Parts, each skipped when its name is in ``skip``: ``overhead`` (:func:`shift_overhead` at
    each of ``shift_sizes`` px, batch ``shift_batch``) -> ``shift_overhead.json/.md``; ``op``
    (:func:`shift_op`) -> ``shift_op.json/.md``; ``zoo`` (:func:`model_zoo`, the labels in
    ``models`` or all) -> ``models.json/.md``.

    Args:
        out_dir: output folder (created).
        img_size: model-zoo frame side (px); batch: clips per step; frames: TSM/TSN frames per
            clip; video_frames: frames per clip of the torchvision video models.
        reps: interleaved repetitions (medians are reported).
        shift_batch: batch of the shift comparison (default ``batch``).
        num_classes: classes of every model's head.
        models: a subset of the zoo labels of :func:`build_zoo` (``TSM-R50``, ``TSN-R50``, ...).
        threads: torch intra-op threads for this process (``torch.set_num_threads``; None keeps
            torch's setting).
        quick: reduced size for a CPU: 112 px, batch 1, 8-frame video models, shift batch 1,
            at most 3 zoo repetitions, 1 thread (overrides those arguments).
        log: progress lines (one per measured configuration).

    Returns:
        {report name: JSON path} of the reports written (``shift_overhead``, ``shift_op``,
        ``models``).

    Raises:
        ValueError: a label in ``models`` is not in the zoo.
    """
    unknown = [m for m in models or () if m not in zoo_labels()]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; choose from {', '.join(zoo_labels())}")
    zoo_reps = reps
    if quick:
        img_size, batch, video_frames = 112, 1, 8
        shift_batch = shift_batch or 1
        threads = threads or 1
        zoo_reps = min(reps, 3)
    if threads:
        torch.set_num_threads(threads)
    skip = set(skip)
    sb = shift_batch or batch
    torch.manual_seed(0)
    meta = {"batch": batch, "img_size": img_size, "frames": frames,
            "video_frames": video_frames, "reps": reps, "quick": quick,
            "threads": torch.get_num_threads(),
            "note": "interleaved repetitions; medians; the machine may be shared with other jobs"}
    written: dict[str, Path] = {}
    if "overhead" not in skip:
        log(f"[shift overhead] ResNet-50 training step, batch {sb} x {frames} frames, "
            f"{reps} interleaved reps")
        rows = shift_overhead(list(shift_sizes), sb, frames, reps, num_classes, log=log)
        written["shift_overhead"], _ = write_report(
            "shift_overhead", rows, out_dir, meta={**meta, "batch": sb},
            title="TSM vs TSN training step (ResNet-50)")
    if "op" not in skip:
        log(f"[shift op] layer1 activation, batch {sb} x {frames} frames, {img_size} px")
        rows = shift_op(sb, frames, img_size, max(reps, 5), log=log)
        written["shift_op"], _ = write_report("shift_op", rows, out_dir, meta=meta,
                                              title="Temporal shift op alone")
    if "zoo" not in skip:
        log(f"[models] batch {batch}, {img_size} px, {zoo_reps} interleaved reps")
        rows = model_zoo(batch, img_size, frames, video_frames, zoo_reps, num_classes,
                         list(models) if models else None, log=log)
        written["models"], _ = write_report("models", rows, out_dir, meta={**meta, "reps": zoo_reps},
                                            title="Video models: throughput, cost, gradient size")
    return written
