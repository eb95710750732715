"""What a run is and where it stands: the batch layout (:class:`Layout`, fixed once the engine is
built) and the mutable state of the run (:class:`RunState`), which checkpoints store and
resharding reads, so that no module reads the trainer's attributes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Layout", "RunState"]


@dataclass(frozen=True)
class Layout:
    """The batch layout of a set-up run.

    Attributes:
        rank, world: this rank and the world size.
        micro: clips per rank per micro-batch; accum: micro-batches per optimizer step;
        global_batch: clips per optimizer step over all ranks (= micro x accum x world).
        steps_per_epoch: optimizer steps per epoch; total_steps: the steps this run plans.
    """

    rank: int
    world: int
    micro: int
    accum: int
    global_batch: int
    steps_per_epoch: int
    total_steps: int

    @property
    def micro_per_epoch(self) -> int:
        """Micro-batches per rank per epoch."""
        return self.steps_per_epoch * self.accum


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
