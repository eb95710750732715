"""Loading checkpoint files without running code from them (issue 26), and ``--trust-checkpoint``.

A ``torch.save`` file is a pickle: unpickled in full (``torch.load(weights_only=False)``) it can call
any function it names (``os.system``...). tsm_ds reads every checkpoint file with
``weights_only=True``, which builds only tensors, numbers, strings, containers and the globals
allowlisted here (:data:`SAFE_GLOBALS`, each one a class DeepSpeed or numpy pickles into the files
tsm_ds's own recipes write; allowlisted classes are rebuilt from their pickled attributes, none of
their code runs). That covers:

* our own reads (:func:`load_file`): exports, state dicts, DeepSpeed model-states files (eval,
  predict, export, ``--tune-from``) and the per-rank ``rank*.pt`` files of ``--resume``;
* DeepSpeed's reads (:func:`weights_only_loading`): ``engine.load_checkpoint`` (``--resume``) and
  ``zero_to_fp32`` (ZeRO-3 consolidation) call ``torch.load(weights_only=False)`` themselves
  (deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py, deepspeed/utils/zero_to_fp32.py);
  inside this context torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` turns those into weights-only loads
  under the same allowlist. :func:`check_files` first loads every file of the tag the same way, so
  that a refusal names the file (DeepSpeed's own error would not).

A file that needs any other global is refused with :class:`UntrustedCheckpointError` (the file, the
global, ``--trust-checkpoint``). With ``trust=True`` (``--trust-checkpoint``) such a file is
unpickled in full after a warning on the ``tsm_ds.checkpoint`` logger.

Finding the globals: save a checkpoint with each recipe and run
``torch.serialization.get_unsafe_globals_in_checkpoint(path)`` on its files, then load them with
``weights_only=True`` (classes built by ``REDUCE``, such as numpy's dtype classes, show only there);
``tests/engine/test_checkpoint_trust.py`` does both for every CPU recipe.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import pickle
import re
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

log = logging.getLogger("tsm_ds.checkpoint")

_NUMPY_RNG = ("rank*.pt, every recipe: this rank's numpy RNG state, np.random.get_state(), holds a uint32 "
              "ndarray (tsm_ds.engine.checkpoint.manager.rng_state)")

#: Globals allowed in ``torch.load(weights_only=True)`` besides torch's own set, with the files /
#: recipes that pickle them. Found by saving a checkpoint with every ``ds_configs/cpu_*.json``
#: recipe and a ZeRO-3 engine (tests/engine/test_checkpoint_trust.py) and, for fp16 (GPU only),
#: by reading DeepSpeed 0.19.8's save path. The recipes' model-states files
#: (``mp_rank_00_model_states.pt``: cpu_fp32, cpu_bf16, cpu_bf16_autocast, cpu_comm_bf16,
#: cpu_fp32_onebit, cpu_fp32_warmup_cosine, cpu_sgd_cosine, cpu_lamb, cpu_lars, cpu_demo_adamw,
#: cpu_zero1; ZeRO-3's ``zero_pp_rank_0_mp_rank_00_model_states.pt``) need none of them: DeepSpeed
#: stores its config as a dict and its lr schedulers / fp16 optimizer state as numbers
#: (runtime/engine.py ``_common_checkpoint_state``; runtime/fp16/fused_optimizer.py and
#: unfused_optimizer.py ``state_dict``). The ZeRO optimizer-states files do.
SAFE_GLOBALS: dict[str, str] = {
    "deepspeed.runtime.zero.config.ZeroStageEnum":
        "ZeRO optimizer-states files (*_optim_states.pt): cpu_zero1 (stage 1) and ZeRO-3 shards, "
        "optimizer_state_dict['zero_stage'] (runtime/zero/stage_1_and_2.py, stage3.py state_dict)",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler":
        "ZeRO optimizer-states files of fp32 / bf16 runs: cpu_zero1 and ZeRO-3 shards, "
        "optimizer_state_dict['loss_scaler'] (a static scaler of 1)",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler":
        "fp16 (GPU) with ZeRO 1-3: optimizer_state_dict['loss_scaler'] (stage_1_and_2.py / stage3.py "
        "state_dict()[LOSS_SCALER]); the shipped fp16 recipes (gpu_fp16*, ZeRO 0) store only numbers "
        "(FP16_Optimizer.state_dict: cur_scale, scale_window ...)",
    "deepspeed.utils.tensor_fragment.fragment_address":
        "ZeRO-1/2 optimizer-states files: cpu_zero1, optimizer_state_dict['param_slice_mappings']",
    "numpy._core.multiarray._reconstruct": _NUMPY_RNG,
    "numpy.ndarray": _NUMPY_RNG,
    "numpy.dtype": _NUMPY_RNG,
    "numpy.dtypes.UInt32DType": _NUMPY_RNG + ": the dtype of its MT19937 key",
}

#: torch reads these for every ``torch.load`` call (serialization.py ``load``)
_FORCE, _FORCE_NO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class UntrustedCheckpointError(ValueError):
    """A checkpoint file asks to unpickle a global outside :data:`SAFE_GLOBALS` (it could run code).

    Attributes:
        path: the file (or, when DeepSpeed read it, the tag directory).
        global_name: what it asked for, e.g. ``"posix.system"``.
    """

    def __init__(self, path: str | os.PathLike, global_name: str):
        self.path, self.global_name = Path(path), global_name
        super().__init__(
            f"{self.path} asks to unpickle {global_name}, which tsm_ds does not load from a checkpoint: "
            "unpickling it could run code stored in the file (checkpoints are read with torch.load "
            "weights_only=True, which builds tensors, numbers, strings, containers and the few DeepSpeed "
            "and numpy classes tsm_ds's own checkpoints hold). If you know where this checkpoint came from "
            "and trust it, pass "
            "--trust-checkpoint to load it with full unpickling")


def safe_globals(*, import_missing: bool = True) -> list:
    """The objects of :data:`SAFE_GLOBALS` that exist here (a DeepSpeed or numpy without one of
    them cannot have written it), for ``torch.serialization.safe_globals``.

    Args:
        import_missing: also entries whose top-level package (``deepspeed``) is not imported yet;
            False keeps reading an export from importing DeepSpeed (:func:`load_file` retries with
            every entry when a file asks for one of them).
    """
    out = []
    for name in SAFE_GLOBALS:
        if not import_missing and name.split(".")[0] not in sys.modules:
            continue
        obj = _resolve(name)
        if obj is not None:
            out.append(obj)
    return out


@functools.lru_cache(maxsize=None)
def _resolve(name: str) -> Any:
    """The object a dotted name stands for (the longest importable module, then attributes); None
    when it does not exist here."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def refused_global(error: BaseException) -> str | None:
    """The global a weights-only ``torch.load`` refused, from its error message; None when the
    error is not a weights-only refusal (a damaged file, a wrong format)."""
    text = str(error)
    for pattern in (r"GLOBAL (\S+) was not an allowed global", r"unsupported GLOBAL (\S+) whose module",
                    r"allowlisted via `add_safe_globals`,? but got <class '([^']+)'>",
                    r"reduce for unrecognized function (.+?)(?: which belongs|\n|$)"):
        found = re.search(pattern, text)
        if found:
            return found.group(1).strip()
    return None


