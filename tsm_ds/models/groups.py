"""Optimizer parameter groups of the official TSM recipe (lr multipliers, no decay on biases/BN)."""
from __future__ import annotations

from typing import Any

import torch.nn as nn


def head_mults_on(setting: str, *, pretrained: bool, tune_from: str | None) -> bool:
    """Whether the new head trains at the official fc x5 / fc bias x10 (``--head-lr-mults``):
    ``"on"`` / ``"off"``, or ``"auto"``: on for a new head on pretrained weights (``--pretrained``,
    ``--tune-from``), off from scratch. The official code (``main.py``, ``fc_lr5``) uses them for a
    head trained on ImageNet weights; from scratch they only make the head's lr 5-10x the rest's (at
    the linear rule's 12,288 clips: an fc bias lr of 19.2)."""
    if setting in ("on", "off"):
        return setting == "on"
    if setting != "auto":
        raise ValueError(f"--head-lr-mults {setting!r}: choose auto, on or off")
    return bool(pretrained or tune_from)


def parameter_groups(model: nn.Module, *, weight_decay: float = 1e-4, fc_lr_mult: float = 5.0,
                     fc_bias_lr_mult: float = 10.0, bias_lr_mult: float = 2.0, head_mults: bool = True
                     ) -> list[dict[str, Any]]:
    """Optimizer parameter groups as the official recipe (``TSN.get_optim_policies``).

    Groups (empty ones omitted; parameters with ``requires_grad=False``, e.g. partial BN, skipped):

    =============  ==================  ==============  ===========================================
    name           weight_decay        lr_mult         parameters
    =============  ==================  ==============  ===========================================
    weight         ``weight_decay``    1               conv / linear weights of the backbone
    bias           0                   bias_lr_mult    backbone biases (official lr x2)
    bn             0                   1               BatchNorm weights and biases
    fc_weight      ``weight_decay``    fc_lr_mult      the new fc weight (official x5)
    fc_bias        0                   fc_bias_lr_mult the new fc bias (official x10)
    =============  ==================  ==============  ===========================================

    ``head_mults=False`` is the official ``fc_lr5=False``: the head's weight at x1 and its bias at
    ``bias_lr_mult``, as every other weight and bias (from scratch, or fine-tuning from a
    checkpoint of the same dataset; :func:`head_mults_on`).

    Returns:
        list of {"params": [Parameter], "weight_decay": float, "lr_mult": float, "name": str};
        the trainer multiplies its learning rate by ``lr_mult``.

    Raises:
        ValueError: a trainable parameter of an unsupported module type (nothing is dropped
            silently).
    """
    head = getattr(model, "new_fc", None)
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    groups: dict[str, list] = {k: [] for k in ("weight", "bias", "bn", "fc_weight", "fc_bias")}
    seen: set[int] = set()
    norm_types = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            if id(p) in head_ids:
                groups["fc_weight" if p_name == "weight" else "fc_bias"].append(p)
            elif isinstance(mod, norm_types):
                groups["bn"].append(p)
            elif isinstance(mod, (nn.Conv2d, nn.Conv3d, nn.Linear)):
                groups["weight" if p_name == "weight" else "bias"].append(p)
            else:
                raise ValueError(f"parameter_groups: no rule for parameter {mod_name}.{p_name} "
                                 f"of {type(mod).__name__}")
    if not head_mults:
        fc_lr_mult, fc_bias_lr_mult = 1.0, bias_lr_mult
    spec = {"weight": (weight_decay, 1.0), "bias": (0.0, bias_lr_mult), "bn": (0.0, 1.0),
            "fc_weight": (weight_decay, fc_lr_mult), "fc_bias": (0.0, fc_bias_lr_mult)}
    return [{"params": ps, "weight_decay": spec[k][0], "lr_mult": spec[k][1], "name": k}
            for k, ps in groups.items() if ps]
