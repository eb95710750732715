"""Load any checkpoint the tools accept as an inference model (:func:`load_for_inference`).

Checkpoints: the trainer's exported plain state dict (``{"state_dict", "model_config",
"class_names"}``), a DeepSpeed run/checkpoint directory, or an official TSM checkpoint file
(``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth``; class names from a label map,
e.g. ``kinetics400_labels.txt``). Used by ``tsm-ds eval``, ``predict`` and ``export``.
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
        path: the checkpoint path given.
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


def _torch_load(path: Path, *, trusted: bool = False) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as e:  # a corrupt or foreign file: say which and what it is expected to be
        raise ValueError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def _build(config: dict, overrides: dict) -> torch.nn.Module:
    from tsm_ds.models import build_model

    cfg = {**config, **overrides, "pretrained": None}  # weights come from the checkpoint
    return build_model(**cfg)


def _is_official(state: dict) -> bool:
    keys = list(state)
    return any(k.startswith(("module.base_model.", "base_model.")) for k in keys)


def _official_name(path: Path) -> bool:
    """True when the file name follows the official pattern (``TSM_kinetics_RGB_resnet50_...pth``)."""
    import warnings

    from tsm_ds.models import parse_official_name

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parse_official_name(path)
        return True
    except ValueError as e:
        # an official name with an unsupported option (non-local, Flow): let the loader say so
        return "not an official" not in str(e)


def _deepspeed_model_states(path: Path) -> tuple[Path, dict]:
    """Find and read ``mp_rank_00_model_states.pt`` of a DeepSpeed save directory (or its ``latest`` tag)."""
    if (path / "checkpoints").is_dir() and not (path / "latest").is_file():
        path = path / "checkpoints"  # a trainer run directory: <run dir>/checkpoints/latest
    ckdir = path
    if (path / "latest").is_file():
        ckdir = path / (path / "latest").read_text().strip()
    f = ckdir / "mp_rank_00_model_states.pt"
    if not f.is_file():
        cands = sorted(path.glob("*/mp_rank_00_model_states.pt"), key=lambda p: p.stat().st_mtime)
        if not cands:
            raise FileNotFoundError(
                f"{path} is a directory but holds no DeepSpeed checkpoint (no 'latest' file and no "
                "*/mp_rank_00_model_states.pt); pass the run's checkpoint directory or an exported .pt file")
        f = cands[-1]
        ckdir = f.parent
    # our own trainer's file (DeepSpeed pickles its config and client state): trusted
    return ckdir, _torch_load(f, trusted=True)


def load_for_inference(path: str | os.PathLike, *, labels: str | None = None,
                       **overrides: Any) -> LoadedModel:
    """Load any checkpoint the tools accept, as an eval-mode float32 model on CPU.

    Args:
        path: (1) a file saved by the trainer's export, ``{"state_dict", "model_config",
            "class_names"}``; (2) a DeepSpeed save directory (with ``latest``, or a tag directory
            holding ``mp_rank_00_model_states.pt``; ZeRO-3 shards are consolidated with DeepSpeed's
            ``get_fp32_state_dict_from_zero_checkpoint``), whose client state carries
            ``model_config`` and ``class_names``; (3) an official TSM checkpoint (``state_dict``
            with ``module.base_model.*`` keys; the options come from the official file name, or
            from ``overrides`` with arch= and num_classes=), read by
            ``tsm_ds.models.load_official_checkpoint``.
        labels: label-map file; overrides the checkpoint's class names (needed for official files).
        **overrides: ``build_model`` arguments to change, e.g. ``num_segments=16`` (TSM weights do
            not depend on T) or ``shift="online"`` (a bidirectional checkpoint run uni-directionally
            is a different model: only for checkpoints trained online).

    Returns:
        :class:`LoadedModel`.

    Raises:
        FileNotFoundError: no such file/directory, or a directory without a DeepSpeed checkpoint.
        ValueError: unreadable file, unknown layout, missing ``model_config``, state dict keys that
            do not match the rebuilt model, or class names that do not match the outputs.
        tsm_ds.models.weights.CheckpointError: an official file whose keys do not fit its name.
    """
    p = Path(path)
    notes: list[str] = []
    img_size = None
    if p.is_dir():
        ckdir, states = _deepspeed_model_states(p)
        config = states.get("model_config") or (states.get("client_state") or {}).get("model_config")
        names = states.get("class_names") or (states.get("client_state") or {}).get("class_names")
        img_size = states.get("img_size") or (states.get("client_state") or {}).get("img_size")
        if not config:
            raise ValueError(f"DeepSpeed checkpoint {ckdir} has no 'model_config' in its client state; "
                             "use the run's exported best-model file instead")
        state = states.get("module")
        if not state or any(getattr(v, "numel", lambda: 1)() == 0 for v in state.values()):
            # ZeRO-3 keeps the parameters partitioned in the optimizer shards
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            state = get_fp32_state_dict_from_zero_checkpoint(str(ckdir.parent), tag=ckdir.name)
        model = _build(dict(config), overrides)
        _load_state(model, state, ckdir)
        source = "deepspeed"
    elif p.is_file() and _official_name(p):
        from tsm_ds.models import load_official_checkpoint

        model = load_official_checkpoint(str(p), **overrides)
        names, source = None, "official"
    elif p.is_file():
        payload = _torch_load(p)
        if not isinstance(payload, dict) or "state_dict" not in payload:
            raise ValueError(f"{p}: expected a dict with a 'state_dict' key (tsm_ds export or official TSM "
                             f"checkpoint), found {type(payload).__name__} with keys "
                             f"{sorted(payload)[:8] if isinstance(payload, dict) else '-'}")
        names = payload.get("class_names")
        img_size = payload.get("img_size")
        if "model_config" in payload:
            model = _build(dict(payload["model_config"]), overrides)
            _load_state(model, payload["state_dict"], p)
            source = "state_dict"
        elif _is_official(payload["state_dict"]):
            from tsm_ds.models import load_official_checkpoint

            model = load_official_checkpoint(str(p), **overrides)
            source = "official"
        else:
            raise ValueError(f"{p}: a 'state_dict' without 'model_config', and not an official TSM "
                             "checkpoint (keys module.base_model.*): the model cannot be rebuilt")
    else:
        raise FileNotFoundError(f"checkpoint {p} not found")
    config = dict(getattr(model, "config", {}) or {})
    num_classes = int(config.get("num_classes") or _num_outputs(model))
    class_names = _resolve_class_names(names, labels, num_classes, notes)
    model = model.float().eval()
    return LoadedModel(model=model, class_names=class_names, config=config, source=source,
                       path=str(path), notes=notes, img_size=int(img_size) if img_size else None)


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


def _load_state(model: torch.nn.Module, state: dict, where: Path) -> None:
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: state dict does not match the model rebuilt from its model_config: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")


def checkpoint_overrides(args: Any) -> dict:
    """``build_model`` overrides from ``--num-segments``, ``--arch``, ``--num-classes`` (those given)."""
    pairs = (("num_segments", getattr(args, "num_segments", None)), ("arch", getattr(args, "arch", None)),
             ("num_classes", getattr(args, "num_classes", None)))
    return {k: v for k, v in pairs if v is not None}
