"""Official TSM checkpoint import: options from the file name, key mapping, exact loading.

Official checkpoints (https://github.com/mit-han-lab/temporal-shift-module, ``main.py``
``save_checkpoint``) are dicts ``{"epoch", "arch", "state_dict", "optimizer", "best_prec1"}``;
``state_dict`` has ``nn.DataParallel`` keys (``module.base_model.layer1.0.conv1.net.weight``,
``module.new_fc.weight``). Their options live in the file name (``main.py``: ``TSM_{dataset}_
{modality}_{arch}[_shift{div}_{place}][_tpool]_{consensus}_segment{T}_e{epochs}[_dense][_nl]``).

Key mapping, ours -> official (:func:`official_key`):

* prefix ``module.``; our ``base_model`` / ``new_fc`` names are the official ones;
* a fused ``blockres`` shift conv ``P`` (:class:`.shift.ShiftConv2d`): ``P.weight`` ->
  ``P.net.weight`` (the official ``TemporalShift`` wrapper); ``block`` placement and temporal
  pooling use the official wrapper modules here too (``layer1.0.net.conv1.weight``,
  ``layer2.net.0.conv1.weight``), so they need no mapping;
* MobileNetV2: torchvision groups conv+BN(+ReLU6) in ``Conv2dNormActivation`` modules, the
  official ``archs/mobilenet_v2.py`` uses one flat ``nn.Sequential`` per block. Inside
  ``features.{i}`` (an inverted-residual block):

  ======================================  ===========================  ========================
  torchvision (ours)                      official (expand ratio 6)    official (ratio 1, i=1)
  ======================================  ===========================  ========================
  ``conv.0.0`` pointwise / depthwise conv ``conv.0`` (shifted:         ``conv.0`` (depthwise)
                                          ``conv.0.net``)
  ``conv.0.1`` BN                         ``conv.1``                   ``conv.1``
  ``conv.1.0`` depthwise conv (ratio 6)   ``conv.3``                   --
  ``conv.1.1`` BN (ratio 6)               ``conv.4``                   --
  ``conv.1`` pointwise-linear (ratio 1)   --                           ``conv.3``
  ``conv.2`` pointwise-linear / BN        ``conv.6``                   ``conv.4`` (BN)
  ``conv.3`` BN (ratio 6)                 ``conv.7``                   --
  ======================================  ===========================  ========================

  ``features.0.{0,1}`` (stem) and ``features.18.{0,1}`` (last 1x1 conv) have the same names in
  both; the official classifier is ``nn.Dropout`` (no parameters) + ``new_fc``, as here.
"""
from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .registry import build_model
from .shift import ShiftConv2d
from .weights import load_exact, read_state_dict

# Classes per dataset in the official code (ops/dataset_config.py).
DATASET_CLASSES = {"kinetics": 400, "something": 174, "somethingv2": 174, "jester": 27,
                   "ucf101": 101, "hmdb51": 51, "mini-kinetics": 200}
ARCH_NAMES = {"resnet18": "resnet18", "resnet34": "resnet34", "resnet50": "resnet50",
              "resnet101": "resnet101", "mobilenetv2": "mobilenet_v2"}



_NAME_RE = re.compile(
    r"^TSM_(?P<dataset>[A-Za-z0-9\-]+?)_(?P<modality>RGB|Flow|RGBDiff)_(?P<arch>[A-Za-z0-9]+)"
    r"(?:_shift(?P<div>\d+)_(?P<place>blockres|block))?(?P<tpool>_tpool)?"
    r"_(?P<consensus>avg|identity)_segment(?P<seg>\d+)(?:_e(?P<epochs>\d+))?(?P<rest>.*)$")
# online_demo/main.py downloads mobilenetv2_jester_online.pth.tar (online_demo/mobilenet_v2_tsm.py)
_ONLINE_RE = re.compile(r"^(?P<arch>mobilenetv2)_(?P<dataset>[A-Za-z0-9\-]+?)_online(?P<rest>.*)$")
_EXTENSIONS = (".tar", ".pth", ".pt", ".ckpt", ".bin")
#: ``main.py`` saves ``{root_model}/{store_name}/ckpt.pth.tar`` and ``ckpt.best.pth.tar``
_SAVE_NAMES = ("ckpt.pth.tar", "ckpt.best.pth.tar")


