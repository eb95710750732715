"""TensorBoard scalars of our own (DeepSpeed 0.19's monitor writes only lr and timers).

Tags (all per optimizer step unless said otherwise):

- ``train/loss``, ``train/top1``, ``train/top5`` (percent, averaged over ranks)
- ``val/top1``, ``val/top5``, ``val/clips`` (per epoch, step axis = optimizer step)
- ``lr/<group name>`` one per param group, the lr the step's update used (the fc x5 / bias x10
  groups show their own lr)
- ``perf/clips_per_s`` (global clips per second of wall time), ``time/data_wait_s``,
  ``time/compute_s``, ``time/comm_s`` (seconds per optimizer step, mean over ranks; comm is the
  gradient all-reduce timed on its own, including the wait for the slowest rank)
- ``train/skipped_steps`` (fp16 overflow, cumulative), ``data/bad_videos`` (distinct unreadable
  files of the run, over DataLoader workers and ranks: :mod:`tsm_ds.data.bad_videos`),
  ``data/bad_video_encounters`` (cumulative replaced samples: a file that fails every epoch counts
  every time), ``comm/<key>`` (compressor statistics)
"""
from __future__ import annotations

from pathlib import Path

from tsm_ds.engine.loop.hooks import TrainHook


class ScalarWriter:
    """A TensorBoard ``SummaryWriter`` on rank 0; a no-op elsewhere.

    Args:
        log_dir: event file folder (``<run dir>/tensorboard/tsm_ds``).
        enabled: True on rank 0.
    """

    def __init__(self, log_dir: str | Path, *, enabled: bool):
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(str(log_dir))

    def scalars(self, values: dict, step: int) -> None:
        """Write ``{tag: float}`` at ``step`` (None values are skipped)."""
        if self.writer is None:
            return
        for tag, v in values.items():
            if v is not None:
                self.writer.add_scalar(tag, float(v), int(step))

    def flush(self) -> None:
        """Flush events to disk."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Flush and close."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Monitor(TrainHook):
    """The trainer's TensorBoard component: a :class:`ScalarWriter` in ``<run_dir>/tensorboard/tsm_ds``
    on rank 0, fed through the hook interface (:mod:`tsm_ds.engine.loop.hooks`)."""

    def __init__(self):
        self.writer: ScalarWriter | None = None
        self.run_dir: Path | None = None

    def on_setup_start(self, run_dir) -> None:
        self.run_dir = Path(run_dir)

    def on_setup_end(self, rank: int, world: int) -> None:
        self.writer = ScalarWriter(self.run_dir / "tensorboard" / "tsm_ds", enabled=rank == 0)

    def on_metrics(self, values: dict, step: int) -> None:
        if self.writer is not None:
            self.writer.scalars(values, step)

    def on_epoch_end(self, epoch: int, step: int) -> None:
        if self.writer is not None:
            self.writer.flush()

    def on_end(self) -> None:
        if self.writer is not None:
            self.writer.close()
