"""A batch sampler whose batches change size and clip shape step by step, as a multigrid schedule says.

Source: PySlowFast ``slowfast/datasets/multigrid_helper.py`` (``ShortCycleBatchSampler``: the batch
size cycles per iteration and each index travels with its short-cycle index, so the dataset cuts the
item at that shape) and ``slowfast/datasets/loader.py`` (the sampler wrapped by it); the multigrid
paper (Wu et al., CVPR 2020), Sec. 3.

Every rank sees the sample order of ``torch.utils.data.DistributedSampler`` for the same seed and
epoch (the permutation ``randperm(N)`` seeded with seed + epoch, padded with its start to
``ceil(N / W) x W``, strided ``[rank::W]``), only cut into micro-batches of the sizes the schedule
gives each optimizer step (:meth:`~tsm_ds.engine.loop.multigrid.MultigridSchedule.epoch_steps`):
step k takes the next ``global_batch / W`` clips of each rank's shard in ``accum`` micro-batches of
``global_batch / (W x accum)``, so all ranks together take the next ``global_batch`` positions of
the padded permutation, and every micro-batch of a step has the same size on every rank (the
loss-mean and the all-reduce then average the step's global batch exactly; see
:mod:`tsm_ds.engine.loop.multigrid`). A micro-batch is a list of ``(index, T, crop)`` tuples, the
items :meth:`tsm_ds.data.dataset.VideoClipDataset.__getitem__` cuts at that shape.

Resuming: ``skip_steps`` / ``skip_clips`` (set per epoch by the trainer, 0 otherwise) start the epoch
after its first steps, whose clips (all ranks together: the prefix P of the epoch order) are
never loaded; the rest is re-sharded for this world size as
:func:`tsm_ds.engine.checkpoint.reshard.remaining_shard` does, so a checkpoint of W0 ranks resumes
on W1 with the same clips per step, and the short cycle goes on at step ``skip_steps``.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler

from tsm_ds.engine.checkpoint.reshard import remaining_shard
from tsm_ds.engine.loop.multigrid import MultigridSchedule

__all__ = ["MultigridBatchSampler"]


class MultigridBatchSampler(Sampler):
    """Micro-batches of ``(index, T, crop)`` items for one rank, shaped by a multigrid schedule.

    Args:
        num_samples: N, the dataset's length (>= 1).
        schedule: the run's :class:`~tsm_ds.engine.loop.multigrid.MultigridSchedule` (its base batch is
            the global batch: a multiple of ``num_replicas x accum``).
        num_replicas, rank: W and this rank (0 <= rank < W).
        accum: micro-batches per optimizer step (gradient accumulation, fixed).
        seed, shuffle: as ``DistributedSampler`` (the permutation of epoch e is seeded seed + e).
        drop_last: drop the clips that do not fill the epoch's next step (the trainer's default).
            False: they come as one last, smaller micro-batch at the next step's shape (every
            sample then comes once per epoch, the padding aside; a step of its own).

    Attributes:
        epoch: set by :meth:`set_epoch`; skip_steps, skip_clips: the resume position of the epoch
            about to be iterated (steps done, clips all ranks consumed in it).

    Raises:
        ValueError: a bad argument, or a base batch that does not split over W x accum.
    """

    def __init__(self, num_samples: int, schedule: MultigridSchedule, *, num_replicas: int, rank: int,
                 accum: int = 1, seed: int = 0, shuffle: bool = True, drop_last: bool = True):
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} not in [0, {num_replicas})")
        if accum < 1:
            raise ValueError(f"accum must be >= 1, got {accum}")
        if schedule.base_batch % (num_replicas * accum):
            raise ValueError(f"--batch-size {schedule.base_batch} does not split over {num_replicas} ranks x "
                             f"{accum} micro-batches per step")
        self.num_samples, self.schedule = int(num_samples), schedule
        self.num_replicas, self.rank, self.accum = int(num_replicas), int(rank), int(accum)
        self.seed, self.shuffle, self.drop_last = int(seed), bool(shuffle), bool(drop_last)
        self.epoch, self.skip_steps, self.skip_clips = 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation and stage the next iteration uses."""
        self.epoch = int(epoch)

    def resume_at(self, micro_done: int, clips_before: int) -> None:
        """Start the next iteration after ``micro_done`` micro-batches per rank (whole optimizer
        steps: ``skip_steps = micro_done / accum``), ``clips_before`` clips of the epoch over all ranks
        (``skip_clips``; :meth:`tsm_ds.engine.loop.state.Layout.clips_before`)."""
        self.skip_steps, self.skip_clips = int(micro_done) // self.accum, int(clips_before)

    @property
    def epoch_clips(self) -> int:
        """Positions of the padded epoch order over all ranks: ``ceil(N / W) x W``."""
        return math.ceil(self.num_samples / self.num_replicas) * self.num_replicas

    def order(self) -> list[int]:
        """The epoch's permutation of ``range(N)`` (``DistributedSampler``'s, unpadded)."""
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=g).tolist()

    def _plan(self, shard_len: int) -> list[tuple[int, int, int]]:
        """(micro-batch size, T, crop) of this rank's micro-batches in the epoch (from its skip position)."""
        steps = self.schedule.epoch_steps(self.epoch, shard_len * self.num_replicas, start_step=self.skip_steps)
        plan = []
        for sh in steps:
            m = self.schedule.micro_batch(sh, world=self.num_replicas, accum=self.accum)
            plan += [(m, sh.frames, sh.crop)] * self.accum
        left = shard_len - sum(p[0] for p in plan)
        if left and not self.drop_last:
            nxt = self.schedule.step_shape(self.epoch, self.skip_steps + len(steps))
            plan.append((left, nxt.frames, nxt.crop))
        return plan

    def __iter__(self):
        shard = remaining_shard(self.order(), self.skip_clips, self.rank, self.num_replicas)
        pos = 0
        for m, t, c in self._plan(len(shard)):
            yield [(i, t, c) for i in shard[pos:pos + m]]
            pos += m

    def __len__(self) -> int:
        left = max(0, self.num_samples - self.skip_clips)
        return len(self._plan(math.ceil(left / self.num_replicas)))
