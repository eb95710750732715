"""tsm-ds bench large-batch in the paper's regime: the settings and their regime, the stages and the
lr every run resolves to, the read-back of each run's files, the pass rule, time to accuracy, the
report of a study in progress, no absolute path in committed results, and --quick end to end."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from tsm_ds.data.synthetic import DIFFICULTIES
from tsm_ds.engine.config.recipes import load_config
from tsm_ds.engine.config.resolve import resolve_config
from tsm_ds.experiments.large_batch import (
    QUICK,
    RECIPES,
    StudySettings,
    pass_rule,
    plan_stage,
    portable,
    read_run,
    warmup_steps_for,
)
from tsm_ds.experiments.large_batch.grid import STAGES, estimate_seconds, estimate_text, run_seconds
from tsm_ds.experiments.large_batch.study_report import (
    binomial_se,
    calibration,
    choose_lr,
    isolation,
    readme_table,
    time_to_accuracy,
    verdict_table,
    verdicts,
)

REPO = Path(__file__).resolve().parents[2]


def test_full_study_is_the_papers_regime():
    s = StudySettings()
    s.check()
    r = s.regime()
    assert s.batches == (8, 64, 256) and r["ok"] and r["ratio"] == 32
    assert (r["steps_per_epoch"], r["steps"], s.epochs) == (20, 300, 15)       # 5,120 clips, 15 epochs
    assert [s.micro_for(b) for b in s.batches] == [8, 64, 64] and [s.ghost_for(b) for b in s.batches] == [None, 8, 8]
    # warm-up in epochs (Goyal et al.: 5), not a fraction of the run: none at the base batch
    assert [warmup_steps_for(s, b) for b in s.batches] == [0, 400, 100]
    assert warmup_steps_for(s, 256, 2) == 100
    assert all(len(s.lrs(rc)) == 3 for rc in RECIPES)
    for rc in RECIPES:                                          # a factor 2 apart
        assert all(math.isclose(b / a, 2.0) for a, b in zip(s.lrs(rc), s.lrs(rc)[1:]))
    assert s.val_clips == 2000 and s.headroom == 2 and s.seeds == (0, 1)
    assert {k: s.generator()[k] for k in DIFFICULTIES["hard"]} == DIFFICULTIES["hard"]
    assert not dataclasses.replace(s, batches=(8, 64, 128)).regime()["ok"]      # 16x: not the regime


def test_estimate_fits_the_budget_and_counts_every_run():
    s = StudySettings()
    est = estimate_seconds(s)
    # (a): 3 sweep + 3 grid (256 s0, 8 s1, 256 s1); 6 LARS / LAMB sweep runs; the 2x run; 64
    assert est["runs"] == 14 and est["train_clips"] == (13 + 2) * s.epochs * s.train_clips
    assert est["opt_steps"] == (4 * 9600 + 2 * 9600) + 1200 + 8 * 300
    assert est["wall_s"] <= 6.5 * 3600                          # the budget: ~6 h on the 2-core machine
    assert est["conditional_runs"] == 4                         # a second seed for (b), (c); 2 isolation runs
    assert run_seconds(s, 256) < run_seconds(s, 8)              # ghost BatchNorm in micro-batches of 64
    assert sum(est["per_stage"].values()) == pytest.approx(est["cpu_s"])
    from tsm_ds.config import tools

    assert estimate_text(s) in tools.BENCH_LARGE_BATCH.epilog     # --help prints the library's estimate


@pytest.mark.parametrize("change, match", [
    (dict(batches=(8, 12)), "multiples of the micro-batch"),
    (dict(batches=(32, 8)), "ascending"),
    (dict(batches=(8,)), "2 or more"),
    (dict(train_per_class=100), "multiple of the largest batch"),
    (dict(sgd_lrs=(0.1, 0.2, 0.3, 0.4, 0.5)), "1 to 4"),
    (dict(lars_lrs=()), "1 to 4"),
    (dict(ghost_bn_clips=3), "must divide"),
    (dict(num_frames=4), "must exceed"),
    (dict(headroom=1), "headroom"),
    (dict(eval_max_clips=0), "eval_max_clips"),
    (dict(eval_every="often"), "--eval-every"),
])
def test_bad_settings_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(StudySettings(), **change).check()


def test_stages_and_the_lr_every_run_resolves_to(tmp_path):
    s = StudySettings()
    sweep = plan_stage(s, tmp_path, "sgd_sweep", {})
    assert [(x.name, x.batch, x.role) for x in sweep] == [
        ("sgd_lr0.005_b8_s0", 8, "sweep"), ("sgd_lr0.01_b8_s0", 8, "sweep"), ("sgd_lr0.02_b8_s0", 8, "sweep")]
    assert plan_stage(s, tmp_path, "sgd_grid", {}) == []              # waits for the sweep
    ch = {"sgd": 0.005, "lars": 8.0, "lamb": 0.01}
    grid = plan_stage(s, tmp_path, "sgd_grid", ch)
    assert [x.name for x in grid] == ["sgd_lr0.005_b256_s0", "sgd_lr0.005_b8_s1", "sgd_lr0.005_b256_s1"]
    sweeps = plan_stage(s, tmp_path, "sweeps", ch)
    assert [x.name for x in sweeps] == ["lars_lr4_b256_s0", "lars_lr8_b256_s0", "lars_lr16_b256_s0",
                                        "lamb_lr0.005_b256_s0", "lamb_lr0.01_b256_s0", "lamb_lr0.02_b256_s0"]
    (head,) = plan_stage(s, tmp_path, "headroom", ch)
    assert (head.name, head.batch, head.epochs_factor, head.role) == ("sgd_lr0.005_b8_s0_x2", 8, 2, "headroom")
    assert [x.name for x in plan_stage(s, tmp_path, "middle", ch)] == ["sgd_lr0.005_b64_s0"]
    assert plan_stage(s, tmp_path, "seeds", ch) == []
    assert [x.name for x in plan_stage(s, tmp_path, "seeds", ch, passes_on_one=["lamb"])] == ["lamb_lr0.01_b256_s1"]
    assert plan_stage(s, tmp_path, "isolate", ch) == []
    iso = plan_stage(s, tmp_path, "isolate", ch, sgd_failed=True)
    assert [(x.name, x.lr_mult, x.epochs_factor) for x in iso] == [("sgd_lr0.005_b256_s0_halflr", 0.5, 1),
                                                                   ("sgd_lr0.005_b256_s0_x2", 1.0, 2)]
    with pytest.raises(ValueError, match="unknown stage"):
        plan_stage(s, tmp_path, "later", ch)
    expect = {"sgd": lambda x: x.lr * x.batch / 8, "lars": lambda x: x.lr, "lamb": lambda x: x.lr}
    for spec in [*sweep, *grid, *sweeps, head]:
        raw = load_config(spec.recipe_file)
        flags = {"batch_size": spec.batch, "micro_batch_size": s.micro_for(spec.batch),
                 "warmup_epochs": s.warmup_epochs_for(spec.batch)}
        ds, tsm, _, spe = resolve_config(raw, world_size=1, train_samples=s.train_clips,
                                         epochs=s.epochs * spec.epochs_factor, flags=flags)
        assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] == spec.batch
        assert spe == s.train_clips // spec.batch
        opt = tsm.get("optimizer") or ds["optimizer"]
        assert opt["params"]["lr"] == pytest.approx(expect[spec.recipe](spec))
        assert tsm["lr_schedule"]["type"] == "cosine"
        assert tsm["lr_schedule"]["warmup_steps"] == warmup_steps_for(s, spec.batch)
    # LAMB at 256 from its swept lr at 256: the square-root rule's factor is 1 there
    assert load_config(sweeps[3].recipe_file)["tsm_ds"]["lr_scaling"] == {"rule": "sqrt", "base_lr": 0.005,
                                                                          "base_batch": 256}


def _stage_harness(parallel, wait_for_b=False, fail=None):
    """run_stages over fake stages (sgd_sweep: a; sweeps: b, c; sgd_grid: d; seeds: e): the events
    in order, what had happened when each stage was planned, the stages reported done."""
    import threading

    from tsm_ds.experiments.large_batch.grid import RunSpec
    from tsm_ds.experiments.large_batch.study import run_stages

    plans = {"sgd_sweep": ["a"], "sweeps": ["b", "c"], "sgd_grid": ["d"], "seeds": ["e"]}
    events, planned, done, lock, b_started = [], {}, [], threading.Lock(), threading.Event()

    def plan(st):
        with lock:
            planned[st] = list(events)
        return [RunSpec(n, "sgd", "r.json", 8, 0, 0.01, st) for n in plans.get(st, [])]

    def run(x):
        with lock:
            events.append(("start", x.name))
        if x.name == "b":
            b_started.set()
        if x.name == "a" and wait_for_b:
            assert b_started.wait(30), "b (sweeps) never started beside a (sgd_sweep)"
        if x.name == fail:
            raise RuntimeError(f"run {fail} broke")
        with lock:
            events.append(("end", x.name))
        return {"name": x.name}

    run_stages(plan, run, parallel=parallel, stage_done=done.append, log=lambda m: None)
    return events, planned, done


def test_run_stages_runs_independent_stages_side_by_side():
    events, planned, done = _stage_harness(parallel=2, wait_for_b=True)
    assert sorted(n for e, n in events if e == "start") == ["a", "b", "c", "d", "e"]   # each once
    assert events.index(("start", "b")) < events.index(("end", "a"))   # the sweeps beside SGD's sweep
    assert ("end", "a") in planned["sgd_grid"] and ("end", "a") in planned["headroom"]   # after their need
    assert {("end", n) for n in "abcd"} <= set(planned["seeds"])
    assert planned["sweeps"] == [] and planned["sgd_sweep"] == []
    assert sorted(done) == ["seeds", "sgd_grid", "sgd_sweep", "sweeps"]   # stages with runs only
    assert set(planned) == set(STAGES)


def test_run_stages_one_at_a_time_keeps_the_stage_order():
    events, _, done = _stage_harness(parallel=1)
    assert [n for e, n in events if e == "start"] == ["a", "d", "b", "c", "e"]   # STAGES order
    assert [n for e, n in events] == ["a", "a", "d", "d", "b", "b", "c", "c", "e", "e"]   # one at a time
    assert done == ["sgd_sweep", "sgd_grid", "sweeps", "seeds"]


def test_run_stages_raises_a_runs_error_and_refuses_bad_arguments():
    from tsm_ds.experiments.large_batch.study import run_stages

    with pytest.raises(RuntimeError, match="run c broke"):
        _stage_harness(parallel=2, fail="c")
    with pytest.raises(ValueError, match="parallel 0"):
        run_stages(lambda st: [], lambda x: {}, parallel=0)
    with pytest.raises(ValueError, match="need stages that are not run"):
        run_stages(lambda st: [], lambda x: {}, parallel=1, stages=("sgd_grid",))


def test_run_commands_hold_the_regime(tmp_path):
    from tsm_ds.config import Config, parse
    from tsm_ds.config.commands import TRAIN
    from tsm_ds.experiments.large_batch.runs import rule_lr, train_command

    s = StudySettings()
    data = {"train_list": "data/train.txt", "val_list": "data/val.txt", "root": "data"}
    ch = {"sgd": 0.005}
    big = plan_stage(s, tmp_path, "sgd_grid", ch)[0]
    cfg, _ = parse(TRAIN, Config, train_command(big, s, data, Path("runs"))[3:])
    assert (cfg.schedule.batch_size, cfg.schedule.micro_batch_size, cfg.model.ghost_bn_clips) == (256, 64, 8)
    assert (cfg.schedule.warmup_epochs, cfg.schedule.epochs, cfg.schedule.lr) == (5.0, 15, None)
    assert cfg.model.zero_init_residual == "off"            # it kept TSM from scratch at chance (the pilots)
    assert cfg.data.flip is False and cfg.output.output_dir == "runs"
    base = plan_stage(s, tmp_path, "sgd_sweep", ch)[0]
    cfg, _ = parse(TRAIN, Config, train_command(base, s, data, Path("runs"))[3:])
    assert (cfg.schedule.micro_batch_size, cfg.model.ghost_bn_clips, cfg.schedule.warmup_epochs) == (8, None, 0.0)
    half = plan_stage(s, tmp_path, "isolate", ch, sgd_failed=True)[0]
    assert rule_lr(half, s) == pytest.approx(0.16)
    cfg, _ = parse(TRAIN, Config, train_command(half, s, data, Path("runs"))[3:])
    assert cfg.schedule.lr == pytest.approx(0.08)


def test_portable_leaves_no_path_of_this_machine(tmp_path):
    import sys

    out = tmp_path / "lb"
    cmd = [sys.executable, "-m", "tsm_ds.train", "--train-list", f"{out}/data/train.txt", "--output-dir", str(out)]
    assert portable(cmd, out) == ["python", "-m", "tsm_ds.train", "--train-list", "data/train.txt",
                                  "--output-dir", "."]
    assert portable({"a": ("/opt/x/bin/python3.11", 1)}, out) == {"a": ["python", 1]}


#: an absolute path of a machine: /work/, /home/, /tmp/, /root/, /Users/, /opt/, /mnt/, /usr/, /var/, /data/
_ABS = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|root|Users|opt|mnt|usr|var|data|scratch|private)/")


def test_committed_results_hold_no_absolute_path():
    """Results are committed for others to read: no path of the machine they ran on (the 2026-12-02
    report held 145 log and data paths)."""
    found = []
    for p in sorted((REPO / "results").rglob("*")):
        if p.is_file() and p.suffix in (".json", ".md", ".txt", ".csv", ".jsonl"):
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if _ABS.search(line):
                    found.append(f"{p.relative_to(REPO)}:{n}")
    assert not found, f"{len(found)} absolute paths, first: {found[:5]}"
    assert _ABS.search('"log": "/work/main/bench_out/x.log"') and not _ABS.search('"log": "logs/x.log"')


def _row(recipe, batch, seed, top1, *, lr=0.005, status="completed", role="grid", factor=1, step=None, hist=()):
    return {"name": f"{recipe}_lr{lr:g}_b{batch}_s{seed}" + (f"_x{factor}" if factor > 1 else ""),
            "recipe": recipe, "batch": batch, "global_batch": batch, "seed": seed, "lr_swept": lr, "role": role,
            "epochs_factor": factor, "lr_mult": 1.0, "status": status, "val_top1": top1, "best_val_top1": top1,
            "diverged_at": step, "micro_batch": min(batch, 64) if batch > 8 else 8, "accum": max(1, batch // 64),
            "lr": lr * batch / 8, "warmup_steps": 0 if batch == 8 else 100, "steps": 76800 // batch,
            "wall_s": 10.0, "history": [{"step": st, "val_top1": v} for st, v in hist]}


def test_pass_rule_numbers():
    """max(1 point, 2 SE), SE of the difference of the means: the seeds' where there are 2, floored by
    the binomial SE on the 2,000 validation clips."""
    assert binomial_se(80.0, 2000) == pytest.approx(100 * math.sqrt(0.8 * 0.2 / 2000))    # 0.894 points
    base = [_row("sgd", 8, 0, 80.0), _row("sgd", 8, 1, 82.0)]
    # 2 seeds each side: seed SE sqrt(2/2 + 2/2) = 1.414 > binomial sqrt(.81*.19/4000 + .8*.2/4000) = 0.625
    v = pass_rule(base, [_row("sgd", 256, 0, 79.0), _row("sgd", 256, 1, 81.0)], val_clips=2000, chance=12.5)
    assert v["diff"] == pytest.approx(-1.0) and v["se_seeds"] == pytest.approx(math.sqrt(2.0))
    assert v["tolerance"] == pytest.approx(2 * math.sqrt(2.0)) and v["verdict"] == "pass"
    v = pass_rule(base, [_row("sgd", 256, 0, 77.0), _row("sgd", 256, 1, 77.4)], val_clips=2000, chance=12.5)
    assert v["se_seeds"] == pytest.approx(math.sqrt(1.0 + 0.08 / 2)) and v["verdict"] == "fail"   # -3.8 < -2.04
    # one seed at the large batch: its side has no variance; the binomial SE floors the whole SE
    v = pass_rule(base, [_row("lamb", 256, 0, 79.5)], val_clips=2000, chance=12.5)
    se_b = math.sqrt(binomial_se(81.0, 4000) ** 2 + binomial_se(79.5, 2000) ** 2)
    assert v["se_seeds"] == pytest.approx(1.0) and v["se"] == pytest.approx(se_b) == pytest.approx(1.095, abs=1e-3)
    assert v["tolerance"] == pytest.approx(max(1.0, 2 * max(se_b, 1.0))) and v["verdict"] == "pass"
    one = [_row("sgd", 8, 0, 80.0)]
    v = pass_rule(one, [_row("lars", 256, 0, 79.5)], val_clips=20000, chance=12.5)
    assert v["se_seeds"] is None and v["tolerance"] == 1.0 and v["verdict"] == "pass"      # the 1-point floor
    v = pass_rule(one, [_row("lars", 256, 0, 78.9)], val_clips=20000, chance=12.5)
    assert v["verdict"] == "fail"
    v = pass_rule(base, [_row("sgd", 256, 0, 81.0), _row("sgd", 256, 1, None, status="diverged", step=4)],
                  val_clips=2000, chance=12.5)
    assert v["verdict"] == "fail" and v["broken"] == ["seed 1: diverged at step 4"]
    v = pass_rule(base, [_row("sgd", 256, 0, 14.0)], val_clips=2000, chance=12.5)
    assert v["verdict"] == "fail" and v["at_chance"] == [0]
    assert pass_rule(base, [], val_clips=2000, chance=12.5)["verdict"] == "pending"


def test_second_seed_stays_planned_and_a_crashed_run_is_not_an_outcome(tmp_path):
    """plan_all plans (b)/(c)'s second seed from the first seed's verdict, before and after it lands (its
    row stays in the report); a run recorded as failed (a crash) leaves a verdict pending, not failed."""
    from tsm_ds.experiments.large_batch.study import plan_all

    s = StudySettings()
    rows = [_row("sgd", 8, 0, 93.0, role="sweep"), _row("sgd", 8, 0, 91.0, role="sweep", lr=0.01),
            _row("sgd", 8, 0, 83.0, role="sweep", lr=0.02), _row("sgd", 8, 1, 92.6),
            _row("sgd", 256, 0, 92.0), _row("sgd", 256, 1, 92.4),
            _row("lamb", 256, 0, 92.5, role="sweep"), _row("lamb", 256, 0, 80.0, role="sweep", lr=0.01),
            _row("lamb", 256, 0, 70.0, role="sweep", lr=0.02)]
    names = {x.name for x in plan_all(s, tmp_path, rows, ["sgd", "lamb"])}
    assert "lamb_lr0.005_b256_s1" in names and not any(n.endswith("_halflr") for n in names)
    rows.append(_row("lamb", 256, 1, 88.0))   # the second seed lands (mean 90.25; the seeds' spread widens the SE)
    assert "lamb_lr0.005_b256_s1" in {x.name for x in plan_all(s, tmp_path, rows, ["sgd", "lamb"])}
    v = verdicts(rows, {"sgd": 0.005, "lamb": 0.005}, base_batch=8, largest=256, val_clips=2000, chance=12.5,
                 seeds=(0, 1))
    assert (v["lamb"]["first_seed"], v["lamb"]["verdict"], v["lamb"]["missing"]) == ("pass", "pass", [])
    assert v["lamb"]["seeds"] == [0, 1] and v["lamb"]["mean"] == 90.25 and v["lamb"]["tolerance"] > 4.0
    crashed = [*rows[:5], _row("sgd", 256, 1, None, status="failed")]
    v = verdicts(crashed, {"sgd": 0.005}, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1),
                 recipes=["sgd"])
    assert v["sgd"]["verdict"] == "pending" and v["sgd"]["missing"] == ["seed 1 at 256 (failed: rerun)"]
    crashed = [*rows[:3], _row("sgd", 8, 1, None, status="failed"), *rows[4:6]]
    v = verdicts(crashed, {"sgd": 0.005}, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1),
                 recipes=["sgd"])
    assert v["sgd"]["verdict"] == "pending" and v["sgd"]["missing"] == ["base seed 1 (failed: rerun)"]
    assert v["sgd"]["base_mean"] == 93.0   # the crashed seed is not in the base
    assert v["sgd"]["base_complete"] is False
    lamb_only = [r for r in rows if r["recipe"] == "lamb" or (r["batch"] == 8 and r["seed"] == 0)]
    assert "lamb_lr0.005_b256_s1" not in {x.name for x in plan_all(s, tmp_path, lamb_only, ["sgd", "lamb"])}


def test_verdicts_calibration_time_to_accuracy_and_tables():
    rows = [_row("sgd", 8, 0, 84.0, role="sweep", lr=0.0025), _row("sgd", 8, 0, 86.0, role="sweep"),
            _row("sgd", 8, 0, 85.0, role="sweep", lr=0.01), _row("sgd", 8, 1, 88.0),
            _row("sgd", 8, 0, 88.5, role="headroom", factor=2),
            _row("sgd", 256, 0, 85.0, hist=[(100, 50.0), (200, 83.0), (300, 85.0)]),
            _row("sgd", 256, 1, 86.0, hist=[(300, 86.0)]),
            _row("lamb", 256, 0, 70.0, lr=0.01, role="sweep"), _row("lamb", 256, 0, 80.0, lr=0.02, role="sweep")]
    chosen = {"sgd": choose_lr([r for r in rows if r["role"] == "sweep" and r["recipe"] == "sgd"])[0],
              "lamb": 0.02, "lars": None}
    assert chosen["sgd"] == 0.005
    assert choose_lr(rows[:3])[1] == "highest final top-1 (86.0%) of 3 lrs (0.0025, 0.005, 0.01)"   # inside
    lr, why = choose_lr(rows[1:3])
    assert lr == 0.005 and why.endswith("; the smallest lr tried: a smaller one was not run")
    assert choose_lr(rows[7:9])[1].endswith("; the largest lr tried: a larger one was not run")
    assert choose_lr(rows[8:9])[1] == "highest final top-1 (80.0%) of 1 lrs (0.02)"
    v = verdicts(rows, chosen, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1))
    assert v["sgd"]["base_mean"] == 87.0 and v["sgd"]["mean"] == 85.5 and v["sgd"]["verdict"] == "pass"
    assert v["lamb"]["verdict"] == "fail" and v["lars"]["verdict"] == "pending"
    assert v["sgd"]["missing"] == [] and v["lamb"]["missing"] == []   # a failing (b) / (c) needs one seed
    # a verdict waits for the seeds the study plans: (a)'s second seed at 256, the base's second seed
    part = verdicts(rows[:3] + rows[4:6], chosen, base_batch=8, largest=256, val_clips=2000, chance=12.5,
                    seeds=(0, 1))
    assert part["sgd"]["provisional"] == "pass" and part["sgd"]["verdict"] == "pending"
    assert part["sgd"]["missing"] == ["base seed 1", "seed 1 at 256"]
    assert part["sgd"]["text"].startswith("pending: waits for base seed 1, seed 1 at 256 (so far pass: 85.0% ")
    # (b) / (c): a pass on one seed waits for the second; a diverged seed fails at once
    lamb_ok = [*rows[:7], _row("lamb", 256, 0, 87.5, lr=0.02, role="sweep")]
    w = verdicts(lamb_ok, chosen, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1))
    assert (w["lamb"]["provisional"], w["lamb"]["verdict"], w["lamb"]["missing"]) == ("pass", "pending",
                                                                                     ["seed 1 at 256"])
    lamb_ok.append(_row("lamb", 256, 1, 86.5, lr=0.02))
    w = verdicts(lamb_ok, chosen, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1))
    assert w["lamb"]["verdict"] == "pass" and w["lamb"]["mean"] == 87.0
    bad = [*rows[:4], _row("sgd", 256, 0, None, status="diverged", step=7)]
    w = verdicts(bad, chosen, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1))
    assert w["sgd"]["verdict"] == "fail" and w["sgd"]["missing"] == ["seed 1 at 256"]
    c = calibration(rows, 0.005, base_batch=8, headroom=2)
    assert (c["base_mean"], c["longer_top1"], c["gap"], c["solved"], c["converged"], c["passed"]) == (
        87.0, 88.5, 2.5, False, True, True)
    target = 0.95 * 87.0
    assert time_to_accuracy(rows[5], target) == (200, 51200) and time_to_accuracy(rows[6], target) == (300, 76800)
    table = readme_table(rows, target).splitlines()
    assert table[0].startswith("| recipe | kind | global batch |") and len(table) == 2 + len(rows)
    assert "| sgd | grid | 256 | 64 x 4 | 0 | 0.16 | 300 (100) | completed | 85.0 | 85.0 | 200 / 51,200 |" in table
    assert "| sgd | longer x2 | 8 | 8 x 1 | 0 | 0.005 | 9600 (0) | completed | 88.5 | 88.5 | not reached |" in table
    vt = verdict_table(v, 256)
    assert "| (a) SGD, linear rule + 5-epoch warm-up (the paper's) | 0.005 | 85.5 (2 seeds) | 87.0 | -1.5 |" in vt


def test_cli_options(tmp_path):
    from tsm_ds.cli.bench_large_batch import COMMAND, main, settings_from
    from tsm_ds.config import Config, parse

    def settings(*argv):
        return settings_from(parse(COMMAND, Config, list(argv))[0])

    s = settings("--quick", "--sgd-lrs", "0.1,0.2", "--seeds", "3", "--no-cache")
    assert s.batches == QUICK.batches and s.sgd_lrs == (0.1, 0.2) and s.seeds == (3,) and not s.cache_decoded
    assert s.micro_batch == QUICK.micro_batch and settings("--micro-batch-size", "4").micro_batch == 4
    s = settings("--lars-lrs", "1,2", "--lamb-lrs", "0.1", "--warmup-epochs", "2", "--max-micro-batch", "32")
    assert (s.lars_lrs, s.lamb_lrs, s.warmup_epochs, s.max_micro_batch) == ((1.0, 2.0), (0.1,), 2.0, 32)
    assert settings().cache_decoded and settings("--batches", "8,64").batches == (8, 64)
    demo = settings("--difficulty", "demo", "--headroom", "0")
    assert (demo.difficulty, demo.noise, demo.headroom) == ("demo", (0.01, 0.05), 0)
    assert main(["--recipes", "sgd,adam", "--out-dir", str(tmp_path)]) == 2
    assert main(["--batches", "8,20", "--out-dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())                                  # refused before any work


@pytest.mark.slow
def test_quick_end_to_end_through_the_trainer(tmp_path, capsys):
    """--quick: every stage through tsm_ds.train (a sweep of 2 lrs for (a), 1 for (b) and (c)):
    batches, accumulation, ghost BatchNorm and the lr of each run read back from its config.json;
    rows written per run; the report of a study in progress; a second call reuses every row; the
    published files hold no absolute path."""
    from tsm_ds.cli.bench_large_batch import main

    out = tmp_path / "lb"
    # two runs at a time, one thread each, as on the project's 2-core machine (the pool's path too)
    assert main(["--quick", "--out-dir", str(out), "--parallel", "2", "--threads", "1"]) == 0, \
        capsys.readouterr().err
    rep = json.loads((out / "large_batch.json").read_text())
    rows = {r["name"]: r for r in rep["rows"]}
    lr = rep["chosen"]["sgd"]["lr"]
    assert lr in QUICK.sgd_lrs and rep["chosen"]["lars"]["lr"] == 1.0
    assert set(rows) == {"sgd_lr0.01_b2_s0", "sgd_lr0.02_b2_s0", f"sgd_lr{lr:g}_b8_s0", "lars_lr1_b8_s0",
                         "lamb_lr0.01_b8_s0"}
    for name, r in rows.items():
        cfg = json.loads((out / "runs" / name / "config.json").read_text())
        assert cfg["resolved_ds_config"]["train_batch_size"] == r["global_batch"] == r["batch"]
        assert (r["micro_batch"], r["accum"]) == ((2, 1) if r["batch"] == 2 else (4, 2))
        assert ("--ghost-bn-clips" in r["cmd"]) is (r["batch"] == 8)
        assert r["warmup_steps"] == (0 if r["batch"] == 2 else 1)        # half an epoch of 2 steps at 8
        assert r["cmd"][0] == "python" and r["log"] == f"logs/{name}.log" and (out / r["log"]).is_file()
        assert (out / "rows" / f"{name}.json").is_file() and not (out / "runs" / name / "checkpoints").exists()
        if r["recipe"] == "sgd":
            assert r["lr"] == pytest.approx(r["lr_swept"] * r["batch"] / 2)
        assert r["status"] == "completed" and r["steps"] == 16 // r["batch"] and r["val_clips"] == 4
    assert rep["landed"] == rep["planned_total"] == 5 and rep["complete"]
    assert set(rep["verdicts"]) == {"sgd", "lars", "lamb"} and rep["regime"]["ok"]
    md = (out / "large_batch.md").read_text()
    assert "Verdicts at batch 8" in md and (out / "large_batch.png").stat().st_size > 0
    # a second call reuses every recorded run; --report-only publishes without running anything
    (out / "rows" / "lamb_lr0.01_b8_s0.json").unlink()             # as if that run had not landed yet
    assert main(["--quick", "--out-dir", str(out), "--report-only", "--results-dir", str(tmp_path / "res")]) == 0
    part = json.loads((tmp_path / "res" / "large_batch.json").read_text())
    assert part["landed"] == 4 and not part["complete"] and "study in progress: 4 of 5 runs" in part["status"]
    assert part["verdicts"]["lamb"]["verdict"] == "pending"
    assert len(list((tmp_path / "res" / "rows").glob("*.json"))) == 4
    text = "".join(p.read_text() for p in (tmp_path / "res").rglob("*.json"))
    assert str(tmp_path) not in text and "/python" not in text


def test_large_batch_guide_shows_the_committed_report():
    """docs/large-batch.md shows the committed study, number for number: its run table is
    :func:`readme_table` of ``results/large_batch/large_batch.json``, its verdict table
    :func:`verdict_table`, and while the study is incomplete the guide and the README say so with
    the report's own count."""
    guide = (REPO / "docs" / "large-batch.md").read_text()
    rep = json.loads((REPO / "results" / "large_batch" / "large_batch.json").read_text())
    assert rep["version"] == 2 and rep["regime"]["ok"]
    assert readme_table(rep["rows"], rep["target_top1"]) in guide
    assert verdict_table(rep["verdicts"], rep["settings"]["batches"][-1]) in guide
    st = rep["settings"]
    assert isolation(rep["rows"], rep["verdicts"]["sgd"], rep["chosen"]["sgd"]["lr"], base_batch=st["batches"][0],
                     largest=st["batches"][-1], headroom=st["headroom"]) == rep["isolation"]
    assert rep["isolation"]["text"] in guide
    if not rep["complete"]:
        status = f"study in progress: {rep['landed']} of {rep['planned_total']} runs"
        assert status in guide and status in (REPO / "README.md").read_text()
        assert status in (REPO / "results" / "large_batch" / "README.md").read_text()
    assert (REPO / "results" / "large_batch" / "history" / "2026-12-02" / "large_batch.json").is_file()



