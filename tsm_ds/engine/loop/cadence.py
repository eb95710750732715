"""Validation cadence (``--eval-every``) and the capped validation subset (``--eval-max-clips``).

:class:`EvalCadence` is a trainer component (:class:`tsm_ds.engine.loop.hooks.TrainHook`): the trainer
asks ``validation_due`` after every optimizer step inside an epoch and at every epoch's end; the
end of the run is evaluated whatever it answers, on the whole validation set. The syntax of
``--eval-every`` is :mod:`tsm_ds.config.cadence`'s.

:func:`val_subset` builds the fixed subset that intermediate evaluations score under a cap: drawn
once from the run's seed (the same indices at every evaluation, and after a resume with the same
seed), sorted, scored through its own loader like the whole set (each clip once over all ranks).
``best_model.pt`` is chosen on that subset's top-1 (the final, whole-set evaluation's top-1 on the
same clips enters the comparison), so that every candidate is scored on the same clips.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from tsm_ds.config.cadence import parse_eval_every
from tsm_ds.engine.loop.hooks import TrainHook

__all__ = ["EvalCadence", "ValSubset", "subset_indices", "val_subset"]


class EvalCadence(TrainHook):
    """When to validate, from ``--eval-every`` text (``"epoch"``, ``"N"`` steps, ``"0.F"`` of an epoch).

    Args:
        every: the ``--eval-every`` text.

    Raises:
        ValueError: text :func:`tsm_ds.config.cadence.parse_eval_every` refuses (names the flag).
    """

    def __init__(self, every: str = "epoch"):
        self.kind, self.value = parse_eval_every(every)

    def validation_due(self, step: int, epoch_step: int, steps_per_epoch: int) -> bool:
        """Whether to validate after global optimizer step ``step`` (1-based), ``epoch_step`` of the
        epoch's ``steps_per_epoch`` steps being done (``epoch_step == steps_per_epoch``: its end)."""
        if self.kind == "steps":
            return step % int(self.value) == 0
        if epoch_step >= steps_per_epoch:
            return True   # "epoch" and fractions: every epoch's end
        if self.kind == "epoch":
            return False
        per = Fraction(self.value) * steps_per_epoch   # steps between two evaluation points (exact)
        return epoch_step // per > (epoch_step - 1) // per if epoch_step >= 1 else False


def subset_indices(n: int, cap: int, seed: int) -> list[int]:
    """The fixed subset: ``min(cap, n)`` distinct dataset indices of ``range(n)``, sorted.

    Args:
        n: validation clips; cap: ``--eval-max-clips`` (>= 1); seed: the run's seed.

    Returns:
        Sorted ints; the same for the same ``(n, cap, seed)`` on every rank and every call (a
        generator of its own: the global RNG is neither read nor advanced).

    Raises:
        ValueError: ``cap < 1`` (names ``--eval-max-clips``).
    """
    if cap is None or int(cap) < 1:
        raise ValueError(f"--eval-max-clips {cap}: give a number of validation clips >= 1")
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + 17)
    return sorted(torch.randperm(int(n), generator=g)[: int(cap)].tolist())


@dataclass
class ValSubset:
    """The capped validation subset of a run.

    Attributes:
        indices: its dataset indices (sorted; :func:`subset_indices`).
        loader: a validation loader over ``torch.utils.data.Subset(val_set, indices)`` (each clip
            once over all ranks; batches carry the clips' own dataset ``"index"``).
    """

    indices: list[int]
    loader: Any


def val_subset(val_set, cap: int | None, *, seed: int, world: int, rank: int, batch_size: int,
               num_workers: int, cuda: bool = False) -> ValSubset | None:
    """The capped subset's indices and loader; None without a cap, without a validation set, or
    when the cap covers the whole set (intermediate evaluations then score all of it).

    Args:
        val_set: the validation dataset (items ``{"clip", "label", "index", ...}``) or None.
        cap: ``--eval-max-clips`` or None; seed: the run's seed; world, rank: the ranks;
        batch_size: clips per rank per batch; num_workers: DataLoader workers; cuda: the rank trains
        on CUDA (pinned memory, persistent workers: :func:`tsm_ds.engine.loop.loaders.loader_options`).

    Raises:
        ValueError: ``cap < 1``.
    """
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    if cap is None or val_set is None or not len(val_set):
        return None
    idx = subset_indices(len(val_set), cap, seed)
    if len(idx) >= len(val_set):
        return None
    sub = Subset(val_set, idx)
    if getattr(val_set, "normalization", None) is not None:   # read by validate / gather_predictions
        sub.normalization = val_set.normalization
    from tsm_ds.data.packed_batch import collate_items
    from tsm_ds.engine.loop.loaders import loader_options

    sampler = DistributedSampler(sub, num_replicas=world, rank=rank, shuffle=False)
    # collate_items: with --decode-device the items hold PackedClip s, which default_collate refuses
    loader = DataLoader(sub, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                        generator=torch.Generator().manual_seed(seed), collate_fn=collate_items,
                        **loader_options(num_workers, cuda=cuda))
    return ValSubset(indices=idx, loader=loader)
