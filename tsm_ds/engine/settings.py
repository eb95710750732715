"""What the trainer is told (:class:`TrainSettings`), the resumable sampler it feeds from and the
per-step statistics it sums over ranks (:class:`StepStats`).

Kept apart from :mod:`tsm_ds.engine.trainer` (the loop) so that both stay short; the trainer
re-exports both names.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DistributedSampler

from tsm_ds.engine.guard import GuardSettings
from tsm_ds.engine.reshard import remaining_shard

__all__ = ["ResumableDistributedSampler", "StepStats", "TrainSettings", "run_summary", "save_config_record",
           "write_run_result", "build_loaders", "step_metrics", "stopped_record"]


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch after its first ``skip`` indices per rank, at
    any world size.

    All ranks together have then consumed the prefix ``P = skip x num_replicas`` of the epoch's
    permutation (interleaved striding); the rest is padded with the permutation's start and
    strided ``[rank::num_replicas]`` (:func:`tsm_ds.engine.reshard.remaining_shard`). At the world
    size that consumed the prefix this is ``DistributedSampler``'s order minus its first ``skip``
    indices (identical, tested); after a resume on another world size the trainer sets
    ``skip = P / num_replicas`` and each clip left in the epoch comes once. Used once after resuming
    mid-epoch: the skipped samples are never loaded.
    """

    skip: int = 0

    def __iter__(self):
        if self.drop_last:
            return iter(list(super().__iter__())[self.skip:])
        if self.shuffle:   # DistributedSampler's permutation of the epoch
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            order = list(range(len(self.dataset)))
        return iter(remaining_shard(order, self.skip * self.num_replicas, self.rank, self.num_replicas))

    def __len__(self):
        return super().__len__() - self.skip


