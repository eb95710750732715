"""The model registry: a plain dict arch -> builder, and :func:`build_model`.

The only module that imports both the TSM/TSN builder (:mod:`.tsn`) and the I3D builder
(:mod:`.i3d`); everything that needs "a model for this arch name" (training, evaluation, official
checkpoint import, complexity tables) goes through :func:`build_model`. No decorators: adding an
arch is one line in :data:`BUILDERS`.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch.nn as nn

from .i3d import build_i3d
from .tsn import ARCHS_2D, build_tsn


def _build_i3d(num_classes: int, *, num_segments: int = 8, shift: str | None = None,
               shift_div: int = 8, shift_place: str = "blockres", temporal_pool: bool = False,
               dropout: float = 0.5, partial_bn: bool = False, pretrained: str | None = None) -> nn.Module:
    """I3D-ResNet-50 with the common builder signature; refuses temporal shift options."""
    if shift not in (None, "bidirectional") or temporal_pool or shift_place != "blockres":
        raise ValueError("i3d_resnet50 has no temporal shift options; pass shift=None")
    return build_i3d(num_classes, num_segments=num_segments, dropout=dropout,
                     pretrained=pretrained, partial_bn=partial_bn)


#: arch name -> builder(num_classes, **options) returning an nn.Module (N, T, 3, H, W) -> (N, K)
BUILDERS: dict[str, Callable[..., nn.Module]] = {
    **{arch: partial(build_tsn, arch) for arch in ARCHS_2D},
    "i3d_resnet50": _build_i3d,
}
ARCHS = tuple(BUILDERS)


def build_model(arch: str, num_classes: int, *, num_segments: int = 8,
                shift: str | None = "bidirectional", shift_div: int = 8,
                shift_place: str = "blockres", temporal_pool: bool = False, dropout: float = 0.5,
                partial_bn: bool = False, pretrained: str | None = None) -> nn.Module:
    """Build a video recognizer taking clips (N, T, 3, H, W) float32 -> logits (N, num_classes).

    Args:
        arch: resnet18 / resnet34 / resnet50 / resnet101 / mobilenet_v2 (TSM or TSN) or
            i3d_resnet50 (the I3D baseline, :mod:`.i3d`; shift options must stay default/None).
        num_classes: classes of the new fc head (Kinetics-400: 400).
        num_segments: T, frames per clip.
        shift: "bidirectional" (TSM), "online" (uni-directional TSM, adds ``model.step``) or
            None (TSN).
        shift_div: 1/shift_div of the channels move per direction (official 8).
        shift_place: "blockres" (shift inside the residual branch, official default) or "block".
        temporal_pool: temporal max pooling before layer2 (ResNets; halves T).
        dropout: before the new fc (official Kinetics recipe 0.5).
        partial_bn: freeze all BatchNorm layers except the first during training.
        pretrained: path of a torchvision ImageNet state-dict file for the backbone (e.g.
            ``resnet50-0676ba61.pth``), or None for random init.

    Returns:
        :class:`.tsn.TSN` or :class:`.i3d.I3D`, with ``model.config`` = these arguments (with
        ``pretrained`` recorded as None, so ``build_model(**model.config)`` works where the
        ImageNet file is absent; load the trained weights into it).

    Raises:
        ValueError: unknown arch / option, or an incompatible combination.
        FileNotFoundError / RuntimeError: from loading ``pretrained`` (see :mod:`.weights`).
    """
    if arch not in BUILDERS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHS}")
    return BUILDERS[arch](num_classes, num_segments=num_segments, shift=shift, shift_div=shift_div,
                          shift_place=shift_place, temporal_pool=temporal_pool, dropout=dropout,
                          partial_bn=partial_bn, pretrained=pretrained)


