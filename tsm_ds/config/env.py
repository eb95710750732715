"""Environment variables: each one sets ONE field of the configuration tree, in one table.

The command-line parsers (:func:`tsm_ds.config.fields.parse`) read the variables of the fields a
command uses from the environment they are given, and only where the flag was not given (the
flag wins). No other module of the package reads ``TSM_DS_*`` variables for itself. docs/training.md's
table of variables is tested equal to :data:`VARIABLES` (``tests/config/test_tree.py``).
"""
from __future__ import annotations

import types
import typing
from typing import Any

__all__ = ["VARIABLES", "env_value", "unwrap_optional"]

#: variable -> (field path, what it does); the field's ``opt(env=...)`` names the variable too
VARIABLES: dict[str, tuple[str, str]] = {
    "TSM_DS_DATA": ("data.data", "a data folder as `--data` takes it: the default of train and bench data"),
    "TSM_DS_FUSED_SHIFT": ("model.fused_shift", "`0`: the out-of-place reference shift instead of the fused one"),
    "TSM_DS_INDEX_CACHE": ("data.index_cache", "keep per-file frame indexes on disk in this folder"),
    "TSM_DS_INDEX_CACHE_SIZE": ("data.index_cache_size", "frame indexes kept in memory per process"),
    "TSM_DS_MALLOC_TRIM": ("data.malloc_trim", "`0`: keep glibc's freed heap after every item"),
    "TSM_DS_DIST_TIMEOUT": ("distributed.dist_timeout", "seconds for every rank to join and every collective"),
    "TSM_DS_HOSTS": ("distributed.hosts", "the hostfile's hosts in node order (set by the launch scripts)"),
    "TSM_DS_TEST_HANG": ("debug.test_hang", "test hook `<rank>:<step>[:<s>]`: that rank sleeps in that optimizer step"),
    "SSH_PORT": ("cluster.ssh_port", "ssh port of the hosts: the default of `tsm-ds doctor --hostfile`'s check"),
    "MASTER_ADDR": ("cluster.master_addr", "rank 0's address: the default of `tsm-ds doctor --hostfile`'s check"),
    "MASTER_PORT": ("cluster.master_port", "training's port, checked free on the first host by `tsm-ds doctor "
                    "--hostfile`"),
}

_FALSE = ("0", "false", "no", "off", "")


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(inner type, whether it was optional) of an annotation ``X | None``; other types unchanged."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def env_value(info: Any, text: str) -> Any:
    """The value of a variable for its field (``info``: a :class:`tsm_ds.config.fields.FieldInfo`).

    Booleans: ``0``/``false``/``no``/``off``/empty are False, anything else True; numbers are
    converted; comma lists for tuple fields.

    Raises:
        ValueError: a variable that does not convert, naming it.
    """
    tp, _ = unwrap_optional(info.type)
    name = info.meta.get("env")
    try:
        if tp is bool:
            return text.strip().lower() not in _FALSE
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
        if typing.get_origin(tp) in (list, tuple):
            return tuple(x for x in text.split(",") if x)
        return text or None
    except ValueError as e:
        raise ValueError(f"${name}={text!r}: not a valid value for {info.path} ({e})") from e
