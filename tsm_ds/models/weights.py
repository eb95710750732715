"""Weights: reading state-dict files, exact loading with a named mismatch report, torchvision
ImageNet initialisation from a local file, and 2D -> 3D inflation for I3D.

Official TSM checkpoint import (file names, key mapping) is :mod:`.official`.
"""
from __future__ import annotations

import os
import re
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


_WRAPPERS = ("module.", "_orig_mod.", "base_model.")
_BLOCK_RE = re.compile(r"^((?:layer\d|features)\.\d+)\.")


def _normalise(key: str) -> str:
    """``key`` without wrapper prefixes (``module.``, ``_orig_mod.``, ``base_model.``) and with
    temporal pooling's ``layer2.net.`` read as ``layer2.``."""
    changed = True
    while changed:
        changed = False
        for pre in _WRAPPERS:
            if key.startswith(pre):
                key, changed = key[len(pre):], True
    return "layer2." + key[len("layer2.net."):] if key.startswith("layer2.net.") else key


def key_layout(keys) -> dict:
    """The temporal-shift layout that state-dict keys in the official naming show.

    Official ``TemporalShift`` wraps the shifted module as ``.net``: ``blockres`` shifts show as
    ``layer1.0.conv1.net.weight`` (MobileNetV2: ``features.3.conv.0.net.weight``), ``block``
    shifts as ``layer1.0.net.conv1.weight``, temporal pooling as ``layer2.net.*``
    (official ``ops/temporal_shift.py``). Returns ``{"blockres": set of block ids ("layer1.0"),
    "block": set, "tpool": bool, "blocks": {stage: number of blocks}}``.
    """
    lay = {"blockres": set(), "block": set(), "tpool": False, "blocks": {}}
    for raw in keys:
        k = _normalise(raw)
        lay["tpool"] |= "layer2.net." in raw
        m = _BLOCK_RE.match(k)
        if not m:
            continue
        bid = m[1]
        stage, idx = bid.rsplit(".", 1)
        lay["blocks"][stage] = max(lay["blocks"].get(stage, 0), int(idx) + 1)
        rest = k[len(bid) + 1:]
        if rest in ("conv1.net.weight", "conv.0.net.weight", "conv.0.0.net.weight"):
            lay["blockres"].add(bid)
        elif rest.startswith("net."):
            lay["block"].add(bid)
    return lay


def _module_layout(module: nn.Module) -> dict:
    """:func:`key_layout` of a model, read from its modules (our fused blockres shift keeps the
    torchvision parameter names, so its keys do not show it)."""
    keys = list(module.state_dict())
    for name, m in module.named_modules():
        kind = type(m).__name__
        if kind == "ShiftConv2d":
            keys.append(name + ".net.weight")
        elif kind in ("TemporalShift", "TemporalPool"):
            keys.append(name + ".net.x")
    return key_layout(keys)


def _which(lay: dict) -> str:
    return ("blockres" if lay["blockres"] else "block") if (lay["blockres"] or lay["block"]) else ""


def _rounds(shifted: set, blocks: dict) -> str:
    """``"every block (n_round=1)"`` / ``"every 2nd block (n_round=2)"`` / an irregular set."""
    stages = [s for s in blocks if s.startswith("layer")]
    every = {f"{s}.{i}" for s in stages for i in range(blocks[s])}
    if shifted == every:
        return "every block (official n_round=1)"
    if shifted == {b for b in every if int(b.rsplit(".", 1)[1]) % 2 == 0}:
        return "every 2nd block (official n_round=2, the rule for ResNets with >= 23 blocks in layer3)"
    return f"{len(shifted)} blocks"


