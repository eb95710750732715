"""A run written by 52ba896 (tests/fixtures/run_52ba896.tar.xz) still evaluates and resumes.

The fixture is a 1-step TSM-ResNet-18 run (112 px, cpu_fp32, 5 classes of ../shared/data) whose
weights were replaced by zeros to keep it small (tests/fixtures/README.md). It pins the on-disk
format of an old run: ``config.json`` (52ba896's layout: ``flags``, ``split``, ``resolved_ds_config``,
...), the DeepSpeed checkpoint with our ``complete.json`` manifest and ``rank00000.pt``, and the
exports ``best_model.pt`` / ``last_model.pt``. A change of the run configuration must keep both
tests passing, or make the old run stop with a clear message (and change these tests to say so).

- ``tsm-ds eval --checkpoint RUN`` (and ``RUN/best_model.pt``) finds the validation clips through the
  run's ``config.json`` and reports top-1 on all 7 of them;
- ``python -m tsm_ds.train`` with the run's recorded flags (typed again, or read by ``--config
  RUN/config.json``), ``--resume auto --max-steps 2`` into the same output dir and run name resumes
  from optimizer step 1 (the manifest verifies, the data position is epoch 0 after one micro-batch)
  and ends at step 2.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tsm_ds.utils.node import free_port

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "run_52ba896.tar.xz"
RUN_NAME = "run_52ba896"

#: paths of the machine that wrote the fixture, as its config.json records them (data, recipe,
#: output dir; tensorboard's output path in resolved_ds_config): see :func:`old_run`
ORIGINAL_SHARED_DATA = "/work/shared/data"
ORIGINAL_SHARED_DATA_AS_TYPED = "../shared/data"   # flags.data: --data as typed, relative to /work/wt_golden
ORIGINAL_REPO = "/work/wt_golden"
ORIGINAL_OUTPUT_DIR = "/tmp/golden_w/fx"


def resume_argv(flags: dict) -> list[str]:
    """The training command line of the old run, from the ``flags`` of its config.json (52ba896's
    names; paths already rewritten by :func:`old_run`), to continue it in place: the same output dir
    and run name. The caller adds ``--resume auto --max-steps N``."""
    return ["--deepspeed_config", flags["deepspeed_config"], "--data", flags["data"],
            "--arch", flags["arch"], "--img-size", str(flags["img_size"]),
            "--num-segments", str(flags["num_segments"]), "--shift", flags["shift"],
            "--shift-div", str(flags["shift_div"]), "--shift-place", flags["shift_place"],
            "--dropout", str(flags["dropout"]),
            "--batch-size", str(flags["batch_size"]), "--micro-batch-size", str(flags["micro_batch_size"]),
            "--num-workers", str(flags["num_workers"]), "--seed", str(flags["seed"]),
            "--epochs", str(flags["epochs"]),
            "--output-dir", flags["output_dir"], "--run-name", flags["run_name"], "--no-progress"]


def _rewrite(obj, table: dict[str, str]):
    """``obj`` (JSON) with every string that is one of ``table``'s paths, or lies under one,
    moved to the new place."""
    if isinstance(obj, dict):
        return {k: _rewrite(v, table) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rewrite(v, table) for v in obj]
    if isinstance(obj, str):
        for old, new in table.items():
            if obj == old or obj.startswith(old + "/"):
                return new + obj[len(old):]
    return obj


@pytest.fixture
def old_run(shared_data, tmp_path) -> Path:
    """The fixture unpacked into ``tmp_path/runs/run_52ba896``, its config.json pointed at this machine.

    config.json records paths of the machine that wrote it: the data as resolved
    (``/work/shared/data/videos`` in ``flags.split.data``, what ``tsm-ds eval`` reads) and as typed
    (``flags.data`` = ``../shared/data/videos``, relative to the cwd of that run, /work/wt_golden: the
    record does not say so), the recipe (``/work/wt_golden/ds_configs/cpu_fp32.json``, a worktree that
    will not exist elsewhere) and the output dir (``/tmp/golden_w/fx``). They would break on another
    machine (or from another cwd), so the test always rewrites them: to the test's ``shared_data``,
    this checkout and ``tmp_path/runs``. Nothing else in the run (the checkpoint files, their
    manifest) is touched.
    """
    runs = tmp_path / "runs"
    runs.mkdir()
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(runs, filter="data")
    run = runs / RUN_NAME
    cfg_file = run / "config.json"
    cfg = json.loads(cfg_file.read_text())
    data = str(Path(shared_data).absolute())
    table = {ORIGINAL_SHARED_DATA: data, ORIGINAL_SHARED_DATA_AS_TYPED: data, ORIGINAL_REPO: str(REPO),
             ORIGINAL_OUTPUT_DIR: str(runs)}
    cfg = _rewrite(cfg, table)
    flags = cfg["flags"]
    assert (flags["data"], flags["split"]["data"]) == (data + "/videos",) * 2, flags
    assert Path(flags["deepspeed_config"]).is_file() and flags["output_dir"] == str(runs), flags
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return run


def _run(args: list[str], log: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSM_DS_")}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    p = subprocess.run([sys.executable, "-m", *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    log.write_text(p.stdout)
    return p


def test_the_fixture_is_the_run_of_52ba896(old_run):
    cfg = json.loads((old_run / "config.json").read_text())
    assert cfg["provenance"]["git_commit"].startswith("52ba896") and not cfg["provenance"]["git_dirty"]
    assert (old_run / "checkpoints" / "latest").read_text().strip() == "step00000001"
    meta = json.loads((old_run / "checkpoints" / "step00000001" / "complete.json").read_text())
    assert (meta["step"], meta["world_size"], meta["epoch"], meta["micro_in_epoch"]) == (1, 1, 0, 1)
    assert sorted(meta["files"]) == ["mp_rank_00_model_states.pt", "rank00000.pt"]


@pytest.mark.parametrize("which", ["run_dir", "best_model.pt"])
def test_old_run_evaluates(old_run, tmp_path, which):
    ckpt = old_run if which == "run_dir" else old_run / which
    p = _run(["tsm_ds.cli", "eval", "--checkpoint", str(ckpt), "--out", str(tmp_path / "eval"), "--no-plot"],
             tmp_path / "eval.log")
    assert p.returncode == 0, p.stdout[-4000:]
    m = re.search(r"^top-1 ([0-9.]+)%.*\((\d+) videos\)$", p.stdout, re.M)
    assert m, p.stdout[-4000:]
    assert f"read from {old_run / 'config.json'}" in p.stdout, p.stdout[-4000:]   # the data came from the record
    val_clips = json.loads((old_run / "config.json").read_text())["flags"]["split"]["val_clips"]
    assert int(m.group(2)) == val_clips == 7
    # the weights are zeros: every logit is equal, every true class ties for first, and ties count
    # in the video's favour (tsm_ds.inference.eval_report.true_class_rank): 100 %. A model that was not
    # loaded from the checkpoint (fresh random weights) would not score this.
    assert float(m.group(1)) == 100.0, p.stdout[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flags", "config"])
def test_old_run_resumes_from_step_1(old_run, tmp_path, how):
    """Resumed with its flags typed again, or with ``--config RUN/config.json`` (the schema-1 record
    read into the configuration tree, tsm_ds.config.record)."""
    cfg_before = (old_run / "config.json").read_text()
    flags = json.loads(cfg_before)["flags"]
    argv = resume_argv(flags) if how == "flags" else ["--config", str(old_run / "config.json")]
    p = _run(["tsm_ds.train", *argv, "--resume", "auto", "--max-steps", "2"], tmp_path / "train.log")
    assert p.returncode == 0, p.stdout[-4000:]
    ckpts = old_run / "checkpoints"
    assert (f"resumed from {ckpts / 'step00000001'}: epoch 0, 1 micro-batches into it, optimizer step 1"
            in p.stdout), p.stdout[-4000:]
    result = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")).split(" ", 1)[1])
    assert result["steps"] == 2 and result["val_clips"] == 7, result
    assert (ckpts / "latest").read_text().strip() == "step00000002"
    assert (ckpts / "step00000002" / "complete.json").is_file()
    assert not list(ckpts.glob("*.damaged"))        # the old checkpoint verified against its manifest
    # the first run's record is kept (today a resumed run writes config.resumed-<time>.json beside it)
    assert (old_run / "config.json").read_text() == cfg_before
