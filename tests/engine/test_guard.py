"""Run guards: the divergence guard's rules, a diverged run stops (or rolls back), nothing
non-finite is written, damaged checkpoints are skipped on resume, a full disk stops the run."""
from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tsm_ds.engine.guards.divergence import DivergenceError, DivergenceGuard, GuardSettings, lr_warmup_steps

# ------------------------------------------------------------------ the rules (no engine)


def test_non_finite_loss_and_gradient_norm_fire_before_the_update():
    g = DivergenceGuard(GuardSettings(), num_classes=5)
    assert g.before_update(1.6, 3.0) is None
    assert g.before_update(float("nan"), 3.0) == "loss is nan"
    assert g.before_update(1.5, float("inf")) == "gradient norm is inf"
    assert g.before_update(float("inf")) == "loss is inf"
    assert list(g.history) == [1.6]          # diverged steps never enter the history


def test_spike_threshold_is_factor_times_max_of_median_and_chance():
    g = DivergenceGuard(GuardSettings(factor=10, window=3), num_classes=4)
    chance = math.log(4)
    assert g.threshold() == pytest.approx(10 * chance)          # no history: the chance floor
    for loss in (0.01, 0.02, 0.03):                              # a converged run
        assert g.before_update(loss) is None
    assert g.threshold() == pytest.approx(10 * chance)          # median 0.02 < ln 4: floor holds
    assert g.before_update(5.0) is None                          # a noisy batch, 250x the median
    assert g.before_update(13.0) is None
    assert list(g.history) == [0.03, 5.0, 13.0]                  # window 3
    assert g.threshold() == pytest.approx(50.0)                  # median 5 > ln 4
    reason = g.before_update(50.5)
    assert reason.startswith("loss 50.5 > 10 x max(running median 5") and "--divergence-factor" in reason
    assert DivergenceGuard(GuardSettings(factor=0), 4).before_update(1e30) is None   # rule off


def test_a_run_of_skipped_updates_fires_and_a_recovery_resets_it():
    g = DivergenceGuard(GuardSettings(max_skipped=3), num_classes=2)
    assert [g.after_update(k) for k in (0, 1, 2)] == [None, None, None]     # 2 skipped in a row
    assert g.after_update(2) is None and g.skipped_run == 0                 # a real update: reset
    assert [g.after_update(k) for k in (3, 4)] == [None, None]
    assert "3 optimizer steps in a row were skipped" in g.after_update(5)


def test_guard_state_round_trip_and_settings_errors():
    g = DivergenceGuard(GuardSettings(window=4), 10)
    for v in (2.0, 2.2, 2.1):
        g.before_update(v)
    g.after_update(7)
    h = DivergenceGuard(GuardSettings(window=4), 10)
    h.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert list(h.history) == [2.0, 2.2, 2.1] and h.threshold() == g.threshold()
    assert h.after_update(8) is None and h.skipped_run == 1
    with pytest.raises(ValueError, match="window >= 1"):
        GuardSettings(window=0)


def _trace_batch128() -> list[float]:
    """Study run (b) at batch 128 (README, large batch), shaped: 5 warm-up steps 1.4 -> 6.6, then 30
    steps climbing to ~33.5 with noise, then 32-35 to the end (50 steps); K = 4 (ln 4 = 1.39)."""
    rng = random.Random(0)
    warm = [1.4 + (6.6 - 1.4) * i / 4 for i in range(5)]
    climb = [6.6 + (33.5 - 6.6) * i / 30 + rng.uniform(-0.5, 0.5) for i in range(1, 31)]
    return warm + climb + [33.5 + rng.uniform(-1.5, 1.5) for _ in range(15)]


def _trace_batch8_lr003() -> list[float]:
    """lr 0.03 at batch 8 (800 steps, 80 warm-up steps), shaped: the loss drifts from 1.4 to ~14 (10x
    chance) over 400 steps with noise (+-0.25) and stays there."""
    rng = random.Random(1)
    return [1.4 + 12.6 * min(s, 400) / 400 + rng.uniform(-0.25, 0.25) for s in range(800)]