def test_demo_preset_is_the_generator_default():
    import inspect

    from tsm_ds.data.synthetic import DEFAULT_CLASSES, difficulty_params, make_demo_dataset

    defaults = {k: p.default for k, p in inspect.signature(make_demo_dataset).parameters.items()}
    demo = difficulty_params("demo")
    assert demo.pop("classes") == DEFAULT_CLASSES
    assert all(defaults[k] == v for k, v in demo.items())
    with pytest.raises(ValueError, match="unknown difficulty"):
        difficulty_params("nightmare")




def _write_run(run_dir: Path, result: dict | None, *, batch=32, accum=4, lr=0.04):
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({
        "resolved_ds_config": {"train_batch_size": batch, "train_micro_batch_size_per_gpu": batch // accum,
                               "gradient_accumulation_steps": accum, "optimizer": {"params": {"lr": lr}}},
        "resolved_tsm_ds": {"lr_schedule": {"warmup_steps": 3}}, "world_size": 1, "total_steps": 40,
        "auto_filled": {"optimizer.params.lr": f"{lr} (linear rule)"},
        # the trainer records the groups after the schedule's first step: the first warm-up lr, not the lr
        "param_groups": [{"name": "fc", "lr": lr * 5 / 3, "lr_mult": 5.0},
                         {"name": "base", "lr": lr / 3, "lr_mult": 1.0}]}))
    if result is not None:
        (run_dir / "result.json").write_text(json.dumps(result))