def load_file(path: str | os.PathLike, *, trust: bool = False, mmap: bool = False) -> Any:
    """``torch.load`` one checkpoint file onto the CPU, weights-only with :data:`SAFE_GLOBALS`.

    Args:
        path: a ``torch.save`` file.
        trust: when weights-only loading refuses the file, warn (naming the file and the global) and
            load it with full unpickling (``--trust-checkpoint``).
        mmap: map the storages instead of reading them (zip-format files only; for checks).

    Returns:
        What the file holds.

    Raises:
        UntrustedCheckpointError: the file asks for a global outside the allowlist (without ``trust``).
        Exception: what ``torch.load`` raises for a missing, damaged or foreign file (callers name it).
    """
    try:
        try:
            return _load_weights_only(path, safe_globals(import_missing=False), mmap)
        except pickle.UnpicklingError as e:
            if refused_global(e) not in SAFE_GLOBALS:
                raise
            return _load_weights_only(path, safe_globals(), mmap)   # it needs DeepSpeed's classes: import them
    except pickle.UnpicklingError as e:
        name = refused_global(e)
        if name is None:
            raise
        if not trust:
            raise UntrustedCheckpointError(path, name) from None
        log.warning("--trust-checkpoint: %s asks to unpickle %s; loading it with full unpickling "
                    "(torch.load weights_only=False), which runs whatever code the file holds", path, name)
        return torch.load(path, map_location="cpu", weights_only=False)


def _load_weights_only(path: str | os.PathLike, allow: list, mmap: bool) -> Any:
    with torch.serialization.safe_globals(allow):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def check_files(paths: Iterable[str | os.PathLike], *, trust: bool = False) -> list[tuple[Path, str]]:
    """Load each file weights-only (storages mapped, not read) to find one that asks for a global
    outside :data:`SAFE_GLOBALS`, before DeepSpeed reads them.

    Files that fail for another reason (damaged, not a torch file) are left to the real load,
    which reports them.

    Returns:
        ``[(file, global)]`` refused (only with ``trust``: each one also logged as a warning).

    Raises:
        UntrustedCheckpointError: the first such file, without ``trust``.
    """
    refused = []
    for p in paths:
        p = Path(p)
        try:
            load_file(p, mmap=zipfile.is_zipfile(p))
        except UntrustedCheckpointError as e:
            if not trust:
                raise
            log.warning("--trust-checkpoint: %s asks to unpickle %s; it will be loaded with full unpickling "
                        "(torch.load weights_only=False), which runs whatever code the file holds", p, e.global_name)
            refused.append((p, e.global_name))
        except Exception:  # noqa: BLE001 - damaged files are the real load's to report
            continue
    return refused


@contextlib.contextmanager
def weights_only_loading(where: str | os.PathLike, *, trust: bool = False) -> Iterator[None]:
    """Make every ``torch.load`` inside the block weights-only under :data:`SAFE_GLOBALS`, also the
    ones that pass ``weights_only=False`` (DeepSpeed's): torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``
    is set for the block (and ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` lifted), then restored. A
    process-wide setting: meant for the loading of one checkpoint on the main thread.

    Args:
        where: the checkpoint (tag directory) named when a load inside is refused.
        trust: do nothing (``--trust-checkpoint``: DeepSpeed unpickles in full, as it does by itself).

    Raises:
        UntrustedCheckpointError: a load inside the block was refused (naming ``where``).
    """
    if trust:
        yield
        return
    saved = {k: os.environ.get(k) for k in (_FORCE, _FORCE_NO)}
    os.environ[_FORCE] = "1"
    os.environ.pop(_FORCE_NO, None)
    try:
        with torch.serialization.safe_globals(safe_globals()):
            yield
    except pickle.UnpicklingError as e:
        name = refused_global(e)
        if name is None:
            raise
        raise UntrustedCheckpointError(where, name) from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
