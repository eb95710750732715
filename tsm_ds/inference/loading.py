"""Load any checkpoint the tools accept as an inference model (:func:`load_for_inference`).

A thin layer over the engine's reader (:func:`tsm_ds.engine.checkpoint.reader.read_checkpoint`,
which the trainer's ``--tune-from`` uses too): the trainer's exported file (``{"state_dict",
"model_config", "class_names"}``), a DeepSpeed run / checkpoint / tag directory (ZeRO-3 included),
or an official TSM checkpoint file (``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth``;
class names from a label map, e.g. ``kinetics400_labels.txt``). Here: rebuild the model from the
recorded ``model_config`` plus overrides, load the weights exactly, attach class names, eval mode.
Used by ``tsm-ds eval``, ``predict`` and ``export``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, float32, CPU) and what describes it.

    Attributes:
        model: the recognizer, float32 (N, T, 3, H, W) -> logits (N, K).
        class_names: K names (from the checkpoint, the ``labels`` file, or ``class_0..``).
        config: ``build_model`` keyword arguments (``model.config``).
        source: ``"state_dict"`` (our exported file), ``"deepspeed"`` (run directory) or ``"official"``.
        path: the file actually read (in a run directory: the model-states file of the tag loaded).
        notes: warnings worth printing (e.g. generic class names).
        img_size: crop side (pixels) the model was trained at, when the checkpoint records it
            (our exports and DeepSpeed run directories do; official files do not: None).
    """

    model: torch.nn.Module
    class_names: list[str]
    config: dict
    source: str
    path: str
    notes: list[str] = field(default_factory=list)
    img_size: int | None = None


def _resolve_class_names(names: Sequence[str] | None, labels: str | None, num_classes: int,
                         notes: list[str]) -> list[str]:
    if labels is not None:
        from tsm_ds.data.records import read_label_map

        if not Path(labels).is_file():
            raise FileNotFoundError(f"label map {labels} not found")
        names = read_label_map(labels)
        if len(names) != num_classes:
            raise ValueError(f"label map {labels} has {len(names)} names but the model has {num_classes} "
                             "classes; pass the label map the model was trained with")
        return list(names)
    if names:
        if len(names) != num_classes:
            raise ValueError(f"checkpoint lists {len(names)} class names for {num_classes} model outputs")
        return [str(n) for n in names]
    notes.append(f"no class names in the checkpoint and no --labels file: using class_0..class_{num_classes - 1}")
    return [f"class_{i}" for i in range(num_classes)]


def _build(config: dict, overrides: dict) -> torch.nn.Module:
    from tsm_ds.models import build_model
    from tsm_ds.models.registry import check_checkpoint_config

    cfg = {**config, **overrides, "pretrained": None}  # weights come from the checkpoint
    check_checkpoint_config(cfg)  # ValueError for an old-layout i3d_resnet50 checkpoint
    return build_model(**cfg)