def test_read_run_completed_diverged_and_failed(tmp_path):
    _write_run(tmp_path / "a", {"status": "completed", "steps": 40, "val_top1": 91.5, "best_val_top1": 92.0,
                                "val_clips": 200})
    r = read_run(tmp_path / "a")
    assert (r["status"], r["global_batch"], r["micro_batch"], r["accum"], r["lr"]) == ("completed", 32, 8, 4, 0.04)
    assert (r["steps"], r["clips_seen"], r["val_top1"], r["warmup_steps"],
            r["planned_steps"]) == (40, 1280, 91.5, 3, 40)
    _write_run(tmp_path / "d", {"status": "diverged", "step": 7, "reason": "loss nan"})
    r = read_run(tmp_path / "d")
    assert (r["status"], r["diverged_at"], r["steps"], r["val_top1"],
            r["reason"]) == ("diverged", 7, 7, None, "loss nan")
    _write_run(tmp_path / "f", None)
    assert read_run(tmp_path / "f")["status"] == "failed"
    _write_run(tmp_path / "s", {"status": "save_failed", "error": "disk full"})
    assert read_run(tmp_path / "s")["status"] == "failed"





def test_a_recorded_command_is_reused_under_either_spelling_of_the_same_interpreter(tmp_path):
    """The ``tsm-ds`` script runs as ``.venv/bin/python3`` (its shebang), ``python -m`` as
    ``.venv/bin/python``: one program, so a run recorded by one is reused by the other (this cost
    a rerun of a 15-minute run). Another folder (another venv) or other arguments are not reused."""
    from tsm_ds.experiments.large_batch.runs import same_command

    real = tmp_path / "base" / "python3.11"
    real.parent.mkdir()
    real.write_text("")
    venv, other = tmp_path / "venv" / "bin", tmp_path / "other" / "bin"
    for d in (venv, other):
        d.mkdir(parents=True)
        for name in ("python", "python3"):
            (d / name).symlink_to(real)
    args = ["-m", "tsm_ds.train", "--seed", "0"]
    assert same_command([str(venv / "python"), *args], [str(venv / "python3"), *args])
    assert same_command([str(venv / "python"), *args], [str(venv / "python"), *args])
    assert not same_command([str(venv / "python"), *args], [str(other / "python3"), *args])    # another venv
    assert not same_command([str(venv / "python"), *args], [str(venv / "python3"), "-m", "tsm_ds.train", "--seed", "1"])
    assert not same_command(None, [str(venv / "python"), *args])
    assert not same_command([str(venv / "python")], [str(venv / "python"), *args])


