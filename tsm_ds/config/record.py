"""``<run>/config.json``: the run's configuration tree, and reading it back.

Schema (``"schema_version": 2``)::

    {"schema_version": 2,
     "config": {"data": {...}, "model": {...}, "engine": {...}, "schedule": {...}, "guard": {...},
                "distributed": {...}, "output": {...}, "logging": {...}, "debug": {...}},
     "run": {"deepspeed_config": resolved recipe path, "data_description": "...", "flip": bool},
     "split": {...},                       # tsm_ds.data.splits.Split.as_dict(): eval resolves it again
     "engine_json": ..., "resolved_ds_config": ..., "resolved_tsm_ds": ..., "auto_filled": ...,
     "world_size": N, "steps_per_epoch": S, "total_steps": T, "param_groups": [...],
     "class_names": [...], "torch_threads": n, "provenance": {...}}

``config`` holds every recorded field of :data:`tsm_ds.config.tree.TRAIN_SECTIONS` (fields made with
``record=False`` describe one process, not the run: ``--local_rank``, ``--resume``, ``--config``).
Runs written before the tree (schema 1, tsm_ds up to commit 52ba896) recorded the flat flags as
``"flags"``; :func:`tree_from_record` maps them onto the tree.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tsm_ds.config.env import unwrap_optional
from tsm_ds.config.fields import ConfigTreeError, field_infos
from tsm_ds.config.tree import TRAIN_SECTIONS, Config

__all__ = ["SCHEMA_VERSION", "tree_to_record", "tree_from_record", "load_run_config", "run_record", "check_value",
           "tree_with"]

SCHEMA_VERSION = 2

#: schema-1 flag names whose field has another name or the opposite sense: flag -> (path, invert)
_LEGACY_RENAMES = {"no_flip": ("data.flip", True), "no_progress": ("logging.progress", True),
                   "no_fused_shift": ("model.fused_shift", True)}
#: schema-1 keys that were not flags (written beside them) or describe one process
_LEGACY_EXTRA = {"data_description", "split", "local_rank", "deepspeed", "deepscale", "deepscale_config",
                 "resume", "deepspeed_config"}


def tree_to_record(cfg: Config) -> dict:
    """``{section: {field: value}}`` of the recorded fields of :data:`TRAIN_SECTIONS` (JSON types:
    tuples become lists)."""
    out: dict[str, dict] = {}
    for path, info in field_infos(Config).items():
        if info.section not in TRAIN_SECTIONS or not info.meta.get("record", True):
            continue
        value = getattr(getattr(cfg, info.section), info.name)
        out.setdefault(info.section, {})[info.name] = list(value) if isinstance(value, tuple) else value
    return out


def run_record(cfg: Config, *, deepspeed_config: str, data_description: str, split: dict, flip: bool) -> dict:
    """What the train command adds to ``config.json`` before the trainer writes it (the trainer
    adds the engine JSON, world size, steps and provenance; :func:`tsm_ds.engine.loop.result.save_config_record`)."""
    return {"schema_version": SCHEMA_VERSION, "config": tree_to_record(cfg),
            "run": {"deepspeed_config": str(deepspeed_config), "data_description": data_description, "flip": flip},
            "split": split}


def check_value(info: Any, value: Any, *, source: str, key: str) -> Any:
    """``value`` for the field ``info`` (a :class:`~tsm_ds.config.fields.FieldInfo`) as read from a
    file a user may have edited: its type and choices checked, a JSON list turned into a tuple for
    tuple fields, an int accepted for a float.

    Raises:
        ConfigTreeError: a wrong type or a value outside the choices: ``"<source>: <key> = <value>:
            expected <type>, found <type>"`` (one line; the command exits 2).
    """
    import typing

    tp, optional = unwrap_optional(info.type)
    if value is None:
        if optional:
            return None
        raise ConfigTreeError(f"{source}: {key} = null: expected {getattr(tp, '__name__', tp)}, found null")

    def wrong(expected: str) -> ConfigTreeError:
        return ConfigTreeError(f"{source}: {key} = {json.dumps(value)}: expected {expected}, found "
                               f"{type(value).__name__}")
    origin = typing.get_origin(tp)
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise wrong("a string")
    elif origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise wrong("a list")
        inner = [a for a in typing.get_args(tp) if a is not Ellipsis]
        el = inner[0] if inner else None
        for v in value:
            if (el is float and (isinstance(v, bool) or not isinstance(v, (int, float)))) or \
                    (el is int and (isinstance(v, bool) or not isinstance(v, int))) or \
                    (el is str and not isinstance(v, str)):
                raise wrong(f"a list of {el.__name__}")
        value = tuple(value) if origin is tuple else list(value)
    choices = info.meta.get("choices")
    if choices and value not in choices:
        raise ConfigTreeError(f"{source}: {key} = {json.dumps(value)}: expected one of {', '.join(map(str, choices))}")
    return value


def _set(cfg: Config, path: str, value: Any, *, source: str = "config.json", key: str | None = None) -> None:
    sec, name = path.split(".")
    info = field_infos(Config)[path]
    value = check_value(info, value, source=source, key=key or f"config.{path}")
    setattr(getattr(cfg, sec), name, value)


def tree_with(values: dict[str, Any], base: Config | None = None) -> Config:
    """A copy of ``base`` (default: the defaults) with ``values`` set: ``{"section.field": value}``,
    each checked as a value read from a file is (:func:`check_value`). For programs that start a run
    themselves (tests, the doctor, studies) without a command line.

    Raises:
        ConfigTreeError: an unknown ``section.field``, a wrong type or a value outside the choices.
    """
    import copy

    cfg = copy.deepcopy(base) if base is not None else Config()
    infos = field_infos(Config)
    for path, value in values.items():
        if path not in infos:
            raise ConfigTreeError(f"tree_with: {path!r} is no field of the configuration tree (section.field, "
                                  f"e.g. 'schedule.epochs')")
        _set(cfg, path, value, source="tree_with", key=path)
    return cfg


def tree_from_record(record: dict, *, source: str = "config.json") -> tuple[Config, list[str]]:
    """The training tree of a run's ``config.json`` (schema 2, or schema 1's ``flags``).

    Args:
        record: the parsed JSON.
        source: the file's name for messages.

    Returns:
        (the tree with the run's values, notes: one line per recorded key that has no field any more,
        e.g. a flag removed since; empty for a current record).

    Raises:
        ConfigTreeError: not a run record (neither ``config`` nor ``flags``), a newer schema, a
            section that is not a dictionary, or a value of the wrong type or outside its choices
            (:func:`check_value`; the message names the file and the key).
    """
    infos = field_infos(Config)
    cfg = Config()
    notes: list[str] = []
    version = record.get("schema_version", 1 if "flags" in record else None)
    if version is None:
        raise ConfigTreeError(f"{source}: not a training run's config.json (no 'config' or 'flags' record); "
                              f"give the run's own RUN/config.json")
    if version > SCHEMA_VERSION:
        raise ConfigTreeError(f"{source}: schema_version {version} is newer than this tsm_ds reads "
                              f"({SCHEMA_VERSION}): update tsm_ds")
    if version == SCHEMA_VERSION:
        for sec, values in record.get("config", {}).items():
            if not isinstance(values, dict):
                raise ConfigTreeError(f"{source}: config.{sec} is not a dictionary")
            for name, value in values.items():
                path = f"{sec}.{name}"
                if path in infos and sec in TRAIN_SECTIONS:
                    _set(cfg, path, value, source=source)
                else:
                    notes.append(f"{source}: config.{path} is not an option any more; ignored")
        dsc = record.get("run", {}).get("deepspeed_config")
        if dsc and cfg.engine.deepspeed_config is None:
            cfg.engine.deepspeed_config = dsc
        return cfg, notes
    # schema 1 (tsm_ds <= 52ba896): flat argparse dests
    flags = record["flags"]
    by_name = {i.name: p for p, i in infos.items() if i.section in TRAIN_SECTIONS}
    for key, value in flags.items():
        if key in _LEGACY_RENAMES:
            path, invert = _LEGACY_RENAMES[key]
            _set(cfg, path, (not value) if invert else value, source=source, key=f"flags.{key}")
        elif key in by_name and infos[by_name[key]].meta.get("record", True):
            if value is None and not unwrap_optional(infos[by_name[key]].type)[1]:
                continue   # schema 1's None = "the variable, else the default": the field's default now
            _set(cfg, by_name[key], value, source=source, key=f"flags.{key}")
        elif key not in _LEGACY_EXTRA:
            notes.append(f"{source}: flag {key!r} of the old run has no option any more; ignored")
    if flags.get("deepspeed_config"):
        cfg.engine.deepspeed_config = str(flags["deepspeed_config"])
    return cfg, notes


def load_run_config(path: str | Path) -> tuple[Config, dict, list[str]]:
    """Read ``RUN/config.json`` (or ``RUN``): (the tree, the whole record, notes of :func:`tree_from_record`).

    Raises:
        FileNotFoundError: no such file (named).
        ConfigTreeError: not valid JSON, or not a run record (named, with what to do).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such run configuration; give RUN/config.json of a training run")
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigTreeError(f"{p}: not valid JSON ({e})") from e
    if not isinstance(record, dict):
        raise ConfigTreeError(f"{p}: not a training run's config.json")
    cfg, notes = tree_from_record(record, source=str(p))
    return cfg, record, notes
