"""One optimizer step's sums over micro-batches and ranks (:class:`StepStats`) and the scalars logged
after it (:func:`step_metrics`): loss, top-1 / top-5, clips/s, the three bottlenecks' times,
unreadable files, gradient norm, lrs."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["StepStats", "step_metrics"]


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
