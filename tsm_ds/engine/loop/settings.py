"""What the trainer is told: :class:`TrainSettings` (built from the configuration tree's sections by
:func:`tsm_ds.cli.train.train_settings`). The sampler and loaders are in :mod:`.loaders`, the step
statistics in :mod:`.metrics`, the run's result and config records in :mod:`.result`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tsm_ds.engine.guards.divergence import GuardSettings

__all__ = ["TrainSettings"]


@dataclass
class TrainSettings:
    """What the trainer needs besides the model, data and engine JSON.

    Attributes:
        run_dir: output folder (checkpoints/, tensorboard/, config.json, best_model.pt).
        epochs: planned epochs (scheduler horizon).
        max_steps: stop after this many optimizer steps (None = epochs decide).
        seed: data order, augmentation and dropout seed.
        num_workers: DataLoader worker processes per rank; None: by device
            (:func:`tsm_ds.engine.loop.loaders.default_num_workers`).
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
            (:mod:`tsm_ds.engine.loop.cadence`; ``best_model.pt`` is chosen on it); None: the whole set.
        progress: tqdm bar on rank 0.
        step_callback: ``f(step, info)`` after each optimizer step (``info``: ``{"metrics", "lrs",
            "rank", "world", "epoch"}``; :class:`tsm_ds.engine.loop.hooks.StepCallback`).
        guard: the divergence guard's thresholds (:class:`tsm_ds.engine.guards.divergence.GuardSettings`).
        on_divergence: ``"stop"`` (raise :class:`~tsm_ds.engine.guards.divergence.DivergenceError`) or
            ``"rollback"`` (reload the last good checkpoint, multiply every lr by
            ``rollback_lr_factor`` for the rest of the run, go on; at most ``max_rollbacks`` times,
            then stop).
        inject_nan_step, inject_nan_rank: test hook: the loss of optimizer step ``inject_nan_step``
            (1-based) becomes NaN on rank ``inject_nan_rank`` only (not again after a rollback).
        dist_timeout: seconds for every rank to join and for every collective (None: 300;
            :mod:`tsm_ds.engine.comm.rendezvous`).
        hosts: the hostfile's hosts in node order (names a missing rank's host; ``$TSM_DS_HOSTS``).
        test_hang: test hook ``"<rank>:<step>[:<seconds>]"``: that rank sleeps in that optimizer step
            (:mod:`tsm_ds.engine.guards.watchdog`; ``$TSM_DS_TEST_HANG``).
        stop_signals: signal names that make the run save at the next optimizer step and stop
            (:mod:`tsm_ds.engine.guards.preempt`; SLURM's ``--signal=USR1@120``); ``()``: none.
        step_timeout, startup_timeout: hang watchdog limits in seconds (:mod:`tsm_ds.engine.guards.watchdog`):
            no progress (optimizer step, eval batch, checkpoint) within ``step_timeout``, or no first
            optimizer step within ``startup_timeout`` of ``setup``, makes every rank write its Python
            stacks to ``<run>/stacks/`` and exit with status 6; 0 turns a limit off.
        channels_last: feed the clips channels-last per frame (:mod:`tsm_ds.engine.loop.model_prep`).
        compile: ``torch.compile`` the module through DeepSpeed's ``engine.compile()``.
        trust_checkpoint: ``resume`` (and rollbacks) unpickle in full what weights-only loading
            refuses, after a warning (``--trust-checkpoint``); by default such a checkpoint is refused
            (:mod:`tsm_ds.engine.checkpoint.safe_load`).
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
