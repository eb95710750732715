"""End to end from shards (issue 30): the real clips prepared with ``--shards``; two ranks through
the deepspeed launcher train from the local shard folder and from moto's S3 server on 127.0.0.1,
and ``tsm-ds eval`` of the local-shard run scores the same from the shards as from the packs, and
at world 2 from the S3 server; nothing is replaced or left out anywhere (issue 36)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_launcher import _launch, _result  # noqa: E402  (tests/cli on sys.path)

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
    assert local["steps"] == 2 and local["val_clips"] == 5   # the hold-out: 1 val clip per class, each scored
    # nothing replaced at 2 ranks (before issue 36, half the samples were: litdata's 1/N view)
    assert {k: v["count"] for k, v in local["data_lost"].items()} == {"train": 0, "val": 0}

    url = moto_s3(packs / "shards", "shards")
    remote = _result(_launch(["tsm_ds/train.py"], common + [
        "--data", url, "--run-name", "s3", "--shard-cache", str(tmp_path / "cache"),
        "--shard-cache-mb", "64"], tmp_path / "s3.log"))
    assert remote["steps"] == 2
    assert {k: v["count"] for k, v in remote["data_lost"].items()} == {"train": 0, "val": 0}
    assert remote["val_top1"] == local["val_top1"] and remote["val_clips"] == local["val_clips"]
    assert sum(p.stat().st_size for p in (tmp_path / "cache").rglob("chunk-*.bin")) <= 64 * 2**20

    py = [sys.executable, "-m", "tsm_ds.cli"]
    scores = []
    for data in (packs, packs / "shards"):
        out = tmp_path / f"eval_{data.name}"
        ev = subprocess.run(py + ["eval", "--checkpoint", str(tmp_path / "local"), "--data", str(data),
                                  "--out", str(out), "--no-plot", "--max-bad-fraction", "0"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
        assert ev.returncode == 0, ev.stderr[-3000:]
        m = json.loads((out / "metrics.json").read_text())
        scores.append((m["videos"], m["top1"], m["top5"], m["data_lost"]["count"]))
    # the same evaluation at world 2 through the launcher, from the S3 server: every video once, none lost
    out = _launch(["--module", "tsm_ds.cli.eval"], ["--checkpoint", str(tmp_path / "local"), "--data", url,
                                                    "--out", str(tmp_path / "eval_s3_w2"), "--no-plot",
                                                    "--max-bad-fraction", "0", "--shard-cache",
                                                    str(tmp_path / "cache2")], tmp_path / "eval_s3_w2.log")
    assert "world size 2" in out
    m = json.loads((tmp_path / "eval_s3_w2" / "metrics.json").read_text())
    scores.append((m["videos"], m["top1"], m["top5"], m["data_lost"]["count"]))
    assert scores[0] == scores[1] == scores[2] and scores[0][0] == 17 and scores[0][3] == 0
