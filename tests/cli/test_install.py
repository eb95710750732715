"""The package as a user gets it: a wheel, installed (not editable), run from outside the repository.

1. ``pip wheel --no-deps --no-build-isolation --no-index`` of a copy of the working tree (the copy
   keeps setuptools' ``build/`` and ``*.egg-info`` out of the checkout, and a stale ``build/lib``
   out of the wheel). ``--no-build-isolation``: an isolated build would download setuptools from
   the index; the venv's setuptools builds the wheel offline.
2. The wheel holds every module of ``tsm_ds/`` and the recipes as ``tsm_ds/ds_configs/*.json``.
3. ``pip install --no-deps --target TMP/site``; from a fresh folder (not the repository) with
   ``PYTHONPATH=TMP/site``: ``tsm_ds`` and ``resolve_recipe("cpu_fp32")`` come from TMP/site, and
   ``python -m tsm_ds.train --deepspeed_config cpu_fp32`` trains 2 steps (one process, the
   ``RANK``/``WORLD_SIZE``/``MASTER_*`` variables set by hand instead of the launcher) on the real
   clips when ``../shared/data/videos`` exists, else on the generated demo dataset.

Time on the 2-core CPU machine: about 15 s with DeepSpeed's CPU comm op already built in
``.venv/torch_extensions`` (the first build adds about a minute).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tsm_ds.utils.node import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# as tests/conftest.py SHARED_DATA (the shared_data fixture skips when absent; here we fall back)
SHARED_DATA = Path(os.environ.get("TSM_DS_SHARED_DATA", REPO.parent / "shared" / "data"))
TIMEOUT = 600
_NOT_SOURCES = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                      ".pytest_cache", "runs", "bench_out", "demo_data", "exported", "results")


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=TIMEOUT)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} (cwd {cwd}) exited {p.returncode}:\n{p.stdout[-5000:]}"
    return p


def _user_env(site: Path) -> dict[str, str]:
    """The environment of a user who installed the wheel into ``site``: nothing of the repository."""
    env = dict(os.environ, PYTHONPATH=str(site), DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if sys.prefix != sys.base_prefix:   # a venv: reuse its built ops (as launch/run_tests.sh)
        env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """Build the wheel from a copy of the working tree and install it into TMP/site."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCES)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(tmp / "wheel"), "."], cwd=src)
    (wheel,) = glob.glob(str(tmp / "wheel" / "*.whl"))
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(tmp / "site"), wheel],
         cwd=tmp)
    user_dir = tmp / "user"
    user_dir.mkdir()
    return {"tmp": tmp, "wheel": Path(wheel), "site": tmp / "site", "cwd": user_dir}


def test_wheel_holds_every_module_and_the_recipes(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert "tsm_ds/ds_configs/cpu_fp32.json" in names
    recipes = {p.name for p in (REPO / "ds_configs").glob("*.json")}
    assert {n.split("/")[-1] for n in names if n.startswith("tsm_ds/ds_configs/")} >= recipes
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "tsm_ds").rglob("*.py")
               if "__pycache__" not in p.parts}
    missing = sorted(sources - names)
    assert not missing, ("modules of tsm_ds/ that the wheel lacks (a folder without __init__.py is not a "
                         f"package for find_packages): {missing}")


def test_installed_package_and_recipes_come_from_site(installed):
    site = installed["site"].resolve()
    code = ("import tsm_ds, tsm_ds.engine.config.recipes as c\n"
            "print(tsm_ds.__file__)\n"
            "print(c.resolve_recipe('cpu_fp32').resolve())\n")
    out = _run([sys.executable, "-c", code], cwd=installed["cwd"], env=_user_env(site)).stdout.split()
    pkg, recipe = Path(out[-2]).resolve(), Path(out[-1])
    assert pkg.is_relative_to(site) and recipe.is_relative_to(site), out
    assert recipe == site / "tsm_ds" / "ds_configs" / "cpu_fp32.json"


def test_installed_train_two_steps_outside_the_repo(installed):
    site, tmp = installed["site"].resolve(), installed["tmp"]
    runs = tmp / "runs"
    env = _user_env(site)
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    videos = SHARED_DATA / "videos"
    data = ["--data", str(videos)] if videos.is_dir() else ["--demo-clips", "2"]
    cmd = [sys.executable, "-m", "tsm_ds.train", "--deepspeed_config", "cpu_fp32", "--max-steps", "2",
           "--epochs", "1", "--arch", "resnet18", "--img-size", "32", "--num-segments", "2", "--batch-size", "2",
           "--micro-batch-size", "2", "--num-workers", "0", "--output-dir", str(runs), "--no-progress",
           "--index-cache", str(tmp / "index_cache")] + data
    out = _run(cmd, cwd=installed["cwd"], env=env).stdout
    (tmp / "train.log").write_text(out)

    (cfg_file,) = runs.glob("*/config.json")
    cfg = json.loads(cfg_file.read_text())
    recipe = Path(cfg["run"]["deepspeed_config"])
    assert recipe.resolve() == site / "tsm_ds" / "ds_configs" / "cpu_fp32.json", cfg["run"]
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT ")).split(" ", 1)[1])
    assert result["steps"] == 2, result
    # --index-cache (the flag behind TSM_DS_INDEX_CACHE) reached the loader: one index file per clip read
    assert len(list((tmp / "index_cache").glob("*.npz"))) >= 1
    assert json.loads((cfg_file.parent / "result.json").read_text())["status"] == "completed"
    assert str(recipe) in out, ("the training log does not name the engine JSON it used "
                                f"({recipe}); tsm_ds/cli/train.py should log it:\n{out[-3000:]}")
