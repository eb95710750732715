"""The data-loss budget end to end (issue 36): a copy of the real clips with every second video
truncated to 2 kB stops within its first epoch with exit 7 and a message naming the fraction; with
the budget raised it completes, and result.json, the last lines of the log and ``tsm-ds eval``'s
metrics.json name how many files were lost and which."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.utils.exits import EXIT_DATA_LOSS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def half_truncated(shared_data, tmp_path_factory):
    """The real clips as class folders; every second video (sorted) cut to its first 2 kB."""
    out = tmp_path_factory.mktemp("half_truncated")
    videos = sorted(p for p in (shared_data / "videos").rglob("*") if p.is_file())
    cut = []
    for k, p in enumerate(videos):
        dst = out / p.relative_to(shared_data / "videos")
        dst.parent.mkdir(parents=True, exist_ok=True)
        data = p.read_bytes()
        if k % 2:
            data = data[:2048]
            cut.append(str(dst))
        dst.write_bytes(data)
    assert len(videos) == 17 and len(cut) == 8
    return out, set(cut)


def _train(data: Path, tmp_path: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}
    cmd = [sys.executable, "tsm_ds/train.py", "--deepspeed_config", "ds_configs/cpu_fp32.json", "--data", str(data),
           "--arch", "resnet18", "--num-segments", "2", "--img-size", "32", "--batch-size", "2",
           "--micro-batch-size", "2", "--lr", "0.01", "--num-workers", "1", "--no-progress", "--epochs", "1",
           "--seed", "1", "--val-fraction", "0.3", "--output-dir", str(tmp_path), "--run-name", name, *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_half_truncated_clips_stop_at_the_budget_and_are_named_within_it(half_truncated, tmp_path):
    data, cut = half_truncated
    stop = _train(data, tmp_path, "default")
    out = stop.stdout + stop.stderr
    assert stop.returncode == EXIT_DATA_LOSS, out[-4000:]
    res = json.loads((tmp_path / "default" / "result.json").read_text())
    assert res["status"] == "data_loss" and res["split"] == "train"
    n_train = res["data_lost"]["train"]["total"]
    assert res["step"] < -(-n_train // 2)   # within the first epoch (its steps: ceil(train clips / 2))
    lost = res["data_lost"]["train"]
    assert lost["count"] >= 1 and set(lost["files"]) <= cut and lost["fraction"] == lost["count"] / n_train
    assert f"({100 * lost['fraction']:.1f} %)" in out and "--max-bad-fraction 0.01" in out

    done = _train(data, tmp_path, "raised", "--max-bad-fraction", "0.6")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    res = json.loads((tmp_path / "raised" / "result.json").read_text())
    assert res["status"] == "completed_with_data_loss"
    train, val = res["data_lost"]["train"], res["data_lost"]["val"]
    # every truncated file is either a training file (met in the epoch or replaced) or a val file
    from tsm_ds.data.splits import resolve_split

    split = resolve_split(data=data, val_fraction=0.3)   # the run's split (a per-class hold-out)
    val_cut, train_cut = cut & {str(r.path) for r in split.val}, cut & {str(r.path) for r in split.train}
    assert train["total"] == len(split.train) and val["total"] == len(split.val)
    assert 1 <= train["count"] and set(train["files"]) <= train_cut
    assert set(val["files"]) == val_cut and val["count"] == len(val_cut) >= 1   # each val clip is scored once
    assert res["val_clips"] == len(split.val) - len(val_cut)
    last = [ln for ln in done.stdout.splitlines() if ln.strip()][-1]
    assert last.startswith("data lost: train: ") and "| val: " in last and "result.json names every file" in last

    ev_out = tmp_path / "eval"
    ev = subprocess.run([sys.executable, "-m", "tsm_ds.cli", "eval", "--checkpoint", str(tmp_path / "raised"),
                         "--data", str(data), "--split", "val", "--out", str(ev_out), "--no-plot"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
    assert ev.returncode == EXIT_DATA_LOSS, ev.stdout[-2000:] + ev.stderr[-2000:]   # the default 1 %
    assert "eval: " in ev.stderr and "--max-bad-fraction 0.01" in ev.stderr \
        and not ev_out.joinpath("metrics.json").exists()
    ev = subprocess.run([sys.executable, "-m", "tsm_ds.cli", "eval", "--checkpoint", str(tmp_path / "raised"),
                         "--data", str(data), "--split", "val", "--out", str(ev_out), "--no-plot",
                         "--max-bad-fraction", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-2000:]
    m = json.loads((ev_out / "metrics.json").read_text())
    assert m["data_lost"]["files"] == val["files"] and m["videos"] == res["val_clips"]
    assert "data lost: eval: " in ev.stdout
