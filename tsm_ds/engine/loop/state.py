"""What a run is and where it stands: the batch layout (:class:`Layout`, fixed once the engine is
built) and the mutable state of the run (:class:`RunState`), which checkpoints store and
resharding reads, so that no module reads the trainer's attributes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Layout", "RunState"]


@dataclass(frozen=True)
class Layout:
    """The batch layout of a set-up run.

    Attributes:
        rank, world: this rank and the world size.
        micro: clips per rank per micro-batch; accum: micro-batches per optimizer step;
        global_batch: clips per optimizer step over all ranks (= micro x accum x world).
        steps_per_epoch: optimizer steps per epoch; total_steps: the steps this run plans.
        epochs: the epochs the run plans (``--epochs``; with a multigrid schedule, its epochs).
        schedule: the multigrid shape schedule (:class:`tsm_ds.engine.loop.multigrid.MultigridSchedule`)
            or None; with one, ``micro``, ``global_batch`` and ``steps_per_epoch`` are the base shape's,
            and the methods below give each epoch's own steps and positions.
        epoch_clips: clips of an epoch over all ranks as the sampler pads them (``ceil(N / W) x W``;
            the schedule's steps of an epoch are cut from it).
    """

    rank: int
    world: int
    micro: int
    accum: int
    global_batch: int
    steps_per_epoch: int
    total_steps: int
    epochs: int = 0
    schedule: Any = None
    epoch_clips: int = 0

    @property
    def micro_per_epoch(self) -> int:
        """Micro-batches per rank per epoch (without a schedule; :meth:`micro_in` for any)."""
        return self.steps_per_epoch * self.accum

    def steps_in(self, epoch: int) -> int:
        """Optimizer steps of ``epoch`` (0-based)."""
        if self.schedule is None:
            return self.steps_per_epoch
        return len(self.schedule.epoch_steps(epoch, self.epoch_clips))

    def micro_in(self, epoch: int) -> int:
        """Micro-batches per rank of ``epoch``."""
        return self.steps_in(epoch) * self.accum

    def lr_factor(self, epoch: int) -> float:
        """The schedule's lr factor of ``epoch`` (its stage's; 1 without a schedule)."""
        if self.schedule is None:
            return 1.0
        return self.schedule.stages[self.schedule.stage_index(epoch)].lr_factor

    def clips_before(self, epoch: int, micro: int) -> int:
        """P, the clips all ranks consumed in ``epoch`` after ``micro`` micro-batches per rank (a
        checkpoint's data position, :mod:`tsm_ds.engine.checkpoint.reshard`)."""
        if self.schedule is None:
            return int(micro) * self.micro * self.world
        steps = self.schedule.epoch_steps(epoch, self.epoch_clips)[:int(micro) // self.accum]
        return sum(s.global_batch for s in steps)

    def micro_at(self, epoch: int, clips: int) -> int:
        """The micro-batches per rank of this layout after which ``epoch`` stands ``clips`` clips in
        (the inverse of :meth:`clips_before`, for a checkpoint written at another world size).

        Raises:
            ValueError: ``clips`` falls inside a micro-batch (plain) or an optimizer step (schedule)
            of this layout.
        """
        if self.schedule is None:
            per = self.micro * self.world
            if clips % per:
                raise ValueError(f"{clips} clips are not a whole number of micro-batches of {self.micro} clips on "
                                 f"{self.world} ranks")
            return clips // per
        done = 0
        for k, s in enumerate(self.schedule.epoch_steps(epoch, self.epoch_clips)):
            if done == clips:
                return k * self.accum
            done += s.global_batch
        if done == clips:
            return len(self.schedule.epoch_steps(epoch, self.epoch_clips)) * self.accum
        raise ValueError(f"{clips} clips into epoch {epoch} is not the end of one of its optimizer steps")


@dataclass
class RunState:
    """The run's mutable state: what a checkpoint's client state holds besides the engine.

    Attributes:
        step: optimizer steps done (global).
        best_top1: best validation top-1 so far (%; -1 before the first evaluation); best_tag:
            the checkpoint tag of that step.
        history: one record per validation (epoch, step, val_top1, val_top5, val_clips).
        lr_scale: product of the rollback lr factors so far (1: none); rollbacks: rollbacks so far.
        last_saved: the step of the newest checkpoint of this start (-1: none yet).
        last_metrics: the last optimizer step's logged scalars.
    """

    step: int = 0
    best_top1: float = -1.0
    best_tag: str | None = None
    history: list = field(default_factory=list)
    lr_scale: float = 1.0
    rollbacks: int = 0
    last_saved: int = -1
    last_metrics: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        """The fields a checkpoint keeps (``step``, ``best_top1``, ``best_tag``, ``history``,
        ``lr_scale``, ``rollbacks``), under the client-state keys checkpoints have always used."""
        return {"step": self.step, "best_top1": self.best_top1, "best_tag": self.best_tag,
                "history": list(self.history), "lr_scale": self.lr_scale, "rollbacks": self.rollbacks}

    def load_state_dict(self, d: dict) -> None:
        """Restore from a checkpoint's client state (missing keys: the defaults; older checkpoints)."""
        self.step = int(d["step"])
        self.best_top1 = float(d.get("best_top1", -1.0))
        self.best_tag = d.get("best_tag")
        self.history = list(d.get("history", []))
        self.lr_scale = float(d.get("lr_scale", 1.0))
        self.rollbacks = int(d.get("rollbacks", 0))
        self.last_saved = self.step

    def as_dict(self) -> dict:
        """Every field (for tests and reports)."""
        return asdict(self)
