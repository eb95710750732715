"""The ``tsm-ds`` dispatcher: ``--help`` lists every command with its one line, ``tsm-ds train``
runs the training entry point in this process, every command's ``--help`` works."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds import cli
from tsm_ds.cli import COMMANDS, main


def _tsm_ds() -> list[str]:
    """The console script of this venv, else the same dispatcher as a module."""
    script = Path(sys.executable).parent / "tsm-ds"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tsm_ds.cli"]


def test_help_lists_every_command_with_its_line(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "usage: tsm-ds <command> [options]"
    listed = [ln.split()[0] for ln in lines[lines.index("commands:") + 1:] if ln.startswith("  ")]
    assert listed == list(COMMANDS) and listed[0] == "train"
    for name, (_, help_) in COMMANDS.items():
        assert f"  {name.ljust(max(map(len, COMMANDS)))}  {help_}" in lines
    assert "packs (.jpack, the default)" in COMMANDS["prepare"][1]
    assert "large-batch" in COMMANDS["bench"][1]


def test_the_help_lines_say_what_the_commands_default_to():
    """The one-line claims that can be checked against the parsers: prepare's default mode is
    packed; bench lists every bench; train takes training's flags."""
    from tsm_ds.cli import prepare, train
    from tsm_ds.cli.bench import BENCHES

    assert prepare.build_parser().parse_args(["src", "out"]).prepare__mode == "packed"
    assert all(name in COMMANDS["bench"][1] for name in BENCHES)
    assert COMMANDS["train"][0] == "tsm_ds.cli.train"
    assert "--deepspeed_config" in train.build_parser()._option_string_actions


@pytest.mark.parametrize("name", [n for n in COMMANDS if n not in ("train", "bench")])
def test_every_command_has_a_parser_with_help(name):
    import importlib

    parser = importlib.import_module(COMMANDS[name][0]).build_parser()
    assert parser.format_help().startswith("usage: ")


def test_train_runs_the_entry_point_in_process(monkeypatch):
    """``tsm-ds train ARGS`` calls :func:`tsm_ds.cli.train.main` with ARGS in this process and
    returns its status."""
    import tsm_ds.cli.train as train_cli

    seen = []
    monkeypatch.setattr(train_cli, "main", lambda argv: seen.append(argv) or 7)
    assert main(["train", "--data", "d", "--epochs", "2"]) == 7
    assert seen == [["--data", "d", "--epochs", "2"]]


def test_unknown_command_exits_2(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "tsm-ds: unknown command 'frobnicate'" in err and "  train " in err


def test_train_help_exits_0_and_a_bad_recipe_exits_2(tmp_path):
    p = subprocess.run([*_tsm_ds(), "train", "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "--deepspeed_config" in p.stdout and "--max-bad-fraction" in p.stdout
    p = subprocess.run([*_tsm_ds(), "train", "--deepspeed_config", "no_such_recipe", "--arch", "resnet18"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2
    assert "no_such_recipe: engine JSON not found" in p.stdout + p.stderr
    assert not list(tmp_path.iterdir())                # stopped before writing a run


def test_module_docstring_names_the_train_command():
    assert "``tsm-ds train``" in cli.__doc__
