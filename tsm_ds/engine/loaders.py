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

__all__ = ["GPU_MAX_WORKERS", "CPU_DEFAULT_WORKERS", "default_num_workers", "loader_options"]

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