def _stem(name: str) -> str:
    """``name`` without its checkpoint extensions (``.pth``, ``.pth.tar``, ``.pt``, ``.tar`` ...)."""
    changed = True
    while changed:
        changed = False
        for ext in _EXTENSIONS:
            if name.endswith(ext) and len(name) > len(ext):
                name, changed = name[:-len(ext)], True
    return name


def _suffix_parts(rest: str) -> list[str]:
    """``"_lr0.01-v2_dense"`` -> ``["lr0.01", "v2", "dense"]`` (parts after the official ones)."""
    return [t for t in re.split(r"[_\-]+", rest) if t]


class NotOfficialNameError(ValueError):
    """A file name that is not an official TSM checkpoint name (its options must be given)."""


def parse_official_name(path: str | os.PathLike) -> dict[str, Any]:
    """Options encoded in an official TSM checkpoint file name.

    ``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth`` ->
    ``{"build": {"arch": "resnet50", "num_classes": 400, "num_segments": 8, "shift":
    "bidirectional", "shift_div": 8, "shift_place": "blockres", "temporal_pool": False},
    "dataset": "kinetics", "epochs": 50, "dense": False, "layout": "tsn"}``. No ``shift`` part =
    a TSN. Names follow official ``main.py`` (``store_name``: ``TSM_{dataset}_{modality}_{arch}
    [_shift{div}_{place}][_tpool]_{consensus}_segment{T}_e{epochs}`` then optional parts such as
    ``_{pretrain}``, ``_{lr_type}``, ``_dense``, ``_nl``, ``_{suffix}``). Any suffix after
    ``segment{T}[_e{epochs}]`` is accepted (``_lr0.01``, ``-v2``, ``_cos``, ``_dense10``); parts
    that are no model option are warned about (``UserWarning``), not refused. Extensions
    ``.pth``, ``.pth.tar``, ``.pt``, ``.tar`` are stripped. ``main.py``'s own file names
    ``ckpt.pth.tar`` / ``ckpt.best.pth.tar`` are read from their directory's name (the
    ``store_name``). The online demo's ``mobilenetv2_jester_online.pth.tar``
    (``online_demo/main.py``) gives ``shift="online"`` and ``"layout": "online_demo"`` (its
    keys are ``features.*`` / ``classifier.*``, see :func:`convert_official_state_dict`).
    ``epochs`` is None when the name has none.

    Raises:
        ValueError: the name does not follow the official pattern (message starts with
            ``'<name>' is not an official TSM checkpoint name``); non-local models (``_nl``),
            Flow / RGBDiff modality, a consensus other than avg, or an unsupported arch - each
            with a message saying what is not supported.
    """
    p = Path(path)
    name = p.name
    if name in _SAVE_NAMES and p.parent.name:
        try:
            return parse_official_name(p.parent.name)
        except ValueError as e:
            if "not an official" not in str(e):
                raise
    stem = _stem(name)
    online = _ONLINE_RE.match(stem)
    if online:
        _warn_unused(name, _suffix_parts(online["rest"]), set())
        build = {"arch": ARCH_NAMES[online["arch"]], "num_classes": DATASET_CLASSES.get(online["dataset"]),
                 "num_segments": 8, "shift": "online", "shift_div": 8, "shift_place": "blockres",
                 "temporal_pool": False}
        return {"build": build, "dataset": online["dataset"], "epochs": None, "dense": False,
                "layout": "online_demo"}
    m = _NAME_RE.match(stem)
    if not m:
        raise NotOfficialNameError(f"{name!r} is not an official TSM checkpoint name (expected e.g. "
                         "TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth); pass "
                         "arch=, num_classes=, num_segments=, shift= ... as overrides")
    rest = _suffix_parts(m["rest"])
    if "nl" in rest:
        raise ValueError(f"{name}: non-local TSM checkpoints (_nl) are not supported: tsm_ds has no "
                         "non-local blocks; use the plain TSM checkpoint of the same setting")
    if m["modality"] != "RGB":
        raise ValueError(f"{name}: {m['modality']} checkpoints are not supported: tsm_ds models take "
                         "RGB clips (N, T, 3, H, W); Flow needs stacked optical-flow input")
    if m["consensus"] != "avg":
        raise ValueError(f"{name}: consensus {m['consensus']!r} is not supported (avg only)")
    arch = ARCH_NAMES.get(m["arch"])
    if arch is None:
        raise ValueError(f"{name}: arch {m['arch']!r} is not supported; supported: "
                         + ", ".join(ARCH_NAMES))
    dense = [t for t in rest if re.fullmatch(r"dense\d*", t)]
    _warn_unused(name, rest, set(dense))
    build = {"arch": arch, "num_classes": DATASET_CLASSES.get(m["dataset"]),
             "num_segments": int(m["seg"]),
             "shift": "bidirectional" if m["div"] else None,
             "shift_div": int(m["div"]) if m["div"] else 8,
             "shift_place": m["place"] or "blockres", "temporal_pool": bool(m["tpool"])}
    return {"build": build, "dataset": m["dataset"],
            "epochs": int(m["epochs"]) if m["epochs"] else None, "dense": bool(dense), "layout": "tsn"}


