"""One configuration tree (tsm_ds.config): every option of every command is a field of it.

- every parser of every command (tsm_ds.train, each tsm-ds command, each bench) has exactly the
  options of the fields its :class:`~tsm_ds.config.fields.Command` names, with the fields' spellings;
  the checker fails on a hand-declared option (planted fixture);
- no ``add_argument`` outside the parser generator; ``--num-segments``, ``--arch``, ``--img-size`` and
  ``--deepspeed_config`` are declared by one field each and appear as an option string nowhere else;
- no argparse Namespace in the library layers (data, models, engine, inference; AST, planted fixture);
- the environment table: one field per variable, docs/training.md's table equal to it, flags win;
- the one command-line builder and config.json round-trip the tree.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import re
from pathlib import Path

import pytest

from tsm_ds.config import Config, field_infos, parse, to_argv
from tsm_ds.config.commands import EVAL, PLAN, PREDICT, TRAIN
from tsm_ds.config.env import VARIABLES
from tsm_ds.config.fields import Command, ConfigTreeError, build_parser, opt
from tsm_ds.config.record import SCHEMA_VERSION, load_run_config, tree_from_record, tree_to_record

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "tsm_ds"
INFOS = field_infos(Config)


def command_modules() -> list[str]:
    """Every module that owns a command line: the training entry point, each ``tsm-ds`` command
    and each benchmark."""
    from tsm_ds.cli import COMMANDS
    from tsm_ds.cli.bench import BENCHES

    return sorted({"tsm_ds.cli.train", *(m for m, _ in COMMANDS.values()), *(m for m, _ in BENCHES.values())})


def parser_violations(parser: argparse.ArgumentParser, cmd: Command) -> list[str]:
    """Options of ``parser`` that are not exactly the fields ``cmd`` uses: an option whose dest is
    no field of the tree (declared by hand), a field spelled otherwise than its definition, a field
    of the command the parser lacks."""
    out = []
    by_dest = {i.dest: i for i in INFOS.values()}
    used = {INFOS[p].dest for p in cmd.paths(INFOS)}
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        info = by_dest.get(a.dest)
        if info is None or a.dest not in used:
            out.append(f"{cmd.prog}: {'/'.join(a.option_strings) or a.dest} is no field of the command")
            continue
        spelled = [info.flag, *info.meta.get("aliases", ())] if info.flag.startswith("-") else []
        if isinstance(a, argparse.BooleanOptionalAction):   # --x / --no-x (a switch whose default is None)
            spelled = [s for f in spelled for s in (f, "--no-" + f[2:])]
        if list(a.option_strings) != spelled:
            out.append(f"{cmd.prog}: {info.path} spelled {a.option_strings}, its field says {spelled}")
    seen = {a.dest for a in parser._actions}
    out += [f"{cmd.prog}: field {d} has no option" for d in sorted(used - seen)]
    return out


@pytest.mark.parametrize("module_name", command_modules())
def test_every_option_of_every_parser_is_a_field(module_name):
    module = importlib.import_module(module_name)
    cmd = getattr(module, "COMMAND", None) or module._command()   # bench all: BENCH_ALL with the bench list
    assert isinstance(cmd, Command), module_name
    assert parser_violations(module.build_parser(), cmd) == []


def test_the_checker_fails_on_a_hand_declared_option():
    parser = build_parser(EVAL, Config)
    assert parser_violations(parser, EVAL) == []
    parser.add_argument("--my-new-option", type=int, help="declared by hand")           # planted
    assert parser_violations(parser, EVAL) == ["tsm-ds eval: --my-new-option is no field of the command"]
    renamed = build_parser(EVAL, Config)
    renamed.add_argument("--segments", dest="model__num_segments", type=int)           # a field, spelled otherwise
    assert any("model.num_segments spelled ['--segments']" in v for v in parser_violations(renamed, EVAL))


def _add_argument_calls(path: Path) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Attribute) and n.attr in ("add_argument", "add_argument_group",
                                                            "add_mutually_exclusive_group")]


def test_no_option_is_declared_outside_the_generator(tmp_path):
    generator = PKG / "config" / "fields.py"
    found = {str(p.relative_to(REPO)): lines for p in sorted(PKG.rglob("*.py")) if p != generator
             for lines in [_add_argument_calls(p)] if lines}
    assert found == {}
    planted = tmp_path / "cmd.py"
    planted.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--x')\n")
    assert _add_argument_calls(planted) == [3]


@pytest.mark.parametrize("flag,path", [("--num-segments", "model.num_segments"), ("--arch", "model.arch"),
                                       ("--img-size", "data.img_size"),
                                       ("--deepspeed_config", "engine.deepspeed_config")])
def test_shared_flags_have_one_definition(flag, path):
    assert [p for p, i in INFOS.items() if i.flag == flag or flag in i.meta.get("aliases", ())] == [path]
    # as an option string (a string constant that is exactly the flag): only where the field is defined
    where = []
    for p in sorted(PKG.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Constant) and n.value == flag:
                where.append(str(p.relative_to(REPO)))
    assert set(where) <= {"tsm_ds/config/tree.py"}, where


# ---- no argparse Namespace below the commands --------------------------------------------------

LIBRARY = ("data", "models", "engine", "inference")


def namespace_uses(root: Path) -> list[str]:
    """``argparse`` imports, ``Namespace`` names and ``vars(args)`` in the modules under ``root``."""
    out = []
    for p in sorted(root.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            bad = None
            if isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names):
                bad = "imports argparse"
            elif isinstance(n, ast.ImportFrom) and n.module == "argparse":
                bad = "imports from argparse"
            elif isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", None)) == "Namespace":
                bad = "names Namespace"
            elif isinstance(n, ast.arg) and n.arg in ("args", "namespace") and n.annotation is not None:
                bad = f"takes an argument {n.arg!r}"
            if bad:
                out.append(f"{p.name}:{n.lineno}: {bad}")
    return out


@pytest.mark.parametrize("layer", LIBRARY)
def test_no_namespace_in_the_library(layer):
    assert namespace_uses(PKG / layer) == []


def test_the_namespace_checker_finds_a_planted_use(tmp_path):
    (tmp_path / "lib.py").write_text("from typing import Any\nimport argparse\n\n"
                                     "def run(args: Any) -> None:\n    ns = argparse.Namespace()\n")
    assert namespace_uses(tmp_path) == ["lib.py:2: imports argparse", "lib.py:4: takes an argument 'args'",
                                        "lib.py:5: names Namespace"]


# ---- environment variables -----------------------------------------------------------------------

def test_each_variable_sets_one_field_and_the_guide_table_is_the_table():
    for var, (path, _) in VARIABLES.items():
        assert INFOS[path].meta.get("env") == var, var
    assert {i.meta["env"] for i in INFOS.values() if i.meta.get("env")} == set(VARIABLES)
    from tsm_ds.config.docs import variables_table
    guide = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    section = guide.split("## Environment variables and their flags", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `") and "` | `" in ln]
    expected = [f"| {r['variable']} | {r['field']} | {r['flag']} | {r['what']} |" for r in variables_table()]
    assert rows == expected


def test_flag_wins_over_variable_and_only_commands_that_read_them_do():
    env = {"TSM_DS_DATA": "/from/env", "TSM_DS_INDEX_CACHE_SIZE": "17", "TSM_DS_FUSED_SHIFT": "0"}
    cfg, given = parse(TRAIN, Config, [], env=env)
    assert (cfg.data.data, cfg.data.index_cache_size, cfg.model.fused_shift) == ("/from/env", 17, False)
    assert given == set()
    cfg, given = parse(TRAIN, Config, ["--data", "/flag", "--index-cache-size", "5"], env=env)
    assert (cfg.data.data, cfg.data.index_cache_size) == ("/flag", 5) and given == {"data.data",
                                                                                  "data.index_cache_size"}
    cfg, _ = parse(EVAL, Config, ["--checkpoint", "c", "--out", "o"], env=env)   # eval reads no variable
    assert cfg.data.data is None
    with pytest.raises(ValueError, match=re.escape("$TSM_DS_INDEX_CACHE_SIZE='many'")):
        parse(TRAIN, Config, [], env={"TSM_DS_INDEX_CACHE_SIZE": "many"})


# ---- commands change defaults and required, nothing else ---------------------------------------

def test_command_defaults_and_required():
    cfg, _ = parse(EVAL, Config, ["--checkpoint", "c", "--out", "o"])
    assert (cfg.model.arch, cfg.model.num_segments, cfg.data.img_size) == (None, None, None)  # "the checkpoint's"
    cfg, _ = parse(TRAIN, Config, [])
    assert (cfg.model.arch, cfg.model.num_segments, cfg.data.img_size) == ("resnet50", 8, 224)
    with pytest.raises(SystemExit):
        parse(PLAN, Config, ["--world-size", "2"])          # --deepspeed_config and --train-samples required
    with pytest.raises(ConfigTreeError, match="unknown field 'model.depth'"):
        Command("x", fields=("model.depth",)).paths(INFOS)
    cfg, _ = parse(PREDICT, Config, ["a.mp4", "b.mp4", "--checkpoint", "c"])
    assert cfg.predict.videos == ["a.mp4", "b.mp4"]


# ---- the one command-line builder and config.json -------------------------------------------------

def _changed_tree() -> Config:
    cfg = Config()
    cfg.data.data, cfg.data.img_size, cfg.data.flip = "/clips", 112, False
    cfg.model.arch, cfg.model.shift, cfg.model.temporal_pool, cfg.model.fused_shift = "resnet18", "online", True, False
    cfg.engine.deepspeed_config = "cpu_lamb"
    cfg.schedule.lr_steps, cfg.schedule.batch_size, cfg.schedule.lr = [3.0, 7.5], 16, 0.05
    cfg.guard.on_divergence, cfg.distributed.stop_signal, cfg.logging.progress = "rollback", "none", False
    return cfg


def test_to_argv_round_trips_the_training_tree():
    cfg = _changed_tree()
    argv = to_argv(TRAIN, Config, cfg)
    assert argv[:4] == ["--data", "/clips", "--img-size", "112"] and "--no-flip" in argv and "--no-progress" in argv
    back, _ = parse(TRAIN, Config, argv)
    assert tree_to_record(back) == tree_to_record(cfg)
    assert to_argv(TRAIN, Config, {"model.arch": "resnet18", "schedule.max_steps": 2}) == \
        ["--arch", "resnet18", "--max-steps", "2"]
    with pytest.raises(ConfigTreeError, match="has no option for eval.out"):
        to_argv(TRAIN, Config, {"eval.out": "x"})


def test_config_json_round_trips_and_reads_schema_1(tmp_path):
    cfg = _changed_tree()
    rec = {"schema_version": SCHEMA_VERSION, "config": tree_to_record(cfg)}
    (tmp_path / "config.json").write_text(json.dumps(rec))
    back, record, notes = load_run_config(tmp_path)
    assert tree_to_record(back) == tree_to_record(cfg) and notes == []
    assert "resume" not in rec["config"]["output"] and "local_rank" not in rec["config"]["distributed"]
    # --config: the record replaces the defaults, a flag given after it wins
    rerun, _ = parse(TRAIN, Config, ["--output-dir", "/other"], base=back)
    assert rerun.output.output_dir == "/other" and rerun.model.arch == "resnet18" and rerun.data.flip is False
    # schema 1 (tsm_ds <= 52ba896): flat flags, no_* switches, None = "the default"
    old = {"flags": {"arch": "resnet34", "no_flip": True, "no_progress": True, "no_fused_shift": False,
                     "index_cache_size": None, "dist_timeout": None, "deepspeed_config": "/x/cpu_fp32.json",
                     "lr_steps": [20, 40], "removed_flag": 1, "local_rank": 0, "split": {}}}
    t, notes = tree_from_record(old, source="old/config.json")
    assert (t.model.arch, t.data.flip, t.logging.progress, t.model.fused_shift) == ("resnet34", False, False, True)
    assert (t.data.index_cache_size, t.distributed.dist_timeout) == (8192, 300.0)
    assert t.engine.deepspeed_config == "/x/cpu_fp32.json" and t.schedule.lr_steps == [20, 40]
    assert notes == ["old/config.json: flag 'removed_flag' of the old run has no option any more; ignored"]
    with pytest.raises(ConfigTreeError, match="not a training run's config.json"):
        tree_from_record({"something": 1})
    with pytest.raises(ConfigTreeError, match="newer than this tsm_ds reads"):
        tree_from_record({"schema_version": SCHEMA_VERSION + 1, "config": {}})


@dataclasses.dataclass
class _Sec:
    speed: float = opt(1.0, "how fast")


@dataclasses.dataclass
class _Root:
    sec: _Sec = dataclasses.field(default_factory=_Sec)


def test_a_new_field_reaches_every_command_of_its_section():
    """What docs/contributing.md's "Adding an option" promises, on a tree built for the test."""
    Root = _Root
    cmd = Command("x", sections=("sec",))
    p = build_parser(cmd, Root)
    assert p.parse_args(["--speed", "2.5"]).sec__speed == 2.5
    assert to_argv(cmd, Root, {"sec.speed": 3.0}) == ["--speed", "3.0"]