def test_gpu_grid_fits_ten_minutes_by_its_estimate_and_runs_on_the_cpu(tmp_path, capsys):
    """launch/gpu_large_batch.sh: batch 4,096 = 32x the base, 300 steps there (20 per epoch), ghost
    BatchNorm over 8, bf16; its printed estimate fits 600 s on the H100 machine (16 cores), the smoke
    box of gpu_check.sh 60 s."""
    from tsm_ds.experiments.large_batch.gpu import SMOKE, GpuSettings, gpu_estimate, gpu_plan, main

    s = dataclasses.replace(GpuSettings(), workers=16)
    plan = {r["name"]: r for r in gpu_plan(s)}
    assert list(plan) == ["sgd_b128", "sgd_b4096", "lars_b4096", "lamb_b4096", "sgd_b512"]
    top = plan["sgd_b4096"]
    assert top["batch"] == 32 * s.batches[0] and top["steps"] == 300 and s.train_clips // 4096 == 20
    assert top["warmup_steps"] == 100 and plan["sgd_b128"]["warmup_steps"] == 0
    assert top["lr"] == pytest.approx(0.01 * 4096 / 8) and s.ghost_bn_clips == 8 and s.bf16
    assert gpu_estimate(s)["total_s"] <= 600 and gpu_estimate(dataclasses.replace(SMOKE, workers=16))["total_s"] <= 60
    assert main(out=str(tmp_path / "p"), plan_only=True, workers=16) == 0
    assert "total 428 s for 5 runs" in capsys.readouterr().out
    assert main(out=str(tmp_path / "p"), plan_only=True, workers=2) == 2     # 264 s of rendering: over budget
    from tsm_ds.cli.gpu_large_batch import main as cli
    from tsm_ds.experiments.large_batch.gpu import kwargs_of

    assert kwargs_of(["mode=smoke", "workers=16", "plan_only=1"]) == {"mode": "smoke", "workers": 16, "plan_only": True}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        kwargs_of(["--smoke"])
    assert cli(["--smoke"]) == 2 and cli([f"out={tmp_path / 'c'}", "plan_only=1", "workers=16", "mode=smoke"]) == 0
    # the loop itself: --dry-run inside launch/gpu_check.sh --dry-run (tests/cli/test_doctor_cli.py, slow)


