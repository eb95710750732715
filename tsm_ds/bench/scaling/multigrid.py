"""The scaling model with the multigrid shape schedule: the training time of a data-parallel run whose
steps follow :func:`tsm_ds.engine.loop.multigrid.build_schedule` (Wu et al., "A Multigrid Method for
Efficiently Training Video Models", CVPR 2020, Sec. 3-4; PySlowFast's defaults).

A step at shape (t frames, crop s, batch factor b) is the base step of the model
(:func:`~tsm_ds.bench.scaling.model.step_breakdown`) with every GPU's micro-batch ``b x batch_per_gpu``
clips of ``t`` frames: compute scaled by the step's clips x frames x pixels over the base step's
(``b t s^2 / (T S^2)``, 1.00-1.02 for the long cycle: the schedule keeps it about constant), the same
gradient all-reduce (the same parameters), data loading of ``b x batch_per_gpu x t`` frames (the
loader decodes frames at the source resolution whatever the crop: docs/multigrid.md, "Step time per
shape"). The run's time is the sum over the schedule's optimizer steps (:meth:`MultigridSchedule.epoch_steps`,
epoch by epoch, clips that do not fill a step dropped, as PySlowFast's sampler): its step-count factor
(:meth:`MultigridSchedule.total_steps` over the base's ``epochs x steps_per_epoch``) is what saves time.

What it does not model: whether accuracy holds at the schedule's global batches (at 12,288 clips a
base step, the long cycle's first shape steps 98,304 clips: beyond any batch the large-batch papers
show), nor a loader slower than the model at the small shapes.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

from tsm_ds.bench.scaling.model import format_duration, step_breakdown, steps_per_epoch
from tsm_ds.bench.scaling.presets import Cluster, Workload

__all__ = ["KINETICS_LR_STEPS", "multigrid_time", "gpus_for_time", "base_gpus_for_time", "multigrid_summary"]

#: the official Kinetics recipe's lr steps (epochs; TSM ``main.py``: 50 epochs, x0.1 at 20 and 40)
KINETICS_LR_STEPS = (20.0, 40.0)


def _schedule(w: Workload, gpus: int, *, crop: int, lr_steps: Sequence[float], mode: str, epoch_factor: float):
    from tsm_ds.engine.loop.multigrid import build_schedule

    return build_schedule(frames=w.frames, crop=crop, global_batch=gpus * w.batch_per_gpu, epochs=w.epochs,
                          lr_steps=lr_steps, mode=mode, epoch_factor=epoch_factor)


def multigrid_time(w: Workload, cluster: Cluster, gpus: int, ref_compute_s: float, *, crop: int = 224,
                   lr_steps: Sequence[float] = KINETICS_LR_STEPS, mode: str = "long",
                   epoch_factor: float = 1.5) -> dict[str, Any]:
    """Training time of ``w`` on ``gpus`` GPUs of ``cluster`` with the multigrid schedule.

    Args:
        w: the workload (its ``frames``, ``epochs``, ``batch_per_gpu``, ``dataset_size`` are the base
            recipe's); ref_compute_s: the calibrated compute per base step
            (:func:`~tsm_ds.bench.scaling.model.calibrate`).
        crop: the base crop S (px); lr_steps, mode, epoch_factor: the schedule's
            (:func:`~tsm_ds.engine.loop.multigrid.build_schedule`).

    Returns:
        {"gpus", "mode", "epoch_factor", "epochs" (the schedule's), "steps", "base_steps",
        "step_factor" (steps / base_steps), "train_time_s", "base_time_s", "speedup" (base / with the
        schedule), "train_time", "max_global_batch", "dropped_per_epoch_max" (clips of an epoch that fill
        no step, at the worst stage), "shapes": [{"frames", "crop", "global_batch", "steps", "step_s",
        "bound"}]}.

    Raises:
        ValueError: a stage whose step needs more clips than an epoch has (too many GPUs for the
            schedule's largest batch), or the schedule's own refusals.
    """
    sch = _schedule(w, gpus, crop=crop, lr_steps=lr_steps, mode=mode, epoch_factor=epoch_factor)
    epoch_clips = math.ceil(w.dataset_size / gpus) * gpus
    base_ideal = w.frames * crop * crop
    counts: dict[tuple[int, int, int], int] = {}
    dropped = 0
    for st in sch.stages:
        steps = sch.epoch_steps(st.epoch_start, epoch_clips)
        if not steps:
            raise ValueError(f"{gpus} GPUs: stage {st.epoch_start}-{st.epoch_end} needs "
                             f"{st.shapes[0].global_batch} clips a step and an epoch has {epoch_clips}")
        dropped = max(dropped, epoch_clips - sum(x.global_batch for x in steps))
        for x in steps:
            key = (x.frames, x.crop, x.batch_factor)
            counts[key] = counts.get(key, 0) + st.epochs
    shapes, total = [], 0.0
    for (t, s, b), n in sorted(counts.items(), key=lambda kv: kv[0][0] * kv[0][1] ** 2):
        ws = replace(w, frames=t, batch_per_gpu=w.batch_per_gpu * b,
                     compute_ratio=w.compute_ratio * b * t * s * s / base_ideal)
        row = step_breakdown(ws, cluster, gpus, ref_compute_s)
        shapes.append({"frames": t, "crop": s, "global_batch": gpus * w.batch_per_gpu * b, "steps": n,
                       "step_s": row["step_s"], "bound": row["bound"]})
        total += n * row["step_s"]
    base = step_breakdown(w, cluster, gpus, ref_compute_s)
    base_steps = w.epochs * steps_per_epoch(w, gpus)
    steps = sum(counts.values())
    return {"gpus": gpus, "mode": mode, "epoch_factor": epoch_factor, "epochs": sch.epochs, "steps": steps,
            "base_steps": base_steps, "step_factor": steps / base_steps, "train_time_s": total,
            "base_time_s": base["train_time_s"], "speedup": base["train_time_s"] / total,
            "train_time": format_duration(total), "max_global_batch": max(x["global_batch"] for x in shapes),
            "dropped_per_epoch_max": dropped, "shapes": shapes}


def gpus_for_time(w: Workload, cluster: Cluster, ref_compute_s: float, target_s: float, *, max_gpus: int,
                  **schedule: Any) -> dict[str, Any] | None:
    """The fewest GPUs (whole nodes of ``cluster``) whose run with the schedule takes at most
    ``target_s``: :func:`multigrid_time` at that count, or None when no count up to ``max_gpus`` does
    (or the schedule refuses them all). Bisection over nodes (the time falls as nodes are added), then
    a step back node by node while the time still holds (the rounding of steps per epoch is not
    monotone)."""
    g = cluster.gpus_per_node

    def t(nodes: int) -> float:
        try:
            return multigrid_time(w, cluster, nodes * g, ref_compute_s, **schedule)["train_time_s"]
        except ValueError:
            return math.inf

    lo, hi = 1, max(1, max_gpus // g)
    if t(hi) > target_s:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if t(mid) <= target_s:
            hi = mid
        else:
            lo = mid + 1
    while lo > 1 and t(lo - 1) <= target_s:
        lo -= 1
    return multigrid_time(w, cluster, lo * g, ref_compute_s, **schedule)


def base_gpus_for_time(w: Workload, cluster: Cluster, ref_compute_s: float, target_s: float, *,
                       max_gpus: int) -> int | None:
    """The fewest GPUs (whole nodes) whose run without the schedule takes at most ``target_s`` by the same
    model (:func:`~tsm_ds.bench.scaling.model.step_breakdown`), or None up to ``max_gpus``."""
    g = cluster.gpus_per_node
    for nodes in range(1, max(1, max_gpus // g) + 1):
        if step_breakdown(w, cluster, nodes * g, ref_compute_s)["train_time_s"] <= target_s:
            return nodes * g
    return None


def multigrid_summary(w: Workload, cluster: Cluster, ref_compute_s: float, *, gpus: int, target_s: float,
                      max_gpus: int, epoch_factors: Sequence[float] = (1.5, 1.0), **schedule: Any) -> list[dict]:
    """Per epoch factor: the run on ``gpus`` GPUs with the long-cycle schedule and the fewest GPUs that
    reach ``target_s`` (the paper's 14 min 13 s), beside the fewest the base needs by the same model.
    Rows: {"epoch_factor", "at_gpus" (:func:`multigrid_time` without "shapes"), "shapes", "gpus_for_target"
    (GPUs or None), "time_for_target_s", "base_gpus_for_target"}; a schedule the GPU count cannot run gives
    "error" instead."""
    base_n = base_gpus_for_time(w, cluster, ref_compute_s, target_s, max_gpus=max_gpus)
    rows = []
    for f in epoch_factors:
        try:
            at = multigrid_time(w, cluster, gpus, ref_compute_s, epoch_factor=f, **schedule)
        except ValueError as e:
            rows.append({"epoch_factor": f, "error": str(e)})
            continue
        reach = gpus_for_time(w, cluster, ref_compute_s, target_s, max_gpus=max_gpus, epoch_factor=f, **schedule)
        rows.append({"epoch_factor": f, "at_gpus": {k: v for k, v in at.items() if k != "shapes"},
                     "shapes": at["shapes"], "gpus_for_target": None if reach is None else reach["gpus"],
                     "time_for_target_s": None if reach is None else reach["train_time_s"],
                     "base_gpus_for_target": base_n})
    return rows