@dataclass
class TrainSettings:
    """What the trainer needs besides the model, data and engine JSON.

    Attributes:
        run_dir: output folder (checkpoints/, tensorboard/, config.json, best_model.pt).
        epochs: planned epochs (scheduler horizon).
        max_steps: stop after this many optimizer steps (None = epochs decide).
        seed: data order, augmentation and dropout seed.
        num_workers: DataLoader worker processes per rank; None: by device
            (:func:`tsm_ds.engine.loaders.default_num_workers`).
        resume: None, ``"auto"`` (latest complete checkpoint in run_dir, if any) or a tag.
        save_every_steps: also save every N optimizer steps (0 = only at epoch ends).
        keep_last: complete checkpoints kept besides the best.
        class_names: stored with every checkpoint and export.
        flags: command-line values for ``config.resolve_config`` (``FLAG_KEYS`` names).
        record: what ``config.json`` holds besides the engine JSON: the configuration tree and the
            run's data (:func:`tsm_ds.config.record.run_record`).
        eval_batch_size: clips per rank per validation batch (None = the micro-batch).
        eval_every: the validation cadence, ``--eval-every``'s text: ``"epoch"``, ``"N"`` optimizer
            steps or ``"0.F"`` of an epoch (:mod:`tsm_ds.config.cadence`); the run's end is always
            validated on the whole set.
        eval_max_clips: intermediate validations score a fixed seeded subset of this many clips
            (:mod:`tsm_ds.engine.cadence`; ``best_model.pt`` is chosen on it); None: the whole set.
        progress: tqdm bar on rank 0.
        step_callback: ``f(step, info)`` after each optimizer step (``info``: ``{"metrics", "lrs",
            "rank", "world", "epoch"}``; :class:`tsm_ds.engine.hooks.StepCallback`).
        guard: the divergence guard's thresholds (:class:`tsm_ds.engine.guard.GuardSettings`).
        on_divergence: ``"stop"`` (raise :class:`~tsm_ds.engine.guard.DivergenceError`) or
            ``"rollback"`` (reload the last good checkpoint, multiply every lr by
            ``rollback_lr_factor`` for the rest of the run, go on; at most ``max_rollbacks`` times,
            then stop).
        inject_nan_step, inject_nan_rank: test hook: the loss of optimizer step ``inject_nan_step``
            (1-based) becomes NaN on rank ``inject_nan_rank`` only (not again after a rollback).
        dist_timeout: seconds for every rank to join and for every collective (None: 300;
            :mod:`tsm_ds.engine.rendezvous`).
        hosts: the hostfile's hosts in node order (names a missing rank's host; ``$TSM_DS_HOSTS``).
        test_hang: test hook ``"<rank>:<step>[:<seconds>]"``: that rank sleeps in that optimizer step
            (:mod:`tsm_ds.engine.watchdog`; ``$TSM_DS_TEST_HANG``).
        stop_signals: signal names that make the run save at the next optimizer step and stop
            (:mod:`tsm_ds.engine.preempt`; SLURM's ``--signal=USR1@120``); ``()``: none.
        step_timeout, startup_timeout: hang watchdog limits in seconds (:mod:`tsm_ds.engine.watchdog`):
            no progress (optimizer step, eval batch, checkpoint) within ``step_timeout``, or no first
            optimizer step within ``startup_timeout`` of ``setup``, makes every rank write its Python
            stacks to ``<run>/stacks/`` and exit with status 6; 0 turns a limit off.
        channels_last: feed the clips channels-last per frame (:mod:`tsm_ds.engine.model_prep`).
        compile: ``torch.compile`` the module through DeepSpeed's ``engine.compile()``.
        trust_checkpoint: ``resume`` (and rollbacks) unpickle in full what weights-only loading
            refuses, after a warning (``--trust-checkpoint``); by default such a checkpoint is refused
            (:mod:`tsm_ds.engine.safe_load`).
        head_lr_mults: the new head at the official fc x5 / fc bias x10 (for a head on pretrained
            weights; :func:`tsm_ds.models.groups.head_mults_on`); False: x1 / x2 like the rest.
        max_bad_fraction: the data-loss budget (``--max-bad-fraction``, in [0, 1]): distinct
            unreadable files / files of the split, checked after every optimizer step (training
            files, all ranks) and every evaluation (the files it covered); past it the run stops
            (:class:`tsm_ds.data.bad_videos.DataLossError`).
    """
    run_dir: Path
    epochs: int = 50
    max_steps: int | None = None
    seed: int = 0
    num_workers: int | None = 2
    resume: str | None = None
    save_every_steps: int = 0
    keep_last: int = 2
    class_names: list = field(default_factory=list)
    flags: dict = field(default_factory=dict)
    record: dict = field(default_factory=dict)
    eval_batch_size: int | None = None
    eval_every: str = "epoch"
    eval_max_clips: int | None = None
    progress: bool = True
    step_callback: Callable | None = None
    guard: GuardSettings = field(default_factory=GuardSettings)
    on_divergence: str = "stop"
    rollback_lr_factor: float = 0.5
    max_rollbacks: int = 3
    inject_nan_step: int | None = None
    inject_nan_rank: int = 0
    dist_timeout: float | None = None
    hosts: tuple = ()
    test_hang: str | None = None
    stop_signals: tuple = ("SIGUSR1",)
    step_timeout: float = 1800.0
    startup_timeout: float = 3600.0
    channels_last: bool = False
    compile: bool = False
    trust_checkpoint: bool = False
    max_bad_fraction: float = 0.01
    head_lr_mults: bool = False

    def __post_init__(self):
        self.run_dir = Path(self.run_dir)
        from tsm_ds.data.bad_videos import check_fraction
        self.max_bad_fraction = check_fraction(self.max_bad_fraction)   # ValueError naming --max-bad-fraction
        if self.on_divergence not in ("stop", "rollback"):
            raise ValueError(f"on_divergence must be 'stop' or 'rollback', got {self.on_divergence!r}")
        if not 0.0 < self.rollback_lr_factor < 1.0 or self.max_rollbacks < 0:
            raise ValueError(f"rollback needs 0 < rollback_lr_factor < 1 and max_rollbacks >= 0, got "
                             f"{self.rollback_lr_factor} and {self.max_rollbacks}")
        from tsm_ds.config.cadence import parse_eval_every
        parse_eval_every(self.eval_every)   # ValueError naming --eval-every
        if self.eval_max_clips is not None and self.eval_max_clips < 1:
            raise ValueError(f"--eval-max-clips {self.eval_max_clips}: give a number of validation clips >= 1")


