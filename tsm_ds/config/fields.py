"""Fields of the configuration tree, the command-line parsers generated from them and the one
command-line builder (:func:`to_argv`).

A field is a dataclass field made with :func:`opt`: its name, type (from the annotation), default,
help, choices and flag live in ONE place. A command says which fields it uses
(:class:`Command`: whole sections and single fields) and may change a field's default or make it
required, nothing else; :func:`build_parser` turns that into an ``argparse`` parser, and
:func:`parse` turns argv into the typed tree. :func:`to_argv` is the inverse: a tree (or a few
fields) as the argv of a command, for the runs the product starts itself (the demo, the
large-batch study, the doctor).

Flag spelling: ``--`` + the field name with ``_`` -> ``-`` unless the field names its ``flag``
(``--deepspeed_config``, ``--local_rank``: the launcher's spellings). Types: ``int``, ``float``,
``str``, ``bool`` (a switch; with a command default of None, ``--x`` / ``--no-x``), ``X | None``,
``list[X]`` (``nargs="+"``), ``tuple[X, ...]`` (comma-separated text, or ``nargs`` given). Source
of the shape: torchtitan's ``JobConfig`` (one typed tree, each component built from its section).
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Callable, Mapping, Sequence

from tsm_ds.config.env import env_value, unwrap_optional

__all__ = ["opt", "FieldInfo", "Command", "build_parser", "parse", "to_argv", "field_infos", "section_names",
           "ConfigTreeError"]


class ConfigTreeError(ValueError):
    """A command or a record names a field the tree does not have, or a value of the wrong type."""


def opt(default: Any = MISSING, help: str = "", *, flag: str | None = None, aliases: Sequence[str] = (),
        choices: Sequence[Any] | None = None, metavar: str | None = None, nargs: Any = None,
        positional: bool = False, hidden: bool = False, parse: Callable[[str], Any] | None = None,
        env: str | None = None, factory: Callable[[], Any] | None = None, record: bool = True) -> Any:
    """A field of the configuration tree (a ``dataclasses.field`` with the command-line metadata).

    Args:
        default: the default value (use ``factory`` for lists).
        help: one line for ``--help`` (the default is appended by the parser).
        flag: the option's spelling when it is not ``--field-name`` (e.g. ``--deepspeed_config``).
        aliases: other spellings accepted on the command line (kept for compatibility; listed in
            the help).
        choices: allowed values.
        metavar, nargs: as argparse's.
        positional: a positional argument (``tsm-ds predict VIDEO...``).
        hidden: not shown by ``--help`` (set by the launcher, test hooks).
        parse: a converter from text for types the annotation cannot say (comma lists).
        env: the environment variable that sets this field when the flag is not given
            (:mod:`tsm_ds.config.env`; the flag wins).
        factory: default factory (mutable defaults).
        record: written to ``config.json`` (False for what describes this process, not the run:
            ``--local_rank``, ``--config`` itself).

    Returns:
        a ``dataclasses.field``.
    """
    meta = {"help": help, "flag": flag, "aliases": tuple(aliases), "choices": None if choices is None else
            tuple(choices), "metavar": metavar, "nargs": nargs, "positional": positional, "hidden": hidden,
            "parse": parse, "env": env, "record": record}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class FieldInfo:
    """One field of the tree as the parser generator sees it.

    Attributes:
        path: ``"section.field"``; section, name: its two parts.
        type: the annotation (resolved); default: the tree's default; meta: :func:`opt`'s metadata.
    """

    path: str
    section: str
    name: str
    type: Any
    default: Any
    meta: Mapping[str, Any]

    @property
    def flag(self) -> str:
        """The option string (``--num-segments``), or the dest of a positional."""
        if self.meta.get("positional"):
            return self.name
        return self.meta.get("flag") or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The argparse dest: ``section__field`` (unique across sections)."""
        return f"{self.section}__{self.name}"


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def section_names(root: type) -> list[str]:
    """The section names of a root dataclass (its dataclass-typed fields), in order."""
    hints = typing.get_type_hints(root)
    return [f.name for f in fields(root) if is_dataclass(hints[f.name])]


def field_infos(root: type) -> dict[str, FieldInfo]:
    """``{"section.field": FieldInfo}`` of every field of every section of ``root``."""
    out: dict[str, FieldInfo] = {}
    hints = typing.get_type_hints(root)
    for sec in section_names(root):
        cls = hints[sec]
        sh = typing.get_type_hints(cls)
        for f in fields(cls):
            out[f"{sec}.{f.name}"] = FieldInfo(f"{sec}.{f.name}", sec, f.name, sh[f.name], _default_of(f),
                                               dict(f.metadata))
    return out