def _trace_learning() -> list[float]:
    """A healthy run: 1.4 -> 0.3 over 800 steps with noise (+-30 %) and a few spikes to 3x chance."""
    rng = random.Random(2)
    out = [(0.3 + 1.1 * math.exp(-s / 150)) * rng.uniform(0.7, 1.3) for s in range(800)]
    for s in (3, 40, 41, 300):
        out[s] = 3.0 * math.log(4) + 0.5
    return out


def _replay(trace: list[float], warmup: int, settings: GuardSettings | None = None) -> tuple[int | None, str | None]:
    """The first step (1-based) the guard stops at, with its reason (None, None: never)."""
    g = DivergenceGuard(settings or GuardSettings(), num_classes=4, warmup_steps=warmup)
    for step, loss in enumerate(trace, 1):
        reason = g.before_update(loss, 20.0, step=step)
        if reason:
            return step, reason
    return None, None


def test_stuck_rule_stops_the_batch_128_climb_that_the_median_rule_let_through():
    trace = _trace_batch128()
    assert max(trace) < 36 and min(trace[35:]) > 32
    # the median rule alone (rule 5 off) never fires: the median climbs with the loss
    assert _replay(trace, 5, GuardSettings(stuck_factor=0)) == (None, None)
    step, reason = _replay(trace, 5)
    floor = 3 * math.log(4)
    # every step after the 5 warm-up steps is above 3 ln 4: steps 6..25 are the 20 in a row
    assert all(v > floor for v in trace[5:25]) and step == 25
    assert reason.startswith("stuck above chance: loss above 3 x chance ln K 1.386 = 4.159 for 20 optimizer "
                             "steps in a row (steps 6-25, after the 5 warm-up steps), now ")
    assert "--stuck-factor" in reason


def test_stuck_rule_stops_the_slow_drift_to_10x_chance():
    trace = _trace_batch8_lr003()
    floor = 3 * math.log(4)
    first = next(i for i in range(len(trace)) if all(v > floor for v in trace[i:i + 20])) + 1   # 1-based
    assert first > 80                               # it crosses the floor after the warm-up
    step, reason = _replay(trace, 80)
    assert step == first + 19 and f"(steps {first}-{step}, after the 80 warm-up steps)" in reason
    assert _replay(trace, 80, GuardSettings(stuck_factor=0)) == (None, None)   # what the old guard did


def test_stuck_rule_lets_a_learning_run_and_the_warm_up_through():
    assert _replay(_trace_learning(), 0) == (None, None)
    assert _replay(_trace_learning(), 80) == (None, None)
    climb_then_recover = [10.0] * 30 + [1.0] * 100       # above the floor only during 30 warm-up steps
    assert _replay(climb_then_recover, 30) == (None, None)
    assert _replay(climb_then_recover, 10)[0] == 30       # counted from step 11: 20 in a row at step 30
    one_dip = [10.0] * 19 + [1.0] + [10.0] * 19           # a step below the floor starts the count again
    assert _replay(one_dip, 0) == (None, None)


def test_stuck_rule_state_resumes_and_settings_name_the_flag():
    g = DivergenceGuard(GuardSettings(stuck_steps=5), 4)
    for v in (9.0, 9.0, 9.0):
        assert g.before_update(v) is None
    h = DivergenceGuard(GuardSettings(stuck_steps=5), 4)
    h.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert h.stuck_run == 3 and h.before_update(9.0) is None
    assert h.before_update(9.0).startswith("stuck above chance")          # 5 in a row across the resume
    old = {k: v for k, v in g.state_dict().items() if k != "stuck_run"}   # a checkpoint from before rule 5
    h.load_state_dict(old)
    assert h.stuck_run == 0
    with pytest.raises(ValueError, match="--stuck-factor"):
        GuardSettings(stuck_factor=-1)
    with pytest.raises(ValueError, match="--stuck-steps"):
        GuardSettings(stuck_steps=0)


def test_lr_warmup_steps_of_a_resolved_recipe():
    assert lr_warmup_steps({}, {"lr_schedule": {"type": "cosine", "warmup_steps": 5}}) == 5
    assert lr_warmup_steps({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 7}}}, {}) == 7
    assert lr_warmup_steps({}, {}) == 0


