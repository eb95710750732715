"""One reader for every checkpoint tsm_ds accepts: :func:`read_checkpoint` -> :class:`CheckpointContents`.

Used by the trainer's ``--tune-from`` (:func:`tsm_ds.engine.checkpoint.manager.load_finetune_weights`) and
by the inference tools (:func:`tsm_ds.inference.loading.load_for_inference`: eval, predict,
export), so that both accept the same paths and read them the same way. Kinds (``source``):

* ``"state_dict"``: our export ``RUN/best_model.pt`` / ``RUN/last_model.pt``
  (:func:`tsm_ds.engine.checkpoint.manager.save_weights_export`: ``{"state_dict", "model_config",
  "class_names", "img_size", ...}``), or a plain state dict file (bare, or under ``"state_dict"``; then
  ``model_config`` is None). Read with ``torch.load(weights_only=True)``.
* ``"deepspeed"``: a trainer run directory ``RUN/`` (its ``checkpoints/``), a DeepSpeed save
  directory with ``latest`` (``RUN/checkpoints``), a tag directory (``RUN/checkpoints/step00000120``)
  or the model-states file in it. The model-states file is ``mp_rank_00_model_states.pt`` (no ZeRO,
  ZeRO-1/2: it holds the whole module) or ``zero_pp_rank_0_mp_rank_00_model_states.pt`` (ZeRO-3: the
  parameters are partitioned; they are consolidated from every rank's ``*_optim_states.pt`` by
  DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``). DeepSpeed merges the trainer's client
  state (``model_config``, ``class_names``, ``img_size``) into that file. The ZeRO-3 shards are read
  by DeepSpeed inside :func:`tsm_ds.engine.checkpoint.safe_load.weights_only_loading`, which makes its
  ``torch.load`` calls weights-only too.
* ``"official"``: an official TSM checkpoint (mit-han-lab/temporal-shift-module, ``main.py``:
  ``{"epoch", "arch", "state_dict", "optimizer", "best_prec1"}`` with ``module.base_model.*`` keys;
  or the online demo's ``mobilenetv2_jester_online.pth.tar``, a plain state dict with ``features.*``
  / ``classifier.*`` keys). The model options come from the file name (any suffix, or the
  ``store_name`` directory of ``ckpt.best.pth.tar``:
  :func:`tsm_ds.models.official.parse_official_name`) and the ``official_overrides``.
  Read with ``weights_only=True`` and no allowlist (:func:`tsm_ds.models.weights.read_state_dict`),
  keys converted to ours by :func:`tsm_ds.models.official.load_official_checkpoint`, which also checks that every key
  fits the model the name describes.

Trust (:mod:`tsm_ds.engine.checkpoint.safe_load`): every file is loaded with ``torch.load(weights_only=True)``
and the allowlist :data:`~tsm_ds.engine.checkpoint.safe_load.SAFE_GLOBALS` (the DeepSpeed and numpy classes
our own checkpoints hold), so loading never runs code from the file. A file that asks for anything
else is refused with :class:`~tsm_ds.engine.checkpoint.safe_load.UntrustedCheckpointError` (file, global,
``--trust-checkpoint``); ``trust=True`` loads it with full unpickling after a warning.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from tsm_ds.engine.checkpoint.safe_load import UntrustedCheckpointError, check_files, load_file, weights_only_loading

#: DeepSpeed's model-states file of a tag directory: without ZeRO / ZeRO-1/2, and ZeRO-3
MODEL_STATES = "mp_rank_00_model_states.pt"
ZERO3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"
#: wrapper prefixes stripped from state-dict keys (DataParallel / DeepSpeed, torch.compile)
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
#: written last into a finished tag by :meth:`tsm_ds.engine.checkpoint.manager.CheckpointManager.save`
COMPLETE = "complete.json"
_KINDS = ("a tsm_ds export such as RUN/best_model.pt, a run directory, its checkpoints/ directory "
          "or a tag directory, or an official TSM .pth file")


@dataclass
class CheckpointContents:
    """What a checkpoint holds, in plain form (see :func:`read_checkpoint`).

    Attributes:
        state_dict: parameter/buffer name -> CPU tensor; floating tensors float32 (weights of
            fp16/bf16 engines are upcast, as :func:`tsm_ds.engine.checkpoint.manager.save_weights_export`
            does); ``module.`` / ``_orig_mod.`` wrapper prefixes (also nested) stripped, so the keys
            are those of the bare model (official files: converted to our names).
        model_config: :func:`tsm_ds.models.build_model` keyword arguments, or None when the file
            does not record them (a plain state dict).
        class_names: the K class names recorded with the weights, or None (official files, plain
            state dicts, exports written without them).
        img_size: crop side in pixels the model was trained at, or None when not recorded.
        source: ``"state_dict"`` (our export / a state dict file), ``"deepspeed"`` or ``"official"``.
        path: the file actually read (for a DeepSpeed directory: the tag's model-states file; with
            ZeRO-3 the parameters come from the ``*_optim_states.pt`` shards next to it).
    """

    state_dict: dict[str, torch.Tensor]
    model_config: dict | None
    class_names: list[str] | None
    img_size: int | None
    source: str
    path: Path


def read_checkpoint(path: str | os.PathLike, *, official_overrides: Mapping[str, Any] | None = None,
                    trust: bool = False) -> CheckpointContents:
    """Read any checkpoint tsm_ds accepts (the kinds are in the module docstring).

    Every ``torch.load`` (ours and DeepSpeed's, ZeRO-3 shards included) runs with
    ``weights_only=True`` and the allowlist of :mod:`tsm_ds.engine.checkpoint.safe_load`: reading never runs
    code from the file.

    Args:
        path: a file (our export, a state dict, an official ``.pth``, a DeepSpeed model-states
            file) or a directory (run dir, DeepSpeed save dir with ``latest``, tag dir). In a
            directory without ``latest`` the newest complete tag (``complete.json``; else the newest
            model-states file) is read.
        official_overrides: :func:`tsm_ds.models.build_model` arguments for an official file
            (``arch``, ``num_classes``, ``num_segments``, ``shift``, ``shift_div``, ``shift_place``,
            ``temporal_pool``, ``dropout``), replacing those parsed from its name (``num_classes=``
            for an unknown dataset). With ``arch`` given, a file without ``model_config`` holding
            a ``state_dict`` (``main.py``'s ``ckpt.best.pth.tar`` renamed) or the online demo's
            ``features.*`` / ``classifier.*`` keys is read as an official checkpoint whose name no
            longer says its options (``num_classes`` defaults to its classifier's rows). Other
            kinds ignore them (their ``model_config`` is returned as recorded).
        trust: a file that asks to unpickle anything outside the allowlist is loaded with full
            unpickling (``weights_only=False``) after a warning, instead of refused
            (``--trust-checkpoint``; only for checkpoints whose origin you know). Official files are
            always read weights-only.

    Returns:
        :class:`CheckpointContents`.

    Raises:
        FileNotFoundError: no such path; a directory without a DeepSpeed checkpoint; ``latest``
            naming a tag that is gone.
        tsm_ds.engine.checkpoint.safe_load.UntrustedCheckpointError: (a ValueError) without ``trust``, a file
            that asks to unpickle a global outside the allowlist (it could run code): the message
            names the file, the global and ``--trust-checkpoint``.
        ValueError: a file that is not a checkpoint (not a PyTorch file, not a dict, no state
            dict in it, a DeepSpeed file without the model's state dict); an official name with an
            unsupported variant; ZeRO-3 shards DeepSpeed cannot consolidate. Every message names
            the file.
        tsm_ds.models.weights.CheckpointError: an official file that torch cannot read, or whose
            keys do not fit the model its name describes (the message lists the keys).
    """
    p = Path(path)
    if p.is_dir():
        return _read_deepspeed(_model_states_file(p), trust=trust)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {p} not found (expected {_KINDS})")
    if p.name in (MODEL_STATES, ZERO3_MODEL_STATES):
        return _read_deepspeed(p, trust=trust)
    overrides = dict(official_overrides or {})
    if _has_official_name(p):
        return _read_official(p, overrides)
    payload = _load_any(p, trust=trust)
    if not isinstance(payload, dict):
        raise ValueError(f"{p} is not a checkpoint: it holds a {type(payload).__name__}, expected a dict "
                         "(a tsm_ds export {'state_dict', 'model_config', 'class_names'}, a state dict, or an "
                         "official TSM checkpoint {'state_dict', ...})")
    if "model_config" not in payload and "arch" in overrides and _is_online_demo(payload):
        return _read_official(p, overrides)   # the online demo's plain state dict, renamed
    if "model_config" not in payload and isinstance(payload.get("state_dict"), dict) and (
            {"arch", "best_prec1"} & payload.keys() or "arch" in overrides):
        return _read_official(p, overrides)   # official main.py's dict, renamed
    state = payload["state_dict"] if "state_dict" in payload else payload
    config = payload.get("model_config")
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"{p}: 'model_config' is a {type(config).__name__}, expected a dict of build_model "
                         "arguments")
    return CheckpointContents(state_dict=_plain(state, p), model_config=dict(config) if config else None,
                              class_names=_names(payload.get("class_names"), p),
                              img_size=_int_or_none(payload.get("img_size")), source="state_dict", path=p)


def strip_wrapper_prefixes(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the wrapper prefixes (:data:`WRAPPER_PREFIXES`: ``module.`` of DataParallel /
    DeepSpeed, ``_orig_mod.`` of ``torch.compile``) removed, also nested (``module._orig_mod.``).

    A leading prefix is removed only when every key has it (a wrapper prefixes all keys alike).
    ``_orig_mod.`` is also removed where it stands inside a key (``base_model._orig_mod.conv1.weight``:
    a submodule compiled with ``torch.compile``): no real module is named so.
    """
    state = {re.sub(r"\._orig_mod(?=\.)", "", k): v for k, v in state.items()}
    while state:
        pre = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if pre is None:
            break
        state = {k[len(pre):]: v for k, v in state.items()}
    return state


#: components that name a real part of a TSM model, not a wrapper: ``net`` is the official shift
#: wrapper of the ``block`` placement (``layer1.0.net.conv1``), a different architecture
_ARCH_COMPONENTS = frozenset({"net"})


def wrapper_mismatch_cause(file_keys, model_keys) -> str | None:
    """Why the keys of a checkpoint do not match a model's when a wrapper is to blame, in words.

    Looks for one dotted component (``model.``, ``module.``, ``backbone.``, ...) that the file's
    unmatched keys carry and the model's lack (or the other way round), at the start or inside the
    key: removing it must turn at least half of the unmatched keys into matches. ``net`` is not
    considered (the ``block`` shift placement's own module, see :data:`_ARCH_COMPONENTS`).

    Args:
        file_keys, model_keys: the state-dict keys of the file (after
            :func:`strip_wrapper_prefixes`) and of the model.

    Returns:
        One sentence naming the component, an example key and the fix; None when no such
        component explains the mismatch (wrong architecture, another head size...).
    """
    fk, mk = set(file_keys), set(model_keys)
    for extra_in, other, side in ((fk - mk, mk - fk, "file"), (mk - fk, fk - mk, "model")):
        if not extra_in or not other:
            continue
        hits: dict[tuple[int, str], list[str]] = {}
        for k in extra_in:
            parts = k.split(".")
            for i in range(len(parts) - 1):
                if parts[i] in _ARCH_COMPONENTS:
                    continue
                if ".".join(parts[:i] + parts[i + 1:]) in other:
                    hits.setdefault((i, parts[i]), []).append(k)
        if not hits:
            continue
        (pos, comp), keys = max(hits.items(), key=lambda kv: len(kv[1]))
        if 2 * len(keys) < len(other):
            continue
        where = "start with" if pos == 0 else "carry inside"
        fix = (f"load with the '{comp}.' component removed from every key (tsm_ds strips 'module.' and "
               "'_orig_mod.' itself; other wrappers: save model.state_dict() of the bare model)"
               if side == "file" else f"the model has a '{comp}' wrapper the checkpoint was saved without: load "
               "into the bare model")
        return (f"the {side}'s keys {where} an extra '{comp}.' ({len(keys)} keys, e.g. {sorted(keys)[0]!r}): a "
                f"wrapper module's name, not a different architecture; {fix}")
    return None


# ------------------------------------------------------------------------------ plain values


def _plain(state: Any, where: Path) -> dict[str, torch.Tensor]:
    """Checked state dict: CPU tensors, floating ones float32, wrapper prefixes stripped."""
    if not isinstance(state, Mapping) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        what = (f"a dict of {len(state)} entries, not all name -> tensor" if isinstance(state, Mapping) and state
                else "an empty dict" if isinstance(state, Mapping) else f"a {type(state).__name__}")
        raise ValueError(f"{where} holds no state dict (found {what}); expected {_KINDS}")
    return {k: (v.detach().cpu().float() if v.is_floating_point() else v.detach().cpu())
            for k, v in strip_wrapper_prefixes(state).items()}


def _names(names: Any, where: Path) -> list[str] | None:
    if names is None:
        return None
    if not isinstance(names, (list, tuple)):
        raise ValueError(f"{where}: 'class_names' is a {type(names).__name__}, expected a list of names")
    return [str(n) for n in names]


def _int_or_none(value: Any) -> int | None:
    return int(value) if value else None


def _torch_error(e: Exception) -> str:
    """The informative part of a torch.load error (torch's own messages run over several lines)."""
    text = str(e)
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    line = found.group(1) if found else (text.strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {line[:200]}"


def _load_any(path: Path, *, trust: bool) -> Any:
    """A file that is not DeepSpeed's, loaded weights-only (:func:`tsm_ds.engine.checkpoint.safe_load.load_file`).

    Raises UntrustedCheckpointError (a global outside the allowlist, without ``trust``), ValueError
    naming the file for anything else torch cannot read."""
    try:
        return load_file(path, trust=trust)
    except UntrustedCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - torch raises many types for foreign / damaged files
        raise ValueError(f"{path} is not a PyTorch checkpoint or is damaged ({_torch_error(e)}); "
                         f"expected {_KINDS}") from e


# ------------------------------------------------------------------------------ official


def _has_official_name(path: Path) -> bool:
    """True when the file name follows the official pattern (``TSM_kinetics_RGB_resnet50_...pth``),
    also for official variants tsm_ds does not support (non-local, Flow): their reader says why."""
    from tsm_ds.models.official import parse_official_name

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parse_official_name(path)
        return True
    except ValueError as e:
        return "not an official" not in str(e)


def _is_online_demo(payload: dict) -> bool:
    """True for a plain state dict with the online demo's keys (``features.*``, ``classifier.*``)."""
    from tsm_ds.models.official import is_online_demo

    return all(isinstance(k, str) for k in payload) and is_online_demo(payload)


def _read_official(path: Path, overrides: dict) -> CheckpointContents:
    from tsm_ds.models.official import load_official_checkpoint

    model = load_official_checkpoint(path, **overrides)   # weights_only=True; every key checked
    return CheckpointContents(state_dict=_plain(model.state_dict(), path), model_config=dict(model.config),
                              class_names=None, img_size=None, source="official", path=path)


# ------------------------------------------------------------------------------ DeepSpeed


def _states_in(tag_dir: Path) -> Path | None:
    """The model-states file of a DeepSpeed tag directory (ZeRO-0/1/2 or ZeRO-3 name), or None."""
    for name in (MODEL_STATES, ZERO3_MODEL_STATES):
        if (tag_dir / name).is_file():
            return tag_dir / name
    return None


def _model_states_file(d: Path) -> Path:
    """The model-states file that directory ``d`` (tag, save dir with ``latest``, run dir) stands for."""
    own = _states_in(d)
    if own is not None:
        return own
    root = d / "checkpoints" if not (d / "latest").is_file() and (d / "checkpoints").is_dir() else d
    latest = root / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        f = _states_in(root / tag) if tag else None
        if f is None:
            raise FileNotFoundError(f"{latest} names checkpoint tag {tag!r}, but {root / tag} holds no {MODEL_STATES} "
                                    f"(nor ZeRO-3's {ZERO3_MODEL_STATES}): pass one of the tag directories in {root}")
        return f
    tags = [t for t in root.iterdir() if t.is_dir() and not t.name.endswith(".damaged") and _states_in(t) is not None]
    if not tags:
        files = sorted(x.name for x in d.glob("*.pt"))
        hint = (f"; it holds {', '.join(files)}: pass one of those files" if files
                else f"; expected {_KINDS}")
        raise FileNotFoundError(f"{d} is a directory but holds no DeepSpeed checkpoint (no 'latest' file and no "
                                f"*/{MODEL_STATES}){hint}")
    complete = [t for t in tags if (t / COMPLETE).is_file()]
    pick = (max(complete, key=lambda t: t.name) if complete
            else max(tags, key=lambda t: _states_in(t).stat().st_mtime))
    return _states_in(pick)


def _load_deepspeed_states(f: Path, *, trust: bool) -> dict:
    """Read DeepSpeed's model-states file weights-only (:func:`tsm_ds.engine.checkpoint.safe_load.load_file`);
    UntrustedCheckpointError as it comes, ValueError naming the file for anything else."""
    try:
        states = load_file(f, trust=trust)
    except UntrustedCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - torch raises many types for damaged files
        raise ValueError(f"cannot read DeepSpeed checkpoint file {f} ({_torch_error(e)}); it is truncated "
                         "or damaged: pass another tag directory or the run's exported best_model.pt") from e
    if not isinstance(states, dict) or "module" not in states:
        raise ValueError(f"{f} is not a DeepSpeed model-states file (expected a dict with a 'module' key, found "
                         f"{sorted(states)[:8] if isinstance(states, dict) else type(states).__name__})")
    return states


def _zero3_state_dict(tag_dir: Path, *, trust: bool) -> dict:
    """Consolidated fp32 state dict of a ZeRO-3 tag (DeepSpeed's ``zero_to_fp32``), every file it
    reads loaded weights-only (checked first, so that a refusal names the file)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    check_files(sorted(tag_dir.glob("*_model_states.pt")) + sorted(tag_dir.glob("*_optim_states.pt")), trust=trust)
    try:
        # it prints its progress (and tqdm bars on stderr): not for our users
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                weights_only_loading(tag_dir, trust=trust):
            return get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    except UntrustedCheckpointError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, IndexError) as e:
        raise ValueError(f"ZeRO-3 checkpoint {tag_dir}: DeepSpeed could not consolidate the partitioned parameters "
                         f"({type(e).__name__}: {e}); every rank's *_optim_states.pt must be in that directory") from e


def _read_deepspeed(f: Path, *, trust: bool = False) -> CheckpointContents:
    states = _load_deepspeed_states(f, trust=trust)
    client = states.get("client_state") if isinstance(states.get("client_state"), dict) else {}

    def recorded(key: str) -> Any:   # DeepSpeed merges the client state into the top level
        return states[key] if states.get(key) is not None else client.get(key)

    module = states.get("module")
    # ZeRO-3 (its own file name) saves the module with empty parameter placeholders: the values are in
    # the shards. Any other file must hold the state dict itself: never sent to the ZeRO-3 reader.
    if f.name == ZERO3_MODEL_STATES:
        state = _zero3_state_dict(f.parent, trust=trust)
    elif isinstance(module, Mapping) and module:
        state = module
    else:
        what = "an empty dict" if isinstance(module, Mapping) else f"a {type(module).__name__}"
        raise ValueError(f"{f} is not a DeepSpeed model-states file of a whole model: its 'module' entry is {what}, "
                         "expected the model's state dict; pass another tag directory or the run's exported "
                         "best_model.pt")
    config = recorded("model_config")
    return CheckpointContents(state_dict=_plain(state, f), model_config=dict(config) if config else None,
                              class_names=_names(recorded("class_names"), f),
                              img_size=_int_or_none(recorded("img_size")), source="deepspeed", path=f)