def _scalar(tp: Any) -> Callable[[str], Any]:
    return {int: int, float: float, str: str}.get(tp, str)


@dataclass
class Command:
    """The fields one command uses, for :func:`build_parser`.

    Attributes:
        prog: the program name shown in usage lines (``tsm-ds eval``).
        description: the first line(s) of ``--help``.
        sections: whole sections used (every field of each).
        fields: single fields used from other sections (``"model.arch"``).
        defaults: ``{"section.field": value}``: this command's default (e.g. None = "from the
            checkpoint" for eval's ``model.num_segments``).
        required: fields this command needs on the command line.
        exclude: fields of the listed sections this command does not use.
        epilog: text after the options in ``--help``.
        use_env: the command reads the environment variables of its fields
            (:mod:`tsm_ds.config.env`) where a flag does not give them.
    """

    prog: str
    description: str = ""
    sections: Sequence[str] = ()
    fields: Sequence[str] = ()
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    required: Sequence[str] = ()
    exclude: Sequence[str] = ()
    epilog: str | None = None
    use_env: bool = False

    def paths(self, infos: Mapping[str, FieldInfo]) -> list[str]:
        """The field paths this command uses, in tree order.

        Raises:
            ConfigTreeError: a section or field the tree does not have.
        """
        known_sections = {i.section for i in infos.values()}
        for s in self.sections:
            if s not in known_sections:
                raise ConfigTreeError(f"{self.prog}: unknown section {s!r}")
        for p in [*self.fields, *self.defaults, *self.required, *self.exclude]:
            if p not in infos:
                raise ConfigTreeError(f"{self.prog}: unknown field {p!r}")
        chosen = set(self.fields) | {p for p, i in infos.items() if i.section in self.sections}
        chosen -= set(self.exclude)
        return [p for p in infos if p in chosen]


def _shown(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """A field's ``parse`` converter whose ValueError message argparse shows as it is (argparse prints
    only "invalid <name> value" for a ValueError; a message that names the flag and the forms it
    takes is the user's fix)."""
    def convert(text: str) -> Any:
        try:
            return conv(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e) or f"invalid value {text!r}") from None
    convert.__name__ = getattr(conv, "__name__", "value")
    return convert


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    pass


def _help(info: FieldInfo, default: Any, required: bool, use_env: bool) -> str:
    text = info.meta.get("help") or ""
    if info.meta.get("hidden"):
        return argparse.SUPPRESS
    if info.meta.get("aliases"):
        text += f" (also {', '.join(info.meta['aliases'])})"
    if info.meta.get("env") and use_env:
        text += f" [env ${info.meta['env']}]"
    if required:
        return text + " (required)"
    tp, _ = unwrap_optional(info.type)
    if tp is bool or default is None:   # a switch says what it does; None: the help says what happens
        return text
    if isinstance(default, (list, tuple)):
        sep = "," if info.meta.get("parse") is not None else " "
        default = sep.join(str(x) for x in default) if default else "none"
    return f"{text} (default: {default})".replace("%", "%%")


def build_parser(cmd: Command, root: type) -> argparse.ArgumentParser:
    """The ``argparse`` parser of ``cmd``, generated from the fields of ``root`` it uses.

    Each option's name, type, choices and help come from the field (:func:`opt`); its default is
    the command's (``cmd.defaults``) or the field's. Options are grouped by section.

    Raises:
        ConfigTreeError: ``cmd`` names an unknown field or section.
    """
    infos = field_infos(root)
    p = argparse.ArgumentParser(prog=cmd.prog, description=cmd.description, epilog=cmd.epilog,
                                formatter_class=_HelpFormatter)
    groups: dict[str, Any] = {}
    for path in cmd.paths(infos):
        info = infos[path]
        g = groups.get(info.section)
        if g is None:
            g = groups[info.section] = p.add_argument_group(info.section)
        default = cmd.defaults.get(path, info.default)
        required = path in cmd.required
        tp, optional = unwrap_optional(info.type)
        kw: dict[str, Any] = {"help": _help(info, default, required, cmd.use_env)}
        m = info.meta
        kw["metavar"] = m.get("metavar") or info.name.upper()
        if m.get("positional"):
            kw["nargs"] = m.get("nargs") or None
            g.add_argument(info.dest, **kw)
            continue
        kw["dest"] = info.dest
        names = [info.flag, *m.get("aliases", ())]
        if tp is bool:
            kw.pop("metavar")
            if default is None or m.get("nargs") == "bool":
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["action"] = "store_false" if default else "store_true"
            kw["default"] = default
            g.add_argument(*names, **kw)
            continue
        origin = typing.get_origin(tp)
        if m.get("parse") is not None:
            kw["type"] = _shown(m["parse"])
        elif origin in (list, tuple):
            elem = typing.get_args(tp)[0]
            kw["type"] = _scalar(elem)
            kw["nargs"] = m.get("nargs") or "+"
        else:
            kw["type"] = _scalar(tp)
            if m.get("nargs"):
                kw["nargs"] = m["nargs"]
        if m.get("choices") is not None:
            kw["choices"] = list(m["choices"])
            kw.pop("metavar")
        if required:
            kw["required"] = True
        else:
            kw["default"] = default
        g.add_argument(*names, **kw)
    return p


