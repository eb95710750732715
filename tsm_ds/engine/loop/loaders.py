"""DataLoader options by device: what feeds a GPU, and what a CPU run keeps.

On CUDA (issue 37): pinned host memory, so that the trainer's ``non_blocking=True`` copies overlap
compute (PyTorch's "pin_memory" note: a copy from pageable memory is synchronous); persistent
workers, so that an epoch does not fork its workers anew (the dataset's epoch lives in shared
memory, :meth:`tsm_ds.data.dataset.VideoClipDataset.set_epoch`, and items depend only on (seed,
epoch, index), so the batches are the same as with fresh workers); ``prefetch_factor`` 4 batches
per worker; and by default as many workers per rank as the node has cores per local rank, less one
for the rank itself (DESIGN.md "Feeding the GPUs": an H100 trains ~600 TSM-R50 clips/s, 110-130
clips/s per core from packs: 5+ cores per GPU). On the CPU accelerator the ranks' own threads
compute, so the workers stay few (2) and are forked per epoch as measured before.
"""
from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from tsm_ds.engine.checkpoint.reshard import remaining_shard

__all__ = ["GPU_MAX_WORKERS", "CPU_DEFAULT_WORKERS", "default_num_workers", "loader_options",
           "ResumableDistributedSampler", "build_loaders"]

#: workers per rank on a CPU run by default (the ranks' threads compute there)
CPU_DEFAULT_WORKERS = 2
#: at most this many workers per GPU rank by default (each holds a decoder and a few batches)
GPU_MAX_WORKERS = 12


def default_num_workers(num_workers: int | None, *, cuda: bool, cores: int, local_ranks: int) -> int:
    """DataLoader workers per rank: ``num_workers`` when given (``--num-workers``), else on CUDA the
    node's cores per local rank minus one (2 to :data:`GPU_MAX_WORKERS`), else :data:`CPU_DEFAULT_WORKERS`.

    Args:
        num_workers: the user's value, or None; cuda: this rank trains on CUDA;
        cores: usable cores of the node; local_ranks: ranks on the node (>= 1).

    Raises:
        ValueError: ``num_workers`` < 0 (names ``--num-workers``).
    """
    if num_workers is not None:
        if int(num_workers) < 0:
            raise ValueError(f"--num-workers {num_workers}: give 0 (load in the rank itself) or more workers")
        return int(num_workers)
    if not cuda:
        return CPU_DEFAULT_WORKERS
    return max(2, min(GPU_MAX_WORKERS, cores // max(1, local_ranks) - 1))


def loader_options(num_workers: int, *, cuda: bool) -> dict:
    """Keyword arguments for ``torch.utils.data.DataLoader`` on this device (module docstring):
    ``{"pin_memory": cuda, "persistent_workers": cuda and num_workers > 0}`` plus
    ``"prefetch_factor": 4`` on CUDA with workers (DataLoader refuses it without workers)."""
    out = {"pin_memory": bool(cuda), "persistent_workers": bool(cuda and num_workers > 0)}
    if cuda and num_workers > 0:
        out["prefetch_factor"] = 4
    return out


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch after its first ``skip`` indices per rank, at
    any world size.

    All ranks together have then consumed the prefix ``P = skip x num_replicas`` of the epoch's
    permutation (interleaved striding); the rest is padded with the permutation's start and
    strided ``[rank::num_replicas]`` (:func:`tsm_ds.engine.checkpoint.reshard.remaining_shard`). At the world
    size that consumed the prefix this is ``DistributedSampler``'s order minus its first ``skip``
    indices (identical, tested); after a resume on another world size the trainer sets
    ``skip = P / num_replicas`` and each clip left in the epoch comes once. Used once after resuming
    mid-epoch: the skipped samples are never loaded.
    """

    skip: int = 0

    def resume_at(self, micro_done: int, clips_before: int) -> None:
        """Start the next iteration after ``clips_before`` clips of the epoch (all ranks together;
        ``micro_done`` micro-batches per rank, unused here): ``skip = clips_before / num_replicas``."""
        self.skip = int(clips_before) // self.num_replicas

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


def build_loaders(train_set, val_set, *, micro: int, world: int, rank: int, seed: int, num_workers: int,
                  eval_batch_size: int | None = None, cuda: bool = False, schedule=None, accum: int = 1) -> tuple:
    """The trainer's data loaders: ``(sampler, loader_gen, loader, val_loader)``.

    Training: :class:`ResumableDistributedSampler` (shuffled per epoch with ``seed``; ``set_epoch``
    and ``skip`` are the trainer's), micro-batches of ``micro`` clips, incomplete ones dropped,
    worker seeds from ``loader_gen`` (re-seeded per epoch by the trainer, not the global RNG).
    Validation (None without a val set): every clip once per rank's share, in order, batches of
    ``eval_batch_size`` (default ``micro``); the padding of ``DistributedSampler`` is removed by
    :func:`tsm_ds.engine.loop.evaluate.gather_predictions`. ``cuda``: pinned memory, persistent workers,
    prefetch (:func:`tsm_ds.engine.loop.loaders.loader_options`).

    With a multigrid ``schedule`` (:class:`tsm_ds.engine.loop.multigrid.MultigridSchedule`) the training
    loader's batches come from :class:`~tsm_ds.engine.loop.multigrid_sampler.MultigridBatchSampler`
    (the same sample order, micro-batches of each step's size and ``(index, T, crop)`` items; ``accum``
    micro-batches per step), which is then the returned sampler.
    """
    import torch
    from torch.utils.data import DataLoader

    from tsm_ds.data.packed_batch import collate_items

    loader_gen = torch.Generator()
    opts = loader_options(num_workers, cuda=cuda)
    if schedule is not None:
        from tsm_ds.engine.loop.multigrid_sampler import MultigridBatchSampler

        sampler = MultigridBatchSampler(len(train_set), schedule, num_replicas=world, rank=rank, accum=accum,
                                        seed=seed)
        loader = DataLoader(train_set, batch_sampler=sampler, num_workers=num_workers, generator=loader_gen,
                            collate_fn=collate_items, **opts)
    else:
        sampler = ResumableDistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                              drop_last=False)
        loader = DataLoader(train_set, batch_size=micro, sampler=sampler, num_workers=num_workers, drop_last=True,
                            generator=loader_gen, collate_fn=collate_items, **opts)
    val_loader = None
    if val_set is not None and len(val_set):
        vs = DistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False)
        val_loader = DataLoader(val_set, batch_size=eval_batch_size or micro, sampler=vs, num_workers=num_workers,
                                generator=torch.Generator().manual_seed(seed), collate_fn=collate_items, **opts)
    return sampler, loader_gen, loader, val_loader
