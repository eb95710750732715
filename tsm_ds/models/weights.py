"""Weights: reading state-dict files, exact loading with a named mismatch report, torchvision
ImageNet initialisation from a local file, and 2D -> 3D inflation for I3D.

Official TSM checkpoint import (file names, key mapping) is :mod:`.official`.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn

class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read or does not fit the model (message says why)."""


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a state dict from a ``.pth`` file safely (``torch.load(weights_only=True)``).

    Accepts a plain state dict or a dict holding one under ``state_dict`` or ``model``.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: unreadable / corrupt / not a state dict (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for damaged files
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}. The file is "
                              "corrupt, truncated, or not a PyTorch weights file; download it again"
                              ) from e
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{path} does not hold a state dict (a dict of name -> tensor, or a "
                              "dict with one under 'state_dict')")
    return obj


def _mismatch_report(path, missing, unexpected, shapes) -> str:
    lines = [f"checkpoint {path} does not fit the model:"]
    if missing:
        lines.append(f"  {len(missing)} keys the model needs are missing from the file: "
                     + ", ".join(sorted(missing)[:20]) + (" ..." if len(missing) > 20 else ""))
    if unexpected:
        lines.append(f"  {len(unexpected)} keys in the file have no place in the model: "
                     + ", ".join(sorted(unexpected)[:20]) + (" ..." if len(unexpected) > 20 else ""))
    if shapes:
        lines.append(f"  {len(shapes)} shape mismatches (key: file vs model): " + ", ".join(
            f"{k}: {tuple(a)} vs {tuple(b)}" for k, a, b in shapes[:20]))
    lines.append("  check the architecture options (arch, num_classes, shift, shift_place, "
                 "temporal_pool) or pass them as overrides")
    return "\n".join(lines)


def load_exact(module: nn.Module, sd: dict[str, torch.Tensor], path, *,
                optional: tuple[str, ...] = ("num_batches_tracked",)) -> None:
    """Load ``sd`` into ``module``; every key must match (``optional`` suffixes may be absent)."""
    own = module.state_dict()
    missing = [k for k in own if k not in sd and not k.endswith(optional)]
    unexpected = [k for k in sd if k not in own]
    shapes = [(k, sd[k].shape, own[k].shape) for k in own if k in sd and sd[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointError(_mismatch_report(path, missing, unexpected, shapes))
    merged = dict(own)
    merged.update(sd)
    module.load_state_dict(merged, strict=True)


def load_imagenet_state_dict(backbone: nn.Module, path: str | os.PathLike) -> None:
    """Initialise a torchvision 2D backbone from a local torchvision ImageNet state-dict file.

    Args:
        backbone: e.g. ``torchvision.models.resnet50(weights=None)`` (before heads are replaced or
            shifts inserted; shift convs keep torchvision's parameter names anyway).
        path: the file torchvision downloads, e.g. ``resnet50-0676ba61.pth`` or
            ``mobilenet_v2-b0353104.pth`` (``torchvision.models.ResNet50_Weights.IMAGENET1K_V1``).

    Raises:
        FileNotFoundError, CheckpointError: unreadable file or keys/shapes that do not match
            (listed in the message).
    """
    load_exact(backbone, read_state_dict(path), path)


def inflate_2d_state_dict(sd2d: dict[str, torch.Tensor], model3d: nn.Module
                          ) -> dict[str, torch.Tensor]:
    """Inflate a torchvision ResNet-50 state dict to :class:`.i3d.I3D` (I3D, Carreira & Zisserman
    2017, Sec. 2.4): each 2D kernel repeated over the kt frames and divided by kt.

    Returns a state dict for every parameter/buffer of ``model3d`` except the new fc head.

    Raises:
        CheckpointError: a key of the 3D model is missing from the 2D state dict.
    """
    out, missing = {}, []
    for k, v in model3d.state_dict().items():
        if k.startswith("new_fc."):
            continue
        if k not in sd2d:
            if not k.endswith("num_batches_tracked"):
                missing.append(k)
            continue
        src = sd2d[k]
        if v.dim() == 5 and src.dim() == 4:
            kt = v.shape[2]
            src = src.unsqueeze(2).repeat(1, 1, kt, 1, 1) / kt
        out[k] = src
    if missing:
        raise CheckpointError("ImageNet state dict lacks keys needed to inflate I3D: "
                              + ", ".join(missing[:20]))
    return out
