"""Optimizer param groups, client optimizers and the client lr schedule.

Per-group lr multipliers (official TSM: the new fc weight x5, its bias x10; no weight decay on
biases and BatchNorm) live in each param group as ``lr_mult``; every group's ``lr`` is
``base lr x lr_mult``. Schedules here multiply each group's own initial lr, so the ratios survive.

Source: mit-han-lab/temporal-shift-module, ``models.py`` (``get_optim_policies``) and ``main.py``
(``adjust_learning_rate``: step decay x0.1 at ``--lr_steps``, or cosine).
"""
from __future__ import annotations

import math
from typing import Callable

import torch


def apply_group_lrs(groups: list[dict], lr: float) -> list[dict]:
    """Give each param group ``lr = lr x group["lr_mult"]`` (missing ``lr_mult`` = 1).

    Args:
        groups: dicts with ``params`` and optional ``lr_mult`` / ``weight_decay`` / ``name``
            (``tsm_ds.models.parameter_groups``' format); not modified.
        lr: the base lr for the global batch.

    Returns:
        New list of group dicts, ready for a torch optimizer or ``deepspeed.initialize``.
    """
    out = []
    for g in groups:
        g = dict(g)
        g.setdefault("lr_mult", 1.0)
        g["lr"] = float(lr) * float(g["lr_mult"])
        out.append(g)
    return out


def build_client_optimizer(block: dict, groups: list[dict]) -> torch.optim.Optimizer:
    """Build the ``tsm_ds.optimizer`` block's optimizer on the given param groups.

    Types: ``timm.Lamb`` (You et al. 2020), ``timm.Lars`` (You et al. 2017; timm's LARS with
    trust coefficient, momentum), ``torch.SGD``, ``torch.AdamW``. ``params`` are keyword arguments of
    the class (``lr`` and ``weight_decay`` already resolved; per-group values in ``groups`` win).

    Raises:
        ValueError: an unknown type (the message lists the known ones).
    """
    t = str(block.get("type", "")).lower()
    params = dict(block.get("params", {}))
    if t == "timm.lamb":
        from timm.optim import Lamb
        cls = Lamb
    elif t == "timm.lars":
        from timm.optim import Lars
        cls = Lars
    elif t == "torch.sgd":
        cls = torch.optim.SGD
    elif t == "torch.adamw":
        cls = torch.optim.AdamW
    else:
        raise ValueError(f"tsm_ds.optimizer.type = {block.get('type')!r}: use timm.Lamb, timm.Lars, "
                         f"torch.SGD or torch.AdamW")
    return cls(groups, **params)


class WarmupStepLR(torch.optim.lr_scheduler.LRScheduler):
    """Linear warmup in optimizer steps, then step decay (or cosine) by epoch; per-group ratios kept.

    Each group's lr at optimizer step s (0-based, before the update of step s+1):
    ``initial_lr x warm(s) x decay(s)`` with ``warm(s) = min(1, (s + 1) / warmup_steps)``
    (1 when warmup_steps == 0) and, for ``kind="step"``, ``decay(s) = gamma ** #{e in
    decay_epochs : s >= e x steps_per_epoch}``; for ``kind="cosine"``,
    ``0.5 (1 + cos(pi s / total_steps))``; ``"constant"``: 1.

    Args:
        optimizer: the torch optimizer whose groups carry their own initial lrs.
        kind: "step" | "cosine" | "constant".
        steps_per_epoch: optimizer steps per epoch (>= 1).
        total_steps: optimizer steps of the whole run (cosine horizon).
        warmup_steps: linear warmup length in optimizer steps (large-batch recipes count it in
            steps: 12,288 clips x 20 steps make a Kinetics epoch).
        decay_epochs: epochs at which the lr is multiplied by gamma (official Kinetics: 20, 40).
        gamma: decay factor (0.1).

    Raises:
        ValueError: steps_per_epoch < 1 or unknown kind.
    """

    def __init__(self, optimizer, *, kind: str = "step", steps_per_epoch: int, total_steps: int,
                 warmup_steps: int = 0, decay_epochs=(20, 40), gamma: float = 0.1, last_epoch: int = -1):
        if steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        if kind not in ("step", "cosine", "constant"):
            raise ValueError(f"kind must be step, cosine or constant, got {kind!r}")
        self.kind = kind
        self.steps_per_epoch = int(steps_per_epoch)
        self.total_steps = max(1, int(total_steps))
        self.warmup_steps = int(warmup_steps)
        self.decay_epochs = [float(e) for e in decay_epochs]
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """lr factor at optimizer step ``step`` (0-based)."""
        warm = 1.0 if self.warmup_steps <= 0 else min(1.0, (step + 1) / self.warmup_steps)
        if self.kind == "step":
            n = sum(step >= e * self.steps_per_epoch for e in self.decay_epochs)
            decay = self.gamma ** n
        elif self.kind == "cosine":
            decay = 0.5 * (1.0 + math.cos(math.pi * min(step, self.total_steps) / self.total_steps))
        else:
            decay = 1.0
        return warm * decay

    def get_lr(self):  # noqa: D401 - torch API
        f = self.factor(self.last_epoch)
        return [base * f for base in self.base_lrs]


def client_scheduler_factory(block: dict) -> Callable[[torch.optim.Optimizer], WarmupStepLR]:
    """A callable for ``deepspeed.initialize(lr_scheduler=...)`` from a resolved ``tsm_ds.lr_schedule``.

    DeepSpeed calls it with its basic (unwrapped) optimizer, so the schedule sees every param
    group with its own lr and steps once per optimizer step (not on skipped fp16 steps).
    """
    def make(optimizer):
        return WarmupStepLR(optimizer, kind=block["type"], steps_per_epoch=block["steps_per_epoch"],
                            total_steps=block["total_steps"], warmup_steps=block.get("warmup_steps", 0),
                            decay_epochs=block.get("decay_epochs", ()), gamma=block.get("gamma", 0.1))
    return make
