"""No module outside the training loop reads the trainer's attributes (AST, like the layering test).

The loop (tsm_ds/engine/loop/trainer.py) hands its parts and state to the modules around it as plain
arguments (tsm_ds.engine.loop.build.EngineParts, tsm_ds.engine.loop.state.Layout / RunState, hook calls with
values); a caller may build a Trainer and call ``setup()`` / ``fit()``, nothing else. The checker
finds, in every other module of the package, the names that hold a trainer (assigned from
``Trainer(...)``, or a parameter called ``trainer`` or annotated ``Trainer``) and flags any other
attribute read on them; it is shown failing on planted modules. The loop module stays short.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "tsm_ds"
LOOP = PKG / "engine" / "trainer.py"
PUBLIC = {"fit", "setup"}


def _trainer_names(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call):
            f = n.value.func
            if (isinstance(f, ast.Name) and f.id == "Trainer") or \
                    (isinstance(f, ast.Attribute) and f.attr == "Trainer"):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.arg):
            ann = ast.unparse(n.annotation) if n.annotation is not None else ""
            if n.arg == "trainer" or ann.split(".")[-1].strip("'\"") == "Trainer":
                names.add(n.arg)
    return names


def trainer_attribute_reads(path: Path) -> list[str]:
    """``file:line: name.attr`` for every read of a trainer attribute other than setup/fit."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _trainer_names(tree)
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in names \
                and n.attr not in PUBLIC:
            out.append(f"{path.name}:{n.lineno}: {n.value.id}.{n.attr}")
    # Trainer(...).attr without a name
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call) and n.attr not in PUBLIC:
            f = n.value.func
            if (isinstance(f, ast.Name) and f.id == "Trainer") or \
                    (isinstance(f, ast.Attribute) and f.attr == "Trainer"):
                out.append(f"{path.name}:{n.lineno}: Trainer(...).{n.attr}")
    return sorted(out, key=lambda v: int(v.split(":")[1]))


def test_no_module_outside_the_loop_reads_trainer_attributes():
    found = [v for p in sorted(PKG.rglob("*.py")) if p != LOOP for v in trainer_attribute_reads(p)]
    assert found == []


def test_the_checker_finds_planted_reads(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from tsm_ds.engine.loop.trainer import Trainer\n\n"
                       "def hook(trainer, step):\n    return trainer.global_step\n\n"
                       "def run(m, d, j, s):\n    tr = Trainer(m, d, None, j, s)\n    tr.fit()\n"
                       "    return tr.engine, Trainer(m, d, None, j, s).state\n\n"
                       "def typed(t: 'Trainer'):\n    return t.parts\n")
    assert trainer_attribute_reads(planted) == ["planted.py:4: trainer.global_step", "planted.py:9: tr.engine",
                                                "planted.py:9: Trainer(...).state", "planted.py:12: t.parts"]


def test_the_loop_is_within_the_linters_limits():
    """The loop's functions are held by the linter's per-function limits (complexity, line length:
    ruff.toml), not by a cap on the file's length."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: bash launch/setup.sh installs the test extra (ruff)")
    p = subprocess.run([ruff, "check", "--select", "C901,E501", str(LOOP)], capture_output=True, text=True,
                       cwd=LOOP.parents[2])
    assert p.returncode == 0, p.stdout + p.stderr