def test_isolation_reads_the_runs_against_the_failed_verdict():
    """(a)'s isolation runs, one change each at the largest batch, against (a)'s tolerance of the base: half
    the lr inside (a)'s seeds does not close the gap; twice the epochs within the tolerance closes it and is also
    read against the base's 2x longer run; one above both seeds but short of the base recovers part of it."""
    rows = [_row("sgd", 8, 0, 93.5), _row("sgd", 8, 1, 93.8), _row("sgd", 8, 0, 95.3, role="headroom", factor=2),
            _row("sgd", 256, 0, 91.3), _row("sgd", 256, 1, 88.3)]
    v = verdicts(rows, {"sgd": 0.005}, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1),
                 recipes=["sgd"])["sgd"]
    assert v["verdict"] == "fail" and v["tolerance"] == pytest.approx(2 * math.sqrt(0.045 / 2 + 4.5 / 2))
    iso = isolation(rows, v, 0.005, base_batch=8, largest=256, headroom=2)
    assert iso == {"half_lr": None, "x2": None, "text": ""}              # (a) failed, but no isolation run yet
    half = {**_row("sgd", 256, 0, 89.2, role="isolate"), "lr_mult": 0.5, "name": "sgd_lr0.005_b256_s0_halflr"}
    x2 = {**_row("sgd", 256, 0, 92.0, role="isolate", factor=2), "steps": 600}
    iso = isolation([*rows, half, x2], v, 0.005, base_batch=8, largest=256, headroom=2)
    assert iso["half_lr"]["outcome"] == "no" and "(0.08 instead of 0.16 at 256" in iso["half_lr"]["text"]
    assert iso["x2"]["outcome"] == "closes" and iso["x2"]["vs_longer_base"] == pytest.approx(92.0 - 95.3)
    assert "600 optimizer steps at 256" in iso["x2"]["text"] and iso["text"].startswith("Why (a) fails")
    x2["val_top1"] = 91.5                                              # 2.15 below the base's 93.65: within 3.0
    assert isolation([*rows, x2], v, 0.005, base_batch=8, largest=256, headroom=2)["x2"]["outcome"] == "closes"
    x2["val_top1"] = 90.0                                              # between the seeds, 3.65 below the base
    assert isolation([*rows, x2], v, 0.005, base_batch=8, largest=256, headroom=2)["x2"]["outcome"] == "no"
    tight = [*rows[:3], _row("sgd", 256, 0, 88.0), _row("sgd", 256, 1, 88.4)]
    vt = verdicts(tight, {"sgd": 0.005}, base_batch=8, largest=256, val_clips=2000, chance=12.5, seeds=(0, 1),
                  recipes=["sgd"])["sgd"]
    x2["val_top1"] = 89.0                                              # above both seeds, far short of the base
    assert isolation([*tight, x2], vt, 0.005, base_batch=8, largest=256, headroom=2)["x2"]["outcome"] == "part"
    passed = {**v, "verdict": "pass"}
    assert isolation([*rows, half], passed, 0.005, base_batch=8, largest=256, headroom=2)["text"] == ""
