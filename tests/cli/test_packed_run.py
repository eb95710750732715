"""End to end from the packed format: prepare the real clips as packs, a two-rank run through the
deepspeed launcher with batched decoding (``--decode-device cpu``) and a DataLoader worker,
resumed bit-exactly; ``tsm-ds eval`` and ``tsm-ds predict`` read the packs too.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train_launcher import _launch, _result  # noqa: E402  (tests/cli on sys.path)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def packs(shared_data, tmp_path_factory):
    from tsm_ds.cli import prepare as prepare_cli

    out = tmp_path_factory.mktemp("packs")
    assert prepare_cli.main([str(shared_data / "videos"), str(out), "--short-side", "64",
                             "--workers", "2"]) == 0
    return out


def _weights(run: Path) -> dict:
    return torch.load(run / "last_model.pt", weights_only=False)["state_dict"]


@pytest.mark.slow
def test_two_ranks_from_packs_resume_bit_exact_then_eval_and_predict(packs, tmp_path):
    files = sorted(packs.rglob("*.jpack"))
    assert len(files) == 17 and not list(packs.rglob("*.jpg"))   # one file per video
    common = ["--deepspeed_config", "ds_configs/cpu_fp32.json", "--data", str(packs),
              "--arch", "resnet18", "--num-segments", "2", "--img-size", "32", "--batch-size", "4",
              "--micro-batch-size", "2", "--lr", "0.01", "--num-workers", "1", "--decode-device", "cpu",
              "--save-every-steps", "2", "--no-progress", "--epochs", "3", "--seed", "5",
              "--output-dir", str(tmp_path)]
    whole = _result(_launch(["tsm_ds/train.py"], common + ["--run-name", "whole", "--max-steps", "5"],
                            tmp_path / "whole.log"))
    assert whole["steps"] == 5
    _launch(["tsm_ds/train.py"], common + ["--run-name", "cut", "--max-steps", "2"], tmp_path / "cut1.log")
    out = _launch(["tsm_ds/train.py"], common + ["--run-name", "cut", "--max-steps", "5", "--resume", "auto"],
                  tmp_path / "cut2.log")
    assert "resumed from" in out and _result(out)["steps"] == 5
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    cfg = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert cfg["config"]["data"]["decode_device"] == "cpu"

    py = [sys.executable, "-m", "tsm_ds.cli"]
    ev = subprocess.run(py + ["eval", "--checkpoint", str(tmp_path / "whole"), "--data", str(packs),
                              "--out", str(tmp_path / "eval"), "--decode-device", "cpu", "--no-plot"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["videos"] == 17 and whole["val_clips"] > 0   # --data without a split: every video
    pr = subprocess.run(py + ["predict", "--checkpoint", str(tmp_path / "whole"), str(files[0])],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert pr.returncode == 0 and files[0].name in pr.stdout, pr.stderr[-3000:]