def parse(cmd: Command, root: type, argv: Sequence[str] | None, *, base: Any | None = None,
          env: Mapping[str, str] | None = None) -> tuple[Any, set[str]]:
    """Parse ``argv`` for ``cmd`` into a ``root`` tree.

    Args:
        cmd, root: as :func:`build_parser`.
        argv: the arguments (None: ``sys.argv[1:]``).
        base: a tree whose values replace the defaults (``--config RUN/config.json``): a flag given
            in argv overrides its field, every other field keeps ``base``'s value.
        env: environment for fields with an ``env`` variable (:mod:`tsm_ds.config.env`), applied
            where neither a flag nor ``base`` gave the field, for commands with ``use_env``; None: no variables.

    Returns:
        (the tree, the set of field paths given on the command line).

    Raises:
        SystemExit: argparse's exit for bad options or ``--help``.
    """
    infos = field_infos(root)
    parser = build_parser(cmd, root)
    ns = parser.parse_args(argv)
    sentinel = object()
    # which options were given: parse again with every default replaced by a sentinel
    probe = build_parser(cmd, root)
    for a in probe._actions:
        if a.dest != "help" and not a.required and a.option_strings:
            a.default = sentinel
    given_ns = probe.parse_args(argv)
    given = {p for p in cmd.paths(infos) if getattr(given_ns, infos[p].dest, sentinel) is not sentinel
             and infos[p].flag.startswith("-")}
    given |= {p for p in cmd.paths(infos) if infos[p].meta.get("positional")}
    tree = base if base is not None else root()
    for path in cmd.paths(infos):
        info = infos[path]
        value = getattr(ns, info.dest)
        if path not in given:
            if base is not None and info.meta.get("record", True):
                continue   # the recorded run's value (the command's default does not replace it)
            text = env.get(info.meta["env"]) if cmd.use_env and env is not None and info.meta.get("env") else None
            if text is not None and (text != "" or unwrap_optional(info.type)[0] is bool):   # empty: unset
                value = env_value(info, text)
        setattr(getattr(tree, info.section), info.name, value)
    return tree, given


def _argv_value(info: FieldInfo, value: Any) -> list[str]:
    tp, _ = unwrap_optional(info.type)
    if tp is bool:
        if value is None:
            return []
        if info.meta.get("nargs") == "bool" or info.default is None:
            return [info.flag if value else "--no-" + info.flag[2:]]
        if bool(value) == bool(info.default):
            return []
        return [info.flag]
    if value is None:
        return []
    if info.meta.get("parse") is not None and isinstance(value, (list, tuple)):
        text = ",".join(str(v) for v in value)
        return [info.flag, text]
    if isinstance(value, (list, tuple)):
        return [info.flag, *[str(v) for v in value]]
    if info.meta.get("positional"):
        return [str(value)]
    return [info.flag, str(value)]


def to_argv(cmd: Command, root: type, values: Mapping[str, Any] | Any, *, only_changed: bool = True) -> list[str]:
    """The one command-line builder: field values as the argv of ``cmd``.

    Args:
        cmd, root: the command and the tree type.
        values: a ``root`` tree, or ``{"section.field": value}`` for a few fields.
        only_changed: leave out fields equal to the command's default (shorter lines).

    Returns:
        argv (positionals last).

    Raises:
        ConfigTreeError: a value for a field the command does not use.
    """
    infos = field_infos(root)
    used = cmd.paths(infos)
    if isinstance(values, Mapping):
        bad = [p for p in values if p not in used]
        if bad:
            raise ConfigTreeError(f"{cmd.prog} has no option for {', '.join(bad)}")
        items = [(p, values[p]) for p in used if p in values]
    else:
        items = [(p, getattr(getattr(values, infos[p].section), infos[p].name)) for p in used]
    argv: list[str] = []
    tail: list[str] = []
    for path, value in items:
        info = infos[path]
        default = cmd.defaults.get(path, info.default)
        if only_changed and value == default and path not in cmd.required:
            continue
        if info.meta.get("hidden") and value == default:
            continue
        if info.meta.get("positional"):
            tail += [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
            continue
        argv += _argv_value(info, value)
    return argv + tail