def _warn_unused(name: str, parts: list[str], known: set[str]) -> None:
    other = [t for t in parts if t not in known]
    if other:
        warnings.warn(f"{name}: name parts {other} are not model options and were not used "
                      "(e.g. a learning-rate schedule or a suffix)", stacklevel=3)


def _mobilenet_official_path(tv_path: str, model: nn.Module) -> str:
    """Map a torchvision MobileNetV2 module path (relative to ``base_model``) to the official one."""
    parts = tv_path.split(".")
    if len(parts) < 4 or parts[0] != "features" or parts[2] != "conv":
        return tv_path
    block = model.base_model.features[int(parts[1])]
    expand = len(block.conv) == 4
    table = ({("0", "0"): "0", ("0", "1"): "1", ("1", "0"): "3", ("1", "1"): "4", ("2",): "6",
              ("3",): "7"} if expand else
             {("0", "0"): "0", ("0", "1"): "1", ("1",): "3", ("2",): "4"})
    sub = tuple(parts[3:])
    for key, off in table.items():
        if sub[:len(key)] == key:
            return ".".join(parts[:3] + [off] + list(sub[len(key):]))
    return tv_path


def official_key(key: str, model: nn.Module) -> str:
    """The official checkpoint key of our state-dict ``key`` (see the module docstring)."""
    mod_path, _, leaf = key.rpartition(".")
    mod = model.get_submodule(mod_path) if mod_path else model
    path = mod_path
    arch = getattr(model, "config", {}).get("arch")
    if arch == "mobilenet_v2" and path.startswith("base_model."):
        path = "base_model." + _mobilenet_official_path(path[len("base_model."):], model)
    if isinstance(mod, ShiftConv2d):
        path += ".net"
    return "module." + path + "." + leaf


def is_online_demo(keys) -> bool:
    """Keys of ``online_demo/mobilenet_v2_tsm.py``'s MobileNetV2: ``features.*`` / ``classifier.*``
    at the top (no ``base_model.`` / ``new_fc.``)."""
    keys = [k[len("module."):] if k.startswith("module.") else k for k in keys]
    return "classifier.weight" in keys and any(k.startswith("features.") for k in keys) and not any(
        k.startswith(("base_model.", "new_fc.")) for k in keys)


def online_demo_key(key: str, model: nn.Module) -> str:
    """The key of our state-dict ``key`` in the online demo's checkpoint
    (``mobilenetv2_jester_online.pth.tar``, ``online_demo/mobilenet_v2_tsm.py``).

    Its MobileNetV2 uses the flat official block layout (module docstring table) without the
    ``TemporalShift`` wrapper (the shift is in ``InvertedResidualWithShift.forward``, channels
    ``[0, c // 8)`` from the previous frame: our ``shift="online"``), no ``module.`` /
    ``base_model.`` prefix, and its head is ``classifier`` (a Linear, no dropout) where ours is
    ``new_fc``: ``base_model.features.3.conv.0.0.weight`` -> ``features.3.conv.0.weight``,
    ``new_fc.weight`` -> ``classifier.weight``.
    """
    off = official_key(key, model)[len("module."):]
    if off.startswith("new_fc."):
        return "classifier." + off[len("new_fc."):]
    return off.replace(".net.", ".").replace("base_model.", "", 1)