@dataclass
class StepStats:
    """One rank's sums over an optimizer step's micro-batches (summed over ranks for the log).

    Attributes:
        loss_sum: sum of per-clip cross-entropy losses; clips: clips seen (float, for the sums).
        correct1, correct5: clips whose label is the top-1 / among the top-5 logits.
        bad_videos: unreadable files the loader replaced (encounters).
        bad_files_new: unreadable files this rank saw that the run did not know yet
            (:meth:`tsm_ds.data.bad_videos.BadVideoTracker.num_pending`; summed: exchange names if > 0).
        data_s, compute_s, comm_s: seconds waiting for data, in forward/backward/step, in the
            gradient all-reduce (the paper's three bottlenecks).
    """

    loss_sum: float = 0.0
    clips: float = 0.0
    correct1: float = 0.0
    correct5: float = 0.0
    bad_videos: float = 0.0
    data_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    bad_files_new: float = 0.0

    def add_loss(self, loss, n: int) -> None:
        """A micro-batch's mean loss over its ``n`` clips: a float, or a 0-d tensor kept on its device
        (summed there: no host sync per micro-batch; :meth:`as_list` reads the step's sums once)."""
        self.loss_sum = self.loss_sum + (loss.detach().float() * n if torch.is_tensor(loss) else float(loss) * n)
        self.clips += n

    def add_batch(self, logits, label, *, bad: int, data_s: float, compute_s: float, comm_s: float) -> None:
        """A micro-batch's hits (logits (n, K), labels (n,)), unreadable files replaced and timings (s).
        The hits stay tensors on the logits' device until :meth:`as_list` (no host sync here)."""
        with torch.no_grad():
            hit = logits.detach().float().topk(min(5, logits.shape[1]), dim=1).indices == label.view(-1, 1)
            self.correct1 = self.correct1 + hit[:, :1].any(1).sum()
            self.correct5 = self.correct5 + hit.any(1).sum()
        self.bad_videos += bad
        self.data_s += data_s
        self.compute_s += compute_s
        self.comm_s += comm_s

    def as_list(self) -> list[float]:
        """The fields in order, for one all-reduce (tensor sums are read here: one host sync a step)."""
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> "StepStats":
        """Inverse of :meth:`as_list` (e.g. after the all-reduce)."""
        if len(values) != len(fields(cls)):
            raise ValueError(f"StepStats needs {len(fields(cls))} values, got {len(values)}")
        return cls(*values)