def mismatch_causes(file_lay: dict, model_lay: dict, shapes, *, blockres_visible: bool = True) -> list[str]:
    """Why a checkpoint does not fit a model, from both sides' :func:`key_layout` (keys normalised
    on both sides, so a shift wrapper is not mistaken for a prefix problem) and the shape
    mismatches ``[(key, file shape, model shape)]``. ``blockres_visible=False`` for files in our
    own naming, where a fused ``blockres`` shift leaves no trace in the keys. Returns sentences."""
    causes = []
    fw, mw = _which(file_lay), _which(model_lay)
    if file_lay["blocks"] and model_lay["blocks"] and file_lay["blocks"] != model_lay["blocks"]:
        causes.append(f"the backbones differ: blocks per stage {file_lay['blocks']} in the checkpoint, "
                      f"{model_lay['blocks']} in the model: another arch (arch=, --arch)")
    elif fw and not mw and (blockres_visible or fw == "block"):
        n = len(file_lay[fw])
        causes.append(f"the checkpoint has a temporal shift ({n} ...net.weight keys, shift_place={fw!r}, e.g. "
                      f"{sorted(file_lay[fw])[0]}) but the model has none (a TSN): build it with "
                      f"shift='bidirectional' or 'online' (--shift), shift_place={fw!r}")
    elif mw and not fw and (blockres_visible or mw == "block"):
        causes.append(f"the model has a temporal shift (shift_place={mw!r}) but the checkpoint has none (no "
                      "...net.weight keys: a TSN): build it with shift=None (--shift none)")
    elif fw and mw and fw != mw and blockres_visible:
        causes.append(f"the shift placement differs: the checkpoint shifts at shift_place={fw!r}, the model at "
                      f"{mw!r} (--shift-place {fw})")
    elif fw and fw == mw and file_lay[fw] != model_lay[fw]:
        only = sorted(file_lay[fw] ^ model_lay[fw])
        causes.append(f"the shifted blocks differ: the checkpoint shifts {_rounds(file_lay[fw], file_lay['blocks'])}"
                      f", the model {_rounds(model_lay[fw], model_lay['blocks'])} (first difference: {only[0]})")
    if file_lay["tpool"] != model_lay["tpool"]:
        has, lacks = ("checkpoint", "model") if file_lay["tpool"] else ("model", "checkpoint")
        causes.append(f"the {has} has temporal pooling (layer2.net.* keys) but the {lacks} has none "
                      f"(temporal_pool={file_lay['tpool']}, --temporal-pool)")
    for k, a, b in shapes:
        if k.endswith(("new_fc.weight", "classifier.weight")) and tuple(a)[1:] == tuple(b)[1:]:
            causes.append(f"the head sizes differ: the checkpoint has {a[0]} classes, the model {b[0]} "
                          f"(num_classes={a[0]}, --num-classes {a[0]}; --tune-from replaces the head)")
    return causes


def _mismatch_report(path, missing, unexpected, shapes, causes=()) -> str:
    lines = [f"checkpoint {path} does not fit the model:"]
    lines += [f"  cause: {c}" for c in causes]
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
                 "temporal_pool) or pass them as overrides; num_segments, shift_div and dropout "
                 "change no weight")
    return "\n".join(lines)


def load_exact(module: nn.Module, sd: dict[str, torch.Tensor], path, *,
               optional: tuple[str, ...] = ("num_batches_tracked",), file_keys=None) -> None:
    """Load ``sd`` into ``module``; every key must match (``optional`` suffixes may be absent).

    Args:
        module: the model; ``sd``: its state dict to load (our key names).
        path: named in the error message.
        optional: key suffixes that may be missing from ``sd``.
        file_keys: the file's own keys in the official naming (shift wrappers as ``.net``), when
            ``sd`` was converted from them: the mismatch causes are read from them.

    Raises:
        CheckpointError: missing, unexpected or shape-mismatched keys; the message starts with
            ``checkpoint {path} does not fit the model:``, then ``cause: ...`` lines (temporal shift
            present on one side only, shift placement, shifted blocks / n_round, temporal pooling,
            head size, backbone depth; see :func:`mismatch_causes`), then the keys.
    """
    own = module.state_dict()
    missing = [k for k in own if k not in sd and not k.endswith(optional)]
    unexpected = [k for k in sd if k not in own]
    shapes = [(k, sd[k].shape, own[k].shape) for k in own if k in sd and sd[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        file_lay = key_layout(file_keys if file_keys is not None else sd)
        causes = mismatch_causes(file_lay, _module_layout(module), shapes,
                                 blockres_visible=file_keys is not None)
        raise CheckpointError(_mismatch_report(path, missing, unexpected, shapes, causes))
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