def test_report_names_step_lr_loss_norm_checkpoint_and_fix():
    e = DivergenceError("loss is nan", step=7, loss=float("nan"), grad_norm=None, lrs={"weight": 0.1, "fc_weight": 0.5},
                        last_good="runs/x/checkpoints/step00000006")
    text = str(e)
    assert "optimizer step 7: loss is nan" in text and "weight 0.1, fc_weight 0.5" in text
    assert "gradient norm not seen" in text and "runs/x/checkpoints/step00000006" in text
    assert "update of step 7 was not applied" in text and "--on-divergence rollback" in text


# ------------------------------------------------------------------ through the real trainer

SMALL = ["--arch", "resnet18", "--img-size", "32", "--num-segments", "2", "--batch-size", "2",
         "--micro-batch-size", "2", "--num-workers", "0", "--no-progress", "--epochs", "1"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(args: list[str], out: Path, *, data: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m tsm_ds.train`` as one process (a world of one) on the real clips."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), OMP_NUM_THREADS="2")
    cmd = [sys.executable, "-m", "tsm_ds.train", "--data", str(data), "--output-dir", str(out),
           "--run-name", "r", *SMALL, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _all_saved_tensors_finite(run: Path) -> list[str]:
    """Every tensor in every .pt file under ``run``: the names of files holding a non-finite one."""
    bad = []

    def walk(obj) -> bool:
        if torch.is_tensor(obj):
            return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
        if isinstance(obj, dict):
            return all(walk(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return all(walk(v) for v in obj)
        return True

    for f in run.rglob("*.pt"):
        if not walk(torch.load(f, map_location="cpu", weights_only=False)):
            bad.append(str(f.relative_to(run)))
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["cpu_fp32", "cpu_bf16"])
def test_nan_at_step_k_stops_before_the_update_and_saves_nothing_broken(recipe, shared_data, tmp_path):
    p = _train(["--deepspeed_config", recipe, "--inject-nan-at-step", "3", "--save-every-steps", "1",
                "--max-steps", "4"], tmp_path, data=shared_data / "videos")
    out = p.stdout + p.stderr
    assert p.returncode == 3, out[-3000:]
    assert "training diverged at optimizer step 3: loss is nan" in out
    assert re.search(r"last good checkpoint: \S+/checkpoints/step00000002 \(the update of step 3 was not applied",
                     out), out[-2000:]
    run = tmp_path / "r"
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir()) == ["step00000001", "step00000002"]
    assert not (run / "last_model.pt").exists() and not (run / "best_model.pt").exists()
    assert _all_saved_tensors_finite(run) == []


@pytest.mark.slow
def test_lr_1e30_exits_non_zero_with_no_non_finite_file(shared_data, tmp_path):
    p = _train(["--deepspeed_config", "cpu_fp32", "--lr", "1e30"], tmp_path, data=shared_data / "videos")
    out = p.stdout + p.stderr
    assert p.returncode == 3, out[-3000:]
    assert "training diverged at optimizer step 2" in out and "lr weight 1e+30" in out
    assert "RESULT" not in out and "val top-1" not in out
    assert _all_saved_tensors_finite(tmp_path / "r") == []
    assert not (tmp_path / "r" / "last_model.pt").exists()


@pytest.mark.slow
def test_rollback_reloads_the_last_good_checkpoint_with_a_lower_lr_and_finishes(shared_data, tmp_path):
    p = _train(["--deepspeed_config", "cpu_fp32", "--inject-nan-at-step", "3", "--save-every-steps", "1",
                "--max-steps", "4", "--lr", "0.01", "--on-divergence", "rollback", "--rollback-lr-factor", "0.25"],
               tmp_path, data=shared_data / "videos")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "rollback 1 of 3: reloading" in out and "step00000002" in out
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["steps"] == 4 and result["rollbacks"] == 1 and result["lr_scale"] == 0.25
    # the steps after the rollback ran at lr x 0.25 (base lr 0.01, weight group lr_mult 1)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ev = EventAccumulator(str(tmp_path / "r" / "tensorboard" / "tsm_ds"))
    ev.Reload()
    lrs = {e.step: e.value for e in ev.Scalars("lr/weight")}
    assert lrs[2] == pytest.approx(0.01) and lrs[3] == pytest.approx(0.0025) and lrs[4] == pytest.approx(0.0025)
    assert _all_saved_tensors_finite(tmp_path / "r") == []
    ck = torch.load(tmp_path / "r" / "last_model.pt", weights_only=True)
    assert ck["step"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_resume_auto_skips_a_damaged_newest_checkpoint(damage, shared_data, tmp_path):
    p = _train(["--deepspeed_config", "cpu_fp32", "--save-every-steps", "1", "--max-steps", "2"], tmp_path,
               data=shared_data / "videos")
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    ck = tmp_path / "r" / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step00000002"
    f = ck / "step00000002" / "mp_rank_00_model_states.pt"
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        f.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    p = _train(["--deepspeed_config", "cpu_fp32", "--save-every-steps", "1", "--max-steps", "3",
                "--resume", "auto"], tmp_path, data=shared_data / "videos")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert re.search(r"checkpoint \S+step00000002 is damaged \(mp_rank_00_model_states.pt "
                     + ("has \\d+ bytes, the manifest says \\d+" if damage == "truncate"
                        else "does not match its CRC-32"),
                     out), out[-2000:]
    assert re.search(r"resumed from \S+step00000001: .* optimizer step 1", out)
    assert (ck / "latest").read_text().strip() == "step00000003"
    # the damaged checkpoint is kept aside for inspection, out of the rotation of the last N
    # (steps 2 and 3 were trained again from step 1 and saved; keep_last 2 pruned step 1)
    assert sorted(d.name for d in ck.iterdir() if d.is_dir()) == ["step00000002", "step00000002.damaged",
                                                                  "step00000003"]


@pytest.mark.slow
def test_disk_full_during_a_save_keeps_the_previous_checkpoint_and_stops(shared_data, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    # resnet18: ~45 MB of weights + ~45 MB of SGD momentum per checkpoint: the first one fits
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=150m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root")
    try:
        p = _train(["--deepspeed_config", "cpu_fp32", "--save-every-steps", "1", "--max-steps", "3"], mnt,
                   data=shared_data / "videos")
        out = p.stdout + p.stderr
        assert p.returncode == 4, out[-3000:]
        assert re.search(r"saving checkpoint \S+step00000002 failed: .* \(\d+ MB free on that filesystem, a checkpoint "
                         r"takes \d+ MB: the disk is full\)", out), out[-2000:]
        assert "the previous checkpoint" in out and "step00000001 is intact" in out
        ck = mnt / "r" / "checkpoints"
        assert (ck / "latest").read_text().strip() == "step00000001"
        assert sorted(d.name for d in ck.iterdir() if d.is_dir()) == ["step00000001"]
        from tsm_ds.engine.checkpoint.manager import CheckpointManager
        assert CheckpointManager(ck).verify("step00000001") is None
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.slow
def test_defaults_do_not_fire_on_the_demo_first_steps(tmp_path):
    """The demo recipe (AdamW 3e-4, from scratch, 64 px, 8 segments) on its own data: the default
    guard thresholds let its first 12 steps through, and the losses stay far below them."""
    from tsm_ds.data.synthetic import make_demo_dataset

    info = make_demo_dataset(tmp_path / "demo", seed=0, train_per_class=6, val_per_class=1)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), OMP_NUM_THREADS="2")
    cmd = [sys.executable, "-m", "tsm_ds.train", "--deepspeed_config", "cpu_demo_adamw",
           "--train-list", info["train_list"], "--val-list", info["val_list"], "--arch", "resnet18",
           "--img-size", "64", "--num-segments", "8", "--no-flip", "--dropout", "0", "--batch-size", "2",
           "--micro-batch-size", "2", "--max-steps", "12", "--epochs", "1", "--num-workers", "0",
           "--no-progress", "--output-dir", str(tmp_path / "runs"), "--run-name", "demo"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ev = EventAccumulator(str(tmp_path / "runs" / "demo" / "tensorboard" / "tsm_ds"))
    ev.Reload()
    losses = [e.value for e in ev.Scalars("train/loss")]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert max(losses) < GuardSettings().factor * math.log(len(info["classes"])) / 3   # a wide margin


@pytest.mark.slow
def test_a_run_whose_loss_climbs_gradually_is_stopped_by_the_stuck_rule_with_every_rule_on(tmp_path):
    """The failure of the large-batch study, for real and with the default guard (rule 3 on): SGD
    momentum (``cpu_sgd_cosine``, clipping 20) at lr 0.1 with a 10-step warm-up on the demo data (4
    classes) never goes non-finite; its loss climbs step by step from chance to tens of nats while
    the running median climbs with it, so the 10x rule never fires. The stuck rule stops it once 20
    steps in a row after the warm-up were above 3 ln 4 (step 30 on this machine; a dip below the
    floor would restart the count, hence the range), exit 3, recorded. ~20 s on one thread."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tsm_ds.data.synthetic import make_demo_dataset

    info = make_demo_dataset(tmp_path / "demo", seed=0, train_per_class=16, val_per_class=1)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tsm_ds.train", "--deepspeed_config", "cpu_sgd_cosine", "--train-list",
           info["train_list"], "--val-list", info["val_list"], "--arch", "resnet18", "--img-size", "32",
           "--num-segments", "2", "--no-flip", "--batch-size", "8", "--micro-batch-size", "8", "--epochs", "100",
           "--max-steps", "60", "--num-workers", "0", "--no-progress", "--seed", "0", "--lr", "0.1",
           "--warmup-steps", "10", "--head-lr-mults", "on",   # fc x5 / bias x10: the run the study recorded
           "--cache-decoded", "--output-dir", str(tmp_path / "runs"), "--run-name", "stuck"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 3, out[-3000:]
    m = re.search(r"training diverged at optimizer step (\d+): stuck above chance: loss above 3 x chance ln K "
                  r"1.386 = 4.159 for 20 optimizer steps in a row \(steps (\d+)-(\d+), after the 10 warm-up steps\)",
                  out)
    assert m, out[-3000:]
    stop = int(m.group(1))
    assert stop == int(m.group(3)) == int(m.group(2)) + 19 and 30 <= stop < 60
    rec = json.loads((tmp_path / "runs" / "stuck" / "result.json").read_text())
    assert rec["status"] == "diverged" and rec["step"] == stop and rec["reason"].startswith("stuck above chance")
    ev = EventAccumulator(str(tmp_path / "runs" / "stuck" / "tensorboard" / "tsm_ds"))
    ev.Reload()
    trace = [e.value for e in ev.Scalars("train/loss")] + [rec["loss"]]     # the applied steps, then the stopped one
    assert len(trace) == stop and all(math.isfinite(v) for v in trace)
    chance = math.log(4)
    assert abs(trace[0] - chance) < 0.5                        # it starts at a uniform guess
    assert max(trace[stop - 20:]) > 10 * chance                # and ends confidently wrong, far above chance
    # gradual: no step jumped past 10 x the median of the steps before it (why rule 3 stayed silent) ...
    assert _replay(trace[:-1], 10, GuardSettings(stuck_factor=0)) == (None, None)
    # ... and the recorded trace replayed through the rules alone stops where the run stopped
    assert _replay(trace, 10) == (stop, rec["reason"])


@pytest.mark.slow
def test_nan_on_one_rank_stops_every_rank(shared_data, tmp_path):
    """Two ranks through the launcher, NaN on rank 1 only: both decide alike and exit 3."""
    launcher = Path(sys.executable).parent / "deepspeed"
    if not launcher.exists():
        pytest.skip(f"no deepspeed launcher next to {sys.executable}")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    port = _port()
    cmd = [sys.executable, str(launcher), "--num_gpus", "2", "--master_port", str(port), "--module", "tsm_ds.train",
           "--deepspeed_config", "cpu_fp32", "--data", str(shared_data / "videos"), "--output-dir", str(tmp_path),
           "--run-name", "r", *SMALL, "--batch-size", "4", "--inject-nan-at-step", "2", "--inject-nan-rank", "1"]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    finally:
        # the launcher kills rank 0 once rank 1 has exited (before its atexit clean-up): remove the
        # 69 MB /dev/shm buffer DeepSpeed's CPU all-reduce left for this job's port
        for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
            f.unlink(missing_ok=True)
    out = p.stdout + p.stderr
    assert p.returncode == 3, out[-3000:]
    # the NaN was on rank 1 only, yet rank 0 (the one that logs) saw the same reduced loss and stopped
    assert re.search(r"\[rank0\] .* ERROR training diverged at optimizer step 2: loss is nan", out), out[-3000:]
    assert "exits with return code = 3" in out
    assert _all_saved_tensors_finite(tmp_path / "r") == []
