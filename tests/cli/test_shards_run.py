"""End to end from shards (issue 30): the real clips prepared with ``--shards``; two ranks through
the deepspeed launcher train from the local shard folder and from moto's S3 server on 127.0.0.1,
and ``tsm-ds eval`` of the local-shard run scores the same from the shards as from the packs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_train_launcher import _launch, _result   # noqa: E402  (tests/cli on sys.path)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_ranks_from_local_and_s3_shards_eval_equals_packs(shared_data, tmp_path, moto_s3):
    pytest.importorskip("litdata")
    from tsm_ds.cli import prepare as prepare_cli

    packs = tmp_path / "packs"
    assert prepare_cli.main([str(shared_data / "videos"), str(packs), "--short-side", "64", "--workers", "2",
                             "--shards", "2"]) == 0
    common = ["--deepspeed_config", "ds_configs/cpu_fp32.json", "--arch", "resnet18", "--num-segments", "2",
              "--img-size", "32", "--batch-size", "4", "--micro-batch-size", "2", "--lr", "0.01",
              "--num-workers", "1", "--no-progress", "--epochs", "1", "--seed", "5", "--max-steps", "2",
              "--output-dir", str(tmp_path)]
    local = _result(_launch(["tsm_ds/train.py"], common + ["--data", str(packs / "shards"), "--run-name", "local"],
                            tmp_path / "local.log"))
    assert local["steps"] == 2 and local["val_clips"] > 0

    remote = _result(_launch(["tsm_ds/train.py"], common + [
        "--data", moto_s3(packs / "shards", "shards"), "--run-name", "s3", "--shard-cache", str(tmp_path / "cache"),
        "--shard-cache-mb", "64"], tmp_path / "s3.log"))
    assert remote["steps"] == 2
    assert remote["val_top1"] == local["val_top1"] and remote["val_clips"] == local["val_clips"]
    assert sum(p.stat().st_size for p in (tmp_path / "cache").rglob("chunk-*.bin")) <= 64 * 2**20

    py = [sys.executable, "-m", "tsm_ds.cli"]
    scores = []
    for data in (packs, packs / "shards"):
        out = tmp_path / f"eval_{data.name}"
        ev = subprocess.run(py + ["eval", "--checkpoint", str(tmp_path / "local"), "--data", str(data),
                                  "--out", str(out), "--no-plot"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
        assert ev.returncode == 0, ev.stderr[-3000:]
        m = json.loads((out / "metrics.json").read_text())
        scores.append((m["videos"], m["top1"], m["top5"]))
    assert scores[0] == scores[1] and scores[0][0] == 17