def convert_official_state_dict(official: dict[str, torch.Tensor], model: nn.Module
                                ) -> dict[str, torch.Tensor]:
    """Rename an official state dict to ``model``'s keys.

    Accepts ``main.py`` checkpoints (``module.base_model.*``, ``module.new_fc.*``; the ``module.``
    prefix is optional) and the online demo's (``features.*``, ``classifier.*``: see
    :func:`online_demo_key`). Unmatched official keys keep their name (so that
    :func:`.weights.load_exact` lists them).
    """
    if is_online_demo(official):
        to_ours = {online_demo_key(k, model): k for k in model.state_dict()}
        return {to_ours.get(k.removeprefix("module."), k): v for k, v in official.items()}
    if not any(k.startswith("module.") for k in official):
        official = {"module." + k: v for k, v in official.items()}
    to_ours = {official_key(k, model): k for k in model.state_dict()}
    # official dropout=0 layout puts the head at base_model.fc / classifier (ops/models.py)
    for head in ("module.base_model.fc", "module.base_model.classifier"):
        if head + ".weight" in official and "module.new_fc.weight" not in official:
            to_ours[head + ".weight"], to_ours[head + ".bias"] = "new_fc.weight", "new_fc.bias"
    return {to_ours.get(k, k): v for k, v in official.items()}


def head_classes(official: dict[str, torch.Tensor]) -> int | None:
    """Rows of the classifier of an official state dict (``new_fc``, ``base_model.fc`` /
    ``base_model.classifier`` of the dropout=0 layout, the online demo's ``classifier``), or None."""
    for k in ("new_fc.weight", "base_model.fc.weight", "base_model.classifier.weight", "classifier.weight"):
        for key in (k, "module." + k):
            w = official.get(key)
            if isinstance(w, torch.Tensor) and w.dim() == 2:
                return int(w.shape[0])
    return None


def load_official_checkpoint(path: str | os.PathLike, **overrides: Any) -> nn.Module:
    """Build the model an official TSM checkpoint file describes and load its weights.

    Args:
        path: an official file: ``main.py``'s (``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_
            segment8_e50.pth``, any suffix, or ``ckpt.best.pth.tar`` in its ``store_name``
            directory) or the online demo's ``mobilenetv2_jester_online.pth.tar`` (see
            :func:`parse_official_name`).
        **overrides: :func:`tsm_ds.models.registry.build_model` arguments that replace the parsed
            ones (``arch``, ``num_classes``, ``num_segments``, ``shift``, ``shift_div``,
            ``shift_place``, ``temporal_pool``, ``dropout``). With ``arch`` given, the name need not
            follow the official pattern; ``num_classes``, when neither the name nor ``overrides``
            give it, is the row count of the file's classifier.

    Returns:
        The model (eval mode) whose logits equal the official model's for the same input.

    Raises:
        ValueError: unsupported variant (non-local, Flow, ...), or a name that says nothing and
            no ``arch`` override (the message says what to pass).
        FileNotFoundError / CheckpointError: unreadable file, or keys that do not match (the
            message names the cause, e.g. a temporal shift on one side only, then lists missing,
            unexpected and shape-mismatched keys).
    """
    try:
        opts = dict(parse_official_name(path)["build"])
    except ValueError as e:
        if "not an official" not in str(e) or "arch" not in overrides:
            raise
        opts = {}
    opts.update(overrides)
    opts.pop("pretrained", None)
    raw = read_state_dict(path)
    if opts.get("num_classes") is None:
        opts["num_classes"] = head_classes(raw)
    if opts.get("num_classes") is None:
        raise ValueError(f"{Path(path).name}: unknown dataset and no classifier in the file, pass "
                         "num_classes=")
    model = build_model(**opts)
    sd = convert_official_state_dict(raw, model)
    load_exact(model, sd, path, file_keys=None if is_online_demo(raw) else list(raw))
    return model.eval()
