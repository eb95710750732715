"""Every module of the package imports (an import that only a slow training test would reach, e.g.
after a module moved, fails here in seconds)."""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import tsm_ds

MODULES = sorted(m.name for m in pkgutil.walk_packages(tsm_ds.__path__, "tsm_ds.") if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)
