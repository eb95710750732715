"""Model complexity (parameters, multiply-adds, FLOPs) and the rows of the ``tsm-ds models`` table.

Counting: ``torch.utils.flop_counter.FlopCounterMode`` counts convolutions and matrix products at
2 FLOPs per multiply-add; the TSM paper (Table 1, "FLOPs") counts multiply-adds, so both are
reported, labelled. Element-wise work (BN, ReLU, the shift, pooling) is not counted, as in the
paper. The count runs on the ``meta`` device (no memory, no arithmetic), so it is instant even
for I3D at 32 frames.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from .registry import build_model


def _meta_copy(model: nn.Module) -> nn.Module:
    config = getattr(model, "config", None)
    if config is not None:
        with torch.device("meta"):
            meta = build_model(**{**config, "pretrained": None})
    else:
        meta = copy.deepcopy(model).to("meta")
    return meta.eval()


def complexity(model: nn.Module, *, num_segments: int, img_size: int,
               layout: str = "NTCHW") -> dict[str, int]:
    """Parameters, multiply-adds and FLOPs of one clip (N=1) through ``model``.

    Args:
        model: any module taking clips (N, T, 3, H, W) (all tsm_ds models). It is not run: a
            ``meta``-device copy is (rebuilt from ``model.config`` when present).
        num_segments: T, frames per clip.
        img_size: H = W in pixels.
        layout: "NTCHW" (tsm_ds models) or "NCTHW" (torchvision video models).

    Returns:
        {"params": int (all parameters), "macs": int (multiply-adds), "flops": int (= 2 * macs as
        torch.utils.flop_counter counts)}.
    """
    params = sum(p.numel() for p in model.parameters())
    meta = _meta_copy(model)
    shape = (1, num_segments, 3, img_size, img_size) if layout == "NTCHW" else \
        (1, 3, num_segments, img_size, img_size)
    x = torch.empty(shape, device="meta")
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        meta(x)
    flops = int(counter.get_total_flops())
    return {"params": int(params), "macs": flops // 2, "flops": flops}


# (label, build_model kwargs, frames)
TABLE_MODELS: list[tuple[str, dict[str, Any], int]] = [
    ("TSM-ResNet18", dict(arch="resnet18"), 8),
    ("TSM-ResNet34", dict(arch="resnet34"), 8),
    ("TSM-ResNet50", dict(arch="resnet50"), 8),
    ("TSM-ResNet50 online", dict(arch="resnet50", shift="online"), 8),
    ("TSM-ResNet101", dict(arch="resnet101"), 8),
    ("TSM-MobileNetV2", dict(arch="mobilenet_v2"), 8),
    ("TSN-ResNet50", dict(arch="resnet50", shift=None), 8),
    # I3D only at the 32 frames of the references (at 8 frames the mmaction2 layout runs res5 at T=1)
    ("I3D-ResNet50 (non-local paper / mmaction2) 32f", dict(arch="i3d_resnet50", shift=None), 32),
    ("I3D-ResNet50 (released non-local code) 32f", dict(arch="i3d_resnet50_release", shift=None), 32),
]


def table_rows(num_classes: int = 400, img_size: int = 224, num_segments: int | None = None
               ) -> list[dict[str, Any]]:
    """One row per supported model: label, arch, shift, frames, params (M), GMACs, GFLOPs per clip.

    ``num_segments`` None keeps each row's default (8; 32 for the two I3D rows: 33.1 and 113.6
    GMACs, 28.04 M parameters at 224 px, see :mod:`.i3d`).
    """
    rows = []
    for label, kwargs, frames in TABLE_MODELS:
        t = num_segments or frames
        with torch.device("meta"):
            model = build_model(num_classes=num_classes, num_segments=t, **kwargs)
        c = complexity(model, num_segments=t, img_size=img_size)
        rows.append({"model": label, "arch": kwargs["arch"], "shift": kwargs.get("shift",
                     "bidirectional") or "none", "frames": t, "img_size": img_size,
                     "params_M": round(c["params"] / 1e6, 2), "GMACs": round(c["macs"] / 1e9, 2),
                     "GFLOPs": round(c["flops"] / 1e9, 2)})
    return rows
