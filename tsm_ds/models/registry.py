"""The model registry: a plain dict arch -> builder, and :func:`build_model`.

The only module that imports both the TSM/TSN builder (:mod:`.tsn`) and the I3D builder
(:mod:`.i3d`); everything that needs "a model for this arch name" (training, evaluation, official
checkpoint import, complexity tables) goes through :func:`build_model`. No decorators: adding an
arch is one line in :data:`BUILDERS`.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping

import torch.nn as nn

from .i3d import ARCH_LAYOUTS, build_i3d
from .tsn import ARCHS_2D, build_tsn


def _build_i3d(layout: str, num_classes: int, *, num_segments: int = 8, shift: str | None = None,
               shift_div: int = 8, shift_place: str = "blockres", temporal_pool: bool = False,
               dropout: float = 0.5, partial_bn: bool = False, pretrained: str | None = None) -> nn.Module:
    """I3D-ResNet-50 in ``layout`` (:data:`.i3d.LAYOUTS`) with the common builder signature;
    refuses temporal shift options (ValueError)."""
    if shift not in (None, "bidirectional") or temporal_pool or shift_place != "blockres":
        raise ValueError("I3D has no temporal shift options; pass shift=None")
    return build_i3d(num_classes, layout=layout, num_segments=num_segments, dropout=dropout,
                     pretrained=pretrained, partial_bn=partial_bn)


#: arch name -> builder(num_classes, **options) returning an nn.Module (N, T, 3, H, W) -> (N, K)
BUILDERS: dict[str, Callable[..., nn.Module]] = {
    **{arch: partial(build_tsn, arch) for arch in ARCHS_2D},
    "i3d_resnet50": partial(_build_i3d, ARCH_LAYOUTS["i3d_resnet50"]),
    "i3d_resnet50_release": partial(_build_i3d, ARCH_LAYOUTS["i3d_resnet50_release"]),
}
ARCHS = tuple(BUILDERS)


def check_checkpoint_config(config: Mapping[str, Any]) -> None:
    """Refuse a checkpoint's ``model_config`` whose weights would load into a different network.

    Before issue 18, ``i3d_resnet50`` was our own layout (conv1 without temporal stride, a 3x3x3
    max-pool with temporal stride 2, no pool after res2: res2-res5 at T/2). Its weights have the
    same shapes as today's layouts, so they would load silently into the wrong network. Configs
    written since record ``i3d_layout`` (:data:`.i3d.LAYOUTS`); an I3D config without it, or with
    one that does not match its arch, is refused. Call before ``build_model(**config)`` for a
    config read from a checkpoint (:func:`tsm_ds.inference.loading.load_for_inference` does).

    Raises:
        ValueError: the config names an I3D arch without (or with a mismatched) ``i3d_layout``;
            the message says what to do.
    """
    arch = config.get("arch")
    if arch not in ARCH_LAYOUTS:
        return
    layout = config.get("i3d_layout")
    if layout is None:
        raise ValueError(
            f"checkpoint config has arch={arch!r} but no 'i3d_layout': it was trained with the old "
            "tsm_ds I3D layout (res2-res5 at T/2, no pool after res2), which no reference uses and "
            "which is no longer built; its weights would load into a different network. Retrain (or "
            "fine-tune from its weights with --tune-from) as arch 'i3d_resnet50' (mmaction2 / non-local "
            "paper layout) or 'i3d_resnet50_release' (released video-nonlocal-net layout)")
    if layout != ARCH_LAYOUTS[arch]:
        raise ValueError(f"checkpoint config has arch={arch!r} with i3d_layout={layout!r}; that arch "
                         f"is layout {ARCH_LAYOUTS[arch]!r}")


def build_model(arch: str, num_classes: int, *, num_segments: int = 8,
                shift: str | None = "bidirectional", shift_div: int = 8,
                shift_place: str = "blockres", temporal_pool: bool = False, dropout: float = 0.5,
                partial_bn: bool = False, pretrained: str | None = None,
                i3d_layout: str | None = None) -> nn.Module:
    """Build a video recognizer taking clips (N, T, 3, H, W) float32 -> logits (N, num_classes).

    Args:
        arch: resnet18 / resnet34 / resnet50 / resnet101 / mobilenet_v2 (TSM or TSN) or
            i3d_resnet50 (the I3D baseline in the non-local paper's / mmaction2's layout, 33.1
            GMACs at 32x224x224) or i3d_resnet50_release (the released video-nonlocal-net layout,
            113.6 GMACs) (:mod:`.i3d`; shift options must stay default/None).
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
        i3d_layout: recorded in an I3D ``model.config`` so that ``build_model(**model.config)``
            works; None, or the arch's layout (:data:`.i3d.ARCH_LAYOUTS`).

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
    if i3d_layout is not None and ARCH_LAYOUTS.get(arch) != i3d_layout:
        raise ValueError(f"i3d_layout={i3d_layout!r} does not fit arch {arch!r} "
                         f"(I3D archs and their layouts: {ARCH_LAYOUTS})")
    return BUILDERS[arch](num_classes, num_segments=num_segments, shift=shift, shift_div=shift_div,
                          shift_place=shift_place, temporal_pool=temporal_pool, dropout=dropout,
                          partial_bn=partial_bn, pretrained=pretrained)


