"""End to end: the deepspeed launcher, 2 ranks, the real model on the real clips, smallest size.

Run 1 (``tsm_ds/train.py``): 2 optimizer steps, a checkpoint per step. Run 2 (``--module
tsm_ds.train``, ``--resume auto``): continues to step 4 from run 1's latest checkpoint. Then the
TensorBoard event files are read back with tensorboard's EventAccumulator, the resolved config
and the exported best model are checked.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tsm_ds.utils.node import free_port

REPO = Path(__file__).resolve().parents[2]


def _launch(entry: list[str], args: list[str], log: Path) -> str:
    deepspeed = Path(sys.executable).with_name("deepspeed")
    port = free_port()
    cmd = [str(deepspeed), "--num_gpus", "2", "--master_port", str(port)] + entry + args
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("OMP_NUM_THREADS", None)  # train.py divides the cores between the ranks
    if not torch.cuda.is_available():
        env.pop("DS_ACCELERATOR", None)  # train.py must set it itself (and say so)
    p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    log.write_text(p.stdout)
    assert p.returncode == 0, p.stdout[-5000:]
    # DeepSpeed's CPU all-reduce leaves a 69 MB /dev/shm buffer per rank; each rank removes its own
    leftovers = sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    assert not leftovers, f"shared-memory buffers left in RAM after the run: {leftovers}"
    return p.stdout


def _result(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if "RESULT " in ln]
    assert len(lines) == 1, out[-3000:]
    return json.loads(lines[0].split("RESULT ", 1)[1])


@pytest.mark.slow
def test_launcher_two_ranks_checkpoint_resume_tensorboard(shared_data, tmp_path):
    common = ["--deepspeed_config", "ds_configs/cpu_fp32.json", "--data", str(shared_data / "videos"),
              "--arch", "resnet18", "--num-segments", "2", "--img-size", "32", "--batch-size", "2",
              "--micro-batch-size", "1", "--lr", "0.01", "--lr-steps", "10", "--num-workers", "0",
              "--output-dir", str(tmp_path), "--run-name", "e2e", "--save-every-steps", "1", "--no-progress",
              "--epochs", "2", "--seed", "3"]
    out1 = _launch(["tsm_ds/train.py"], common + ["--max-steps", "2"], tmp_path / "run1.log")
    r1 = _result(out1)
    assert r1["steps"] == 2 and r1["val_clips"] == 7  # the source_group split: 7 val clips, each once
    run = tmp_path / "e2e"
    ck = run / "checkpoints"
    assert (ck / "latest").read_text() == "step00000002"
    assert (ck / "step00000002" / "complete.json").is_file()
    assert {p.name for p in (ck / "step00000002").glob("rank*.pt")} == {"rank00000.pt", "rank00001.pt"}
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["world_size"] == 2 and cfg["resolved_ds_config"]["train_batch_size"] == 2
    assert cfg["config"]["model"]["arch"] == "resnet18" and cfg["engine_json"]["optimizer"]["params"]["lr"] == "auto"
    assert cfg["resolved_ds_config"]["optimizer"]["params"]["lr"] == 0.01
    groups = {g["name"]: g["lr"] for g in cfg["param_groups"]}   # from scratch: the head at the backbone's lr
    assert groups["fc_weight"] == pytest.approx(0.01) and groups["fc_bias"] == pytest.approx(0.02)
    if not torch.cuda.is_available():
        assert "no CUDA device: set DS_ACCELERATOR=cpu" in out1
    m = re.search(r"(\d+) cores / 2 local ranks: torch threads (\d+)", out1)  # each rank its own cores
    assert m and int(m.group(2)) == max(1, int(m.group(1)) // 2)

    out2 = _launch(["--module", "tsm_ds.train"], common + ["--max-steps", "4", "--resume", "auto"],
                   tmp_path / "run2.log")
    assert re.search(r"resumed from .*step00000002: epoch \d+, \d+ micro-batches into it, optimizer step 2", out2)
    r2 = _result(out2)
    assert r2["steps"] == 4
    assert (ck / "latest").read_text() == "step00000004"
    tags = sorted(p.name for p in ck.iterdir() if p.is_dir())
    # keep-last 2 plus the best (an epoch-end tag); step 1 is gone
    assert "step00000004" in tags and "step00000003" in tags and "step00000001" not in tags

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(run / "tensorboard" / "tsm_ds"))
    ea.Reload()
    tags_tb = set(ea.Tags()["scalars"])
    for t in ("train/loss", "train/top1", "train/top5", "perf/clips_per_s", "time/data_wait_s", "time/compute_s",
              "time/comm_s", "train/skipped_steps", "data/bad_videos", "lr/fc_weight", "lr/fc_bias", "lr/weight",
              "val/top1", "val/top5"):
        assert t in tags_tb, f"{t} missing from {sorted(tags_tb)}"
    assert sorted({e.step for e in ea.Scalars("train/loss")}) == [1, 2, 3, 4]
    lr_w = {e.step: e.value for e in ea.Scalars("lr/weight")}
    lr_fc = {e.step: e.value for e in ea.Scalars("lr/fc_bias")}
    assert lr_w[4] == pytest.approx(0.01) and lr_fc[4] == pytest.approx(0.02)   # fc bias x2 from scratch
    assert all(e.value > 0 for e in ea.Scalars("time/compute_s"))

    best = torch.load(run / "best_model.pt", weights_only=False)
    assert len(best["class_names"]) == 5 and best["model_config"]["arch"] == "resnet18"
    from tsm_ds.models import build_model
    m = build_model(**best["model_config"])
    m.load_state_dict(best["state_dict"])  # strict: the export rebuilds the model exactly
