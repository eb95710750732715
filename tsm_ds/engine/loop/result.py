"""What a run writes about itself: ``<run>/result.json`` (how it ended, its numbers, the data it
lost) and ``<run>/config.json`` (the tree, the engine JSON as given and resolved, provenance)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tsm_ds.engine.loop.settings import TrainSettings

__all__ = ["run_summary", "stopped_record", "write_run_result", "save_config_record"]


def run_summary(result: dict, run_dir: str | Path, last_metrics: dict) -> dict:
    """One flat dict of a finished run (``<run>/result.json``, the ``RESULT`` line of train.py).

    Args:
        result: :meth:`Trainer.fit`'s return value; run_dir: the run folder;
        last_metrics: the last step's logged scalars (for ``perf/clips_per_s``).

    Returns:
        run_dir, steps, val_top1 / val_top5 / val_clips (None without validation), best_val_top1,
        last_clips_per_s, rollbacks, lr_scale, data_lost (``{"train": report, "val": report}``,
        :func:`tsm_ds.data.bad_videos.loss_report` of the run's training files and of the last
        evaluation), history (per-epoch validation records).
    """
    val = result.get("val") or {}
    return {"run_dir": str(run_dir), "steps": result["step"], "val_top1": val.get("top1"),
            "val_top5": val.get("top5"), "val_clips": val.get("count"), "best_val_top1": result["best_top1"],
            "last_clips_per_s": last_metrics.get("perf/clips_per_s"), "rollbacks": result["rollbacks"],
            "lr_scale": result["lr_scale"], "data_lost": result.get("data_lost"), "history": result["history"]}


def _strict(obj):
    """``obj`` with non-finite floats as strings ("nan", "inf"): strict JSON for every reader."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def stopped_record(err: Exception, checkpoint_dir) -> tuple[str, dict]:
    """``(status, fields)`` of ``<run>/result.json`` for a run stopped by ``err``: ``data_loss`` (a
    :class:`~tsm_ds.data.bad_videos.DataLossError`: step, split, budget, the loss report, message), ``diverged`` (a
    :class:`~tsm_ds.engine.guards.divergence.DivergenceError`: step, reason, loss, gradient norm, lrs, last good
    checkpoint, report), ``save_failed`` (a CheckpointSaveError: the error) or ``preempted`` (a
    :class:`~tsm_ds.engine.guards.preempt.Preempted`: step, checkpoint under ``checkpoint_dir``, signal)."""
    from tsm_ds.data.bad_videos import DataLossError
    from tsm_ds.engine.guards.preempt import Preempted

    if isinstance(err, DataLossError):
        return "data_loss", {"step": err.step, "split": err.split, "max_bad_fraction": err.max_fraction,
                             "data_lost": {err.split: err.report}, "report": err.describe()}
    if isinstance(err, Preempted):
        return "preempted", {"step": err.step, "checkpoint": str(Path(checkpoint_dir) / err.tag),
                             "signal": err.signal_name}
    if hasattr(err, "describe"):
        return "diverged", {"step": err.step, "reason": err.reason, "loss": err.loss, "grad_norm": err.grad_norm,
                            "lrs": err.lrs, "last_good": err.last_good, "report": err.describe()}
    return "save_failed", {"error": str(err)}


def write_run_result(run_dir: str | Path, status: str, fields: dict, *, log=None) -> None:
    """Write ``<run_dir>/result.json``: ``{"status": completed | completed_with_data_loss | data_loss |
    diverged | save_failed | preempted, **fields}``,
    atomically and as strict JSON (a nan loss is written "nan"), for every run that got past
    set-up, so that tools read a file, not the log. A failed write (e.g. the disk that failed the
    checkpoint) is logged through ``log.error`` when given, not raised."""
    from tsm_ds.utils.io import atomic_write_text

    try:
        atomic_write_text(Path(run_dir) / "result.json",
                          json.dumps(_strict({"status": status, **fields}), indent=2, default=str,
                                     allow_nan=False) + "\n")
    except OSError as e:
        if log is not None:
            log.error("could not write %s: %s", Path(run_dir) / "result.json", e)


def save_config_record(s: "TrainSettings", raw: dict, ds_cfg: dict, tsm: dict, filled: dict, *, world: int,
                       steps_per_epoch: int, total_steps: int, groups: list, hosts: list[str]) -> None:
    """Write ``<run>/config.json`` (rank 0): ``s.record`` (the configuration tree, the split), the
    engine JSON as given and as resolved, what ``"auto"`` became, world size, steps, per-group lrs,
    provenance and the hosts of every rank.

    A resumed run keeps the first record and writes ``config.resumed-<time>.json`` beside it.
    ``groups``: ``[(name, param group dict with "lr", "lr_mult", "weight_decay")]``; the record's
    ``lr`` per group is the peak lr (base lr x ``lr_mult``), ``lr_at_start`` the group's lr now.
    """
    import time

    import torch

    from tsm_ds.engine.config.provenance import provenance, save_resolved
    from tsm_ds.engine.config.recipes import optimizer_kind

    base_lr = float(optimizer_kind({**ds_cfg, "tsm_ds": tsm})[2]["params"]["lr"])
    record = {**s.record, "engine_json": raw, "resolved_ds_config": ds_cfg,
              "resolved_tsm_ds": tsm, "auto_filled": filled, "world_size": world,
              "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
              # lr: the group's peak lr (base lr x lr_mult, what warm-up reaches); lr_at_start: the
              # first step's (DeepSpeed's scheduler has already stepped once at initialize)
              "param_groups": [{"name": n, "lr": base_lr * float(g["lr_mult"]), "lr_at_start": g["lr"],
                                "lr_mult": g["lr_mult"], "weight_decay": g.get("weight_decay")} for n, g in groups],
              "class_names": list(s.class_names), "torch_threads": torch.get_num_threads(),
              "provenance": {**provenance(), "hosts": hosts}}
    name = "config.json"
    if s.config.output.resume and (Path(s.run_dir) / name).is_file():  # keep the first run's record
        name = f"config.resumed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    save_resolved(Path(s.run_dir) / name, record)
