"""The linter (ruff, configured in ruff.toml: line length 120, unused imports, import order, a
complexity limit per function) passes on the whole tree."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: bash launch/setup.sh installs the test extra (ruff, pinned in setup.py)")
    p = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
