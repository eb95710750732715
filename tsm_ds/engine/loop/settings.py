"""What the trainer is told: :class:`TrainSettings`, the run's folder and the configuration tree
(:class:`tsm_ds.config.Config`) whose training sections (:data:`tsm_ds.config.TRAIN_SECTIONS`) the
trainer reads directly, as torchtitan's ``Trainer(job_config)``: each part gets its own section
(the loaders ``data`` and ``schedule``, the checkpoint manager ``output``, the guard ``guard``, the
watchdog and rendezvous ``distributed``). Adding a training option is one field in
:mod:`tsm_ds.config.tree` and the code that uses it (docs/contributing.md, "Adding an option").

The sampler and loaders are in :mod:`.loaders`, the step statistics in :mod:`.metrics`, the run's
result and config records in :mod:`.result`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tsm_ds.config import Config

__all__ = ["TrainSettings"]


@dataclass
class TrainSettings:
    """What the trainer needs besides the model, data and engine JSON.

    Attributes:
        run_dir: output folder (checkpoints/, tensorboard/, config.json, best_model.pt).
        config: the run's configuration tree; the trainer reads the sections of
            :data:`tsm_ds.config.TRAIN_SECTIONS` and ``checkpoint.trust_checkpoint``. Programs build it
            with :func:`tsm_ds.config.tree_with` (``{"schedule.epochs": 1, ...}``, types checked) or
            from a command line with :func:`tsm_ds.config.parse`.
        class_names: stored with every checkpoint and export.
        record: what ``config.json`` holds besides the engine JSON: the configuration tree and the
            run's data (:func:`tsm_ds.config.record.run_record`).
        step_callback: ``f(step, info)`` after each optimizer step (``info``: ``{"metrics", "lrs",
            "rank", "world", "epoch"}``; :class:`tsm_ds.engine.loop.hooks.StepCallback`).

    Raises:
        ValueError: a value out of its range that the tree's types cannot express (the message names
            the flag): ``--max-bad-fraction`` outside [0, 1], ``--rollback-lr-factor`` outside (0, 1),
            ``--max-rollbacks`` < 0, a bad ``--eval-every``, ``--eval-max-clips`` < 1,
            ``--eval-batch-size`` < 1.
    """
    run_dir: Path
    config: Config = field(default_factory=Config)
    class_names: list = field(default_factory=list)
    record: dict = field(default_factory=dict)
    step_callback: Callable | None = None

    def __post_init__(self):
        self.run_dir = Path(self.run_dir)
        from tsm_ds.config.cadence import parse_eval_every
        from tsm_ds.data.bad_videos import check_fraction

        c = self.config
        c.data.max_bad_fraction = check_fraction(c.data.max_bad_fraction)   # ValueError naming the flag
        g = c.guard
        if not 0.0 < g.rollback_lr_factor < 1.0 or g.max_rollbacks < 0:
            raise ValueError(f"rollback needs 0 < --rollback-lr-factor < 1 and --max-rollbacks >= 0, got "
                             f"{g.rollback_lr_factor} and {g.max_rollbacks}")
        sch = c.schedule
        parse_eval_every(sch.eval_every)   # ValueError naming --eval-every
        if sch.eval_max_clips is not None and sch.eval_max_clips < 1:
            raise ValueError(f"--eval-max-clips {sch.eval_max_clips}: give a number of validation clips >= 1")
        if sch.eval_batch_size is not None and sch.eval_batch_size < 1:
            raise ValueError(f"--eval-batch-size {sch.eval_batch_size}: give a number of clips >= 1")
