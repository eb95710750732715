"""Engine recipes: a ``ds_configs/*.json`` found by path or by name, read, and the optimizer it asks for.

A recipe is a DeepSpeed config plus one ``"tsm_ds"`` block that DeepSpeed never sees:

- ``tsm_ds.optimizer``: a client optimizer built by us (``timm.Lamb``, ``timm.Lars``, ``torch.SGD``,
  ``torch.AdamW``), used instead of DeepSpeed's ``"optimizer"`` block (one or the other).
- ``tsm_ds.lr_schedule``: the client schedule (official step decay or cosine, linear warmup in
  optimizer steps), used instead of DeepSpeed's ``"scheduler"`` block (one or the other).
- ``tsm_ds.lr_scaling``: ``{"rule": "linear"|"sqrt"|"none", "base_lr": 0.02, "base_batch": 128}``.
- ``tsm_ds.compression``: handed to ``tsm_ds.engine.comm.compression.build_compressor``.

Keys whose name starts with ``_`` (``"_comment"``) are documentation and are dropped. Values that
depend on the run may be ``"auto"`` (:data:`AUTO`), filled by
:func:`tsm_ds.engine.config.resolve.resolve_config`; the resolved configuration is checked by
:func:`tsm_ds.engine.config.checks.validate_config`.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["AUTO", "ConfigError", "RECIPE_DIRS", "recipe_names", "resolve_recipe", "load_config",
           "optimizer_kind", "recipe_needs_cuda", "CUDA_ONLY_OPTIMIZERS", "check_tsm_block"]

#: DeepSpeed optimizer types (a JSON "optimizer" block) that build a CUDA-only op
CUDA_ONLY_OPTIMIZERS = {"lamb": "FusedLamb", "lion": "FusedLion"}
#: a recipe value that the run fills (:func:`tsm_ds.engine.config.resolve.resolve_config`)
AUTO = "auto"


class ConfigError(ValueError):
    """An engine JSON that cannot work; the message names the key and the fix."""


#: where named recipes live: ``tsm_ds/ds_configs`` in an installed package (setup.py installs the
#: top-level ``ds_configs/`` there), the repository's ``ds_configs/`` in a source checkout or an
#: editable install
RECIPE_DIRS: tuple[Path, ...] = (Path(__file__).resolve().parents[2] / "ds_configs",
                                 Path(__file__).resolve().parents[3] / "ds_configs")


def recipe_names() -> list[str]:
    """Names of the recipes shipped with the package (``cpu_fp32``, ``gpu_fp16``, ...), sorted."""
    return sorted({f.stem for d in RECIPE_DIRS if d.is_dir() for f in d.glob("*.json")})


def resolve_recipe(name_or_path: str | Path) -> Path:
    """The engine JSON file meant by ``--deepspeed_config``: a path, or a shipped recipe's name.

    ``ds_configs/cpu_fp32.json`` (an existing file) is taken as given; ``cpu_fp32`` or
    ``cpu_fp32.json`` (no folder part, no such file in the current directory) is looked up in
    :data:`RECIPE_DIRS`, so recipes work from any directory and from a non-editable install.

    Raises:
        ConfigError: neither an existing file nor a shipped recipe (the message lists the names).
    """
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.parent == Path("."):
        stem = p.name[:-5] if p.name.endswith(".json") else p.name
        for d in RECIPE_DIRS:
            if (d / f"{stem}.json").is_file():
                return d / f"{stem}.json"
    raise ConfigError(f"{p}: engine JSON not found; pass --deepspeed_config with a file path or a "
                      f"shipped recipe name: {', '.join(recipe_names()) or '(none installed)'}")


def load_config(path: str | Path) -> dict:
    """Read a recipe JSON, given by path or by name (see :func:`resolve_recipe`).

    Raises:
        ConfigError: missing file or invalid JSON (message names the file and the line).
    """
    p = resolve_recipe(path)
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e}); fix the file") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p}: an engine JSON is an object ({{...}}), found {type(cfg).__name__}")
    check_tsm_block(cfg.get("tsm_ds", {}), source=str(p))
    return cfg


_NUM, _INT, _STR, _BOOL, _LIST, _DICT = "a number", "an integer", "a string", "true or false", "a list of numbers", \
    "an object"
#: the ``tsm_ds`` block: key -> expected kind, or a nested block; ("auto" allowed) marks keys the run fills
_TSM_SCHEMA: dict = {
    "optimizer": {"type": _STR, "params": _DICT},
    "lr_scaling": {"rule": ("linear", "sqrt", "none"), "base_lr": _NUM, "base_batch": _INT},
    "lr_schedule": {"type": ("step", "cosine", "constant"), "warmup_steps": (_INT, "auto"),
                    "warmup_epochs": (_NUM, "auto"), "decay_epochs": (_LIST, "auto"), "gamma": _NUM,
                    "steps_per_epoch": _INT, "total_steps": _INT},
    "compression": None,   # its own parser (tsm_ds.engine.comm.compression.parse_compression_block) checks it
    "zero_init_residual": _BOOL,
}


def _kind_ok(kind: str, v) -> bool:
    if kind == _NUM:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == _STR:
        return isinstance(v, str)
    if kind == _BOOL:
        return isinstance(v, bool)
    if kind == _LIST:
        return isinstance(v, list) and all(_kind_ok(_NUM, x) for x in v)
    return isinstance(v, dict)


def check_tsm_block(block, *, source: str) -> None:
    """Check a recipe's ``tsm_ds`` block against its schema before anything reads it: every key known
    (a typo stops: DeepSpeed never sees this block, so nothing else would catch it), every value of
    its kind ("auto" where the run fills it), choices respected. Keys starting with ``_`` are
    comments.

    Raises:
        ConfigError: ``"<file>: tsm_ds.<key> = <value>: expected <kind>, found <type>"``, or an
            unknown key with the known ones (one line; the commands exit 2).
    """
    def walk(obj, schema: dict, prefix: str) -> None:
        if not isinstance(obj, dict):
            raise ConfigError(f"{source}: {prefix} = {json.dumps(obj)}: expected an object, found "
                              f"{type(obj).__name__}")
        for k, v in obj.items():
            if str(k).startswith("_"):
                continue
            key = f"{prefix}.{k}"
            if k not in schema:
                raise ConfigError(f"{source}: {key}: unknown key (a typo?); {prefix} knows "
                                  f"{', '.join(sorted(schema))}")
            want = schema[k]
            if want is None:
                continue
            if isinstance(want, dict):
                walk(v, want, key)
                continue
            kinds = want if isinstance(want, tuple) else (want,)
            if v in ("auto",) and "auto" in kinds:
                continue
            named = [x for x in kinds if x in (_NUM, _INT, _STR, _BOOL, _LIST, _DICT)]
            values = [x for x in kinds if x not in named and x != "auto"]
            if (named and any(_kind_ok(x, v) for x in named)) or (values and v in values):
                continue
            expected = " or ".join([*named, *(json.dumps(x) for x in values), *(['"auto"'] if "auto" in kinds else [])])
            raise ConfigError(f"{source}: {key} = {json.dumps(v)}: expected {expected}, found {type(v).__name__}")
    walk(block, _TSM_SCHEMA, "tsm_ds")


def optimizer_kind(cfg: dict) -> tuple[str, str, dict]:
    """Which optimizer a recipe asks for.

    Returns:
        (source, type_lower, block): source ``"deepspeed"`` (JSON ``optimizer``), ``"client"``
        (``tsm_ds.optimizer``) or ``"none"``; the block is the dict holding ``params``.

    Raises:
        ConfigError: both blocks given.
    """
    ds_opt = cfg.get("optimizer")
    client = cfg.get("tsm_ds", {}).get("optimizer")
    if ds_opt and client:
        raise ConfigError("engine JSON has both `optimizer` and `tsm_ds.optimizer`: keep one "
                          "(`tsm_ds.optimizer` builds a client optimizer, e.g. timm.Lamb on CPU)")
    if client:
        return "client", str(client.get("type", "")).lower(), client
    if ds_opt:
        return "deepspeed", str(ds_opt.get("type", "")).lower(), ds_opt
    return "none", "", {}


def recipe_needs_cuda(ds_config: dict, recipe: str | Path) -> str | None:
    """Why a recipe can only run on CUDA, or None: fp16 (DeepSpeed refuses fp16 on its CPU
    accelerator), a CUDA-only DeepSpeed optimizer (FusedLamb / FusedLion), or a ``gpu_*`` recipe
    (the recipe table's "where it runs").

    Args:
        ds_config: the recipe as read (:func:`load_config`) or resolved, with its ``"tsm_ds"`` block;
        recipe: its path or name.
    """
    if (ds_config.get("fp16") or {}).get("enabled"):
        return "the recipe enables fp16"
    src, otype, _ = optimizer_kind(ds_config)
    if src == "deepspeed" and otype in CUDA_ONLY_OPTIMIZERS:
        return f"the recipe's optimizer {otype!r} is CUDA-only ({CUDA_ONLY_OPTIMIZERS[otype]})"
    if Path(str(recipe)).name.startswith("gpu_"):
        return "a gpu_* recipe"
    return None