def load_for_inference(path: str | os.PathLike, *, labels: str | None = None, trust: bool = False,
                       **overrides: Any) -> LoadedModel:
    """Load any checkpoint the tools accept, as an eval-mode float32 model on CPU.

    Args:
        path: every kind :func:`tsm_ds.engine.checkpoint.reader.read_checkpoint` reads: (1) a file
            saved by the trainer's export, ``{"state_dict", "model_config", "class_names"}``
            (``weights_only=True``); (2) a DeepSpeed directory: a run directory, its
            ``checkpoints/`` (the tag ``latest`` names), a tag directory (ZeRO-3 shards are
            consolidated with DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``), whose client
            state carries ``model_config`` and ``class_names`` (weights-only, with the DeepSpeed
            classes of :data:`tsm_ds.engine.checkpoint.safe_load.SAFE_GLOBALS`); (3) an official TSM checkpoint
            (options from the official file name, or from ``overrides`` with arch= and num_classes=
            for a renamed file; ``weights_only=True``).
        labels: label-map file; overrides the checkpoint's class names (needed for official files).
        trust: load a file that weights-only loading refuses with full unpickling, after a warning
            (``--trust-checkpoint``; only for checkpoints whose origin you know).
        **overrides: ``build_model`` arguments to change, e.g. ``num_segments=16`` (TSM weights do
            not depend on T) or ``shift="online"`` (a bidirectional checkpoint run uni-directionally
            is a different model: only for checkpoints trained online).

    Returns:
        :class:`LoadedModel`.

    Raises:
        FileNotFoundError: no such file/directory, or a directory without a DeepSpeed checkpoint.
        tsm_ds.engine.checkpoint.safe_load.UntrustedCheckpointError: (a ValueError) without ``trust``, a file
            that asks to unpickle a global outside the allowlist (could run code); names the file,
            the global and ``--trust-checkpoint``.
        ValueError: not a checkpoint (the message names the file), no ``model_config`` to rebuild
            the model from, an ``i3d_resnet50`` checkpoint of the old (pre-issue-18) layout
            (:func:`tsm_ds.models.registry.check_checkpoint_config`), or class names that do not
            match the outputs.
        tsm_ds.models.weights.CheckpointError: the weights do not fit the rebuilt model (official
            file vs. its name, or overrides such as ``num_classes`` that change shapes); the message
            lists missing, unexpected and mismatched keys, and names a wrapper module's prefix left
            in the keys (``model.``, ``net.``) as the cause when that explains them
            (``module.`` and ``_orig_mod.``, also inside keys, are stripped by the reader).
    """
    from tsm_ds.engine.checkpoint.reader import read_checkpoint, wrapper_mismatch_cause
    from tsm_ds.models.weights import CheckpointError, load_exact

    contents = read_checkpoint(path, official_overrides=overrides, trust=trust)
    if not contents.model_config:
        raise ValueError(
            f"{contents.path}: no 'model_config' recorded with the weights: the model cannot be rebuilt; "
            + ("use the run's exported best_model.pt instead" if contents.source == "deepspeed" else
               "save it with tsm_ds.engine.checkpoint.manager.save_weights_export, or, for an official TSM checkpoint "
               "that was renamed, pass arch= and num_classes= (--arch, --num-classes)"))
    model = _build(contents.model_config, overrides)
    try:
        load_exact(model, contents.state_dict, contents.path)
    except CheckpointError as e:   # a wrapper's name left in the keys: say so, not "another architecture"
        cause = wrapper_mismatch_cause(contents.state_dict, model.state_dict())
        if cause is None or "cause:" in str(e):   # load_exact named an architecture cause already
            raise
        raise CheckpointError(f"{e}\n  cause: {cause}") from None
    config = dict(getattr(model, "config", {}) or {})
    num_classes = int(config.get("num_classes") or _num_outputs(model))
    notes: list[str] = []
    class_names = _resolve_class_names(contents.class_names, labels, num_classes, notes)
    model = model.float().eval()
    return LoadedModel(model=model, class_names=class_names, config=config, source=contents.source,
                       path=str(contents.path or path), notes=notes, img_size=contents.img_size)


def resolve_img_size(requested: int | None, loaded: LoadedModel) -> int:
    """The crop side to run a model at: ``--img-size`` when given, else the size the checkpoint was
    trained at (recorded by the trainer), else 224 (the official test size)."""
    if requested:
        return int(requested)
    return int(loaded.img_size or 224)


def _num_outputs(model: torch.nn.Module) -> int:
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        raise ValueError("cannot tell the number of classes: model.config has no num_classes and no Linear layer")
    return linears[-1].out_features


def checkpoint_overrides(values: dict) -> dict:
    """``build_model`` overrides from the model fields a command was given (those not None).

    ``values``: ``{"arch", "num_classes", "num_segments", "shift", "shift_div", "shift_place",
    "temporal_pool", "dropout"}`` (the ``model`` section's fields that eval / predict / export take,
    :data:`tsm_ds.config.commands.CHECKPOINT_MODEL_FIELDS`; missing keys count as not given).
    ``shift="none"`` becomes ``shift=None`` (a TSN). Example: ``{"shift": "none", "num_classes":
    174}`` -> ``{"shift": None, "num_classes": 174}``.
    """
    names = ("arch", "num_classes", "num_segments", "shift", "shift_div", "shift_place", "temporal_pool",
             "dropout")
    out = {k: values.get(k) for k in names}
    out = {k: v for k, v in out.items() if v is not None}
    if out.get("shift") == "none":
        out["shift"] = None
    return out