def step_metrics(r: StepStats, bad: tuple[int, int], lrs: dict[str, float], seconds: float, *, eng, world: int,
                 manual_comm: bool, guard, compressor=None) -> dict:
    """The scalars logged after an optimizer step.

    Args:
        r: the step's statistics summed over ranks; bad: (distinct bad files, encounters) so far;
        lrs: the step's per-group lrs; seconds: wall time since the previous step;
        eng: the engine (skipped steps); world: ranks; manual_comm: the comm time was measured;
        guard: the engine guard (its gradient norm); compressor: the 1-bit compressor or None.

    Returns:
        ``{"train/loss", "train/top1", "train/top5", "perf/clips_per_s", "time/data_wait_s",
        "time/compute_s", "time/comm_s", "train/skipped_steps", "data/bad_videos",
        "data/bad_video_encounters", "train/grad_norm", "lr/<group>"..., "comm/<stat>"...}``
        (times per rank, averaged; ``time/comm_s`` None when not measured).
    """
    metrics = {"train/loss": r.loss_sum / r.clips, "train/top1": 100 * r.correct1 / r.clips,
               "train/top5": 100 * r.correct5 / r.clips, "perf/clips_per_s": r.clips / max(seconds, 1e-9),
               "time/data_wait_s": r.data_s / world, "time/compute_s": r.compute_s / world,
               "time/comm_s": r.comm_s / world if manual_comm else None, "train/skipped_steps": eng.skipped_steps,
               "data/bad_videos": bad[0], "data/bad_video_encounters": bad[1], "train/grad_norm": guard.grad_norm}
    from tsm_ds.data.packed_batch import nvjpeg_fallbacks

    fell = nvjpeg_fallbacks()["batches"]
    if fell:   # --decode-device cuda: batches nvJPEG refused (decoded frame by frame), this rank
        metrics["data/nvjpeg_fallback_batches"] = fell
    for name, lr in lrs.items():
        metrics[f"lr/{name}"] = lr
    if compressor is not None:
        for k, v in compressor.stats().items():
            if isinstance(v, (int, float)):
                metrics[f"comm/{k}"] = v
    return metrics


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
    :class:`~tsm_ds.engine.guard.DivergenceError`: step, reason, loss, gradient norm, lrs, last good
    checkpoint, report), ``save_failed`` (a CheckpointSaveError: the error) or ``preempted`` (a
    :class:`~tsm_ds.engine.preempt.Preempted`: step, checkpoint under ``checkpoint_dir``, signal)."""
    from tsm_ds.data.bad_videos import DataLossError
    from tsm_ds.engine.preempt import Preempted

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

    from tsm_ds.engine.provenance import provenance, save_resolved
    from tsm_ds.engine.recipes import optimizer_kind

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
    if s.resume and (Path(s.run_dir) / name).is_file():  # keep the first run's record
        name = f"config.resumed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    save_resolved(Path(s.run_dir) / name, record)


def build_loaders(train_set, val_set, *, micro: int, world: int, rank: int, seed: int, num_workers: int,
                  eval_batch_size: int | None = None, cuda: bool = False) -> tuple:
    """The trainer's data loaders: ``(sampler, loader_gen, loader, val_loader)``.

    Training: :class:`ResumableDistributedSampler` (shuffled per epoch with ``seed``; ``set_epoch``
    and ``skip`` are the trainer's), micro-batches of ``micro`` clips, incomplete ones dropped,
    worker seeds from ``loader_gen`` (re-seeded per epoch by the trainer, not the global RNG).
    Validation (None without a val set): every clip once per rank's share, in order, batches of
    ``eval_batch_size`` (default ``micro``); the padding of ``DistributedSampler`` is removed by
    :func:`tsm_ds.engine.evaluate.gather_predictions`. ``cuda``: pinned memory, persistent workers,
    prefetch (:func:`tsm_ds.engine.loaders.loader_options`).
    """
    import torch
    from torch.utils.data import DataLoader

    from tsm_ds.data.packed_batch import collate_items
    from tsm_ds.engine.loaders import loader_options

    sampler = ResumableDistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                          drop_last=False)
    loader_gen = torch.Generator()
    opts = loader_options(num_workers, cuda=cuda)
    loader = DataLoader(train_set, batch_size=micro, sampler=sampler, num_workers=num_workers, drop_last=True,
                        generator=loader_gen, collate_fn=collate_items, **opts)
    val_loader = None
    if val_set is not None and len(val_set):
        vs = DistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False)
        val_loader = DataLoader(val_set, batch_size=eval_batch_size or micro, sampler=vs, num_workers=num_workers,
                                generator=torch.Generator().manual_seed(seed), collate_fn=collate_items, **opts)
    return sampler, loader_gen, loader, val_loader
