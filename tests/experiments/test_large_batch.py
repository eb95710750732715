"""tsm-ds bench large-batch: the grid (batches, accumulation, the lr of every run by its rule), the
read-back of each run's files, the verdicts, and --quick end to end through tsm_ds.train."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tsm_ds.data.synthetic import DIFFICULTIES
from tsm_ds.engine.config.recipes import load_config
from tsm_ds.engine.config.resolve import resolve_config
from tsm_ds.experiments.large_batch import (
    QUICK,
    RECIPES,
    StudySettings,
    aggregate,
    choose_lr,
    plan_grid,
    plan_sweep,
    read_run,
    verdicts,
    warmup_steps_for,
)
from tsm_ds.experiments.large_batch.grid import estimate_seconds, plan_headroom
from tsm_ds.experiments.large_batch.study_report import (
    calibration,
    projection,
    readme_table,
    runs_table,
    target_top1,
    time_to_accuracy,
)


def test_full_study_sizes_follow_the_issue():
    s = StudySettings()
    s.check()
    assert s.base_batch == s.micro_batch == 8 and s.batches == (8, 64, 512)
    assert s.train_clips % s.batches[-1] == 0
    clips = s.epochs * s.train_clips
    assert clips // s.batches[-1] >= 50 == s.min_steps            # the largest batch: >= 50 optimizer steps
    assert all(clips % b == 0 for b in s.batches)                  # the same clips at every batch
    assert 1 <= len(s.sgd_lrs) <= 4 and len(s.seeds) >= 2
    assert s.val_clips >= 2000 and s.headroom == 4                 # the final evaluation on >= 2,000 clips
    assert [warmup_steps_for(s, b) for b in s.batches] == [320, 40, 5]   # 10 % of 3,200 / 400 / 50 steps
    assert warmup_steps_for(s, 8, 4) == 1280
    # the task: the hard preset's fields, recorded as the generator's arguments
    assert s.difficulty == "hard"
    gen = s.generator()
    assert {k: gen[k] for k in DIFFICULTIES["hard"]} == DIFFICULTIES["hard"]


def test_demo_preset_is_the_generator_default():
    import inspect

    from tsm_ds.data.synthetic import DEFAULT_CLASSES, difficulty_params, make_demo_dataset

    defaults = {k: p.default for k, p in inspect.signature(make_demo_dataset).parameters.items()}
    demo = difficulty_params("demo")
    assert demo.pop("classes") == DEFAULT_CLASSES
    assert all(defaults[k] == v for k, v in demo.items())
    with pytest.raises(ValueError, match="unknown difficulty"):
        difficulty_params("nightmare")


def test_estimate_fits_the_budget_and_counts_every_run():
    s = StudySettings()
    est = estimate_seconds(s)
    # sweep 1 + grid 18 - the shared sweep run + the headroom run = 19 runs; 22 runs' worth of clips
    assert est["runs"] == 19 and est["train_clips"] == 22 * s.epochs * s.train_clips
    # optimizer steps: 6 batch-8 runs + the 4x one, 4 runs at 64, 8 at 512
    assert est["opt_steps"] == (6 + 4) * 3200 + 4 * 400 + 8 * 50
    # the study's budget on 2 cores (docs/large-batch.md: 2.2 h estimated)
    assert est["wall_s"] <= 2.5 * 3600
    # intermediate evaluations: 4 per epoch, capped; the last one on the whole set
    one = estimate_seconds(dataclasses.replace(s, sgd_lrs=(0.01,), headroom=0), ("sgd_fixed",))
    assert one["eval_clips"] == one["runs"] * (4 * s.epochs - 1) * s.eval_max_clips + one["runs"] * s.val_clips


@pytest.mark.parametrize("change, match", [
    (dict(batches=(8, 12)), "multiples of the micro-batch"),
    (dict(batches=(32, 8)), "ascending"),
    (dict(train_per_class=100), "multiple of the largest batch"),
    (dict(sgd_lrs=(0.1, 0.2, 0.3, 0.4, 0.5)), "1 to 4"),
    (dict(num_frames=4), "must exceed"),
    (dict(headroom=1), "headroom"),
    (dict(eval_max_clips=0), "eval_max_clips"),
    (dict(eval_every="often"), "--eval-every"),
])
def test_bad_settings_are_refused(change, match):
    import dataclasses

    with pytest.raises(ValueError, match=match):
        dataclasses.replace(StudySettings(), **change).check()


def test_grid_runs_and_the_lr_every_run_resolves_to(tmp_path):
    s = dataclasses.replace(StudySettings(), sgd_lrs=(0.001, 0.003))   # a sweep of two (default: 0.003 alone)
    sweep = plan_sweep(s, tmp_path)
    grid = plan_grid(s, tmp_path, s.sgd_lrs[-1])      # the sweep chose its last lr
    assert [x.base_lr for x in sweep] == list(s.sgd_lrs) and {x.batch for x in sweep} == {8}
    names = [x.name for x in grid]
    assert len(names) == len(set(names)) == 18
    assert len(set(names) | {x.name for x in sweep}) == 19         # the chosen sweep run is a grid run
    shared = [x for x in grid if x.recipes == ("sgd_fixed", "sgd_linear")]
    assert [(x.batch, x.seed) for x in shared] == [(8, 0), (8, 1)]
    assert {(x.batch, x.seed) for x in grid if x.recipes == ("lars",)} == {(8, 0), (8, 1), (64, 0), (512, 0), (512, 1)}
    rules = {"none": lambda b: 1.0, "linear": lambda b: b / 8, "sqrt": lambda b: math.sqrt(b / 8)}
    for spec in grid:
        raw = load_config(spec.recipe_file)
        ds, tsm, _, spe = resolve_config(raw, world_size=1, train_samples=s.train_clips, epochs=s.epochs,
                                         flags={"batch_size": spec.batch, "micro_batch_size": 8,
                                                "warmup_steps": warmup_steps_for(s, spec.batch)})
        assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_accumulation_steps"] == spec.batch // 8
        assert spe * s.epochs * spec.batch == s.epochs * s.train_clips
        recipe = RECIPES[spec.recipes[-1]]
        opt = tsm.get("optimizer") or ds["optimizer"]
        rule = "none" if spec.batch == 8 else recipe.rule
        assert opt["params"]["lr"] == pytest.approx(spec.base_lr * rules[rule](spec.batch))
        assert tsm["lr_schedule"]["type"] == "cosine"
        # only tsm_ds.lr_scaling differs from the shipped recipe
        shipped = load_config(recipe.template)
        for k in set(raw) | set(shipped):
            if k not in ("_comment", "tsm_ds"):
                assert raw[k] == shipped[k]
        assert {k: v for k, v in raw["tsm_ds"].items() if k != "lr_scaling"} == \
               {k: v for k, v in shipped["tsm_ds"].items() if k != "lr_scaling"}
    head = plan_headroom(s, tmp_path, s.sgd_lrs[-1])
    assert (head.batch, head.seed, head.recipes, head.epochs_factor, head.base_lr) == (8, 0, (), 4, s.sgd_lrs[-1])
    assert head.recipe_file == sweep[1].recipe_file and head.name not in names
    assert plan_headroom(dataclasses.replace(s, headroom=0), tmp_path, s.sgd_lrs[-1]) is None
    with pytest.raises(ValueError, match="lr chosen"):
        plan_grid(s, tmp_path, None)
    assert {x.recipes for x in plan_grid(s, tmp_path, None, ("lars", "lamb"))} == {("lars",), ("lamb",)}


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


def _row(recipe, batch, seed, top1, status="completed", step=None):
    return {"name": f"{recipe}_{batch}_{seed}", "recipes": [recipe], "batch": batch, "seed": seed, "status": status,
            "val_top1": top1, "diverged_at": step, "micro_batch": 8, "accum": batch // 8, "lr": 0.01,
            "warmup_steps": 1, "steps": 6400 // batch, "wall_s": 10.0}


def test_points_and_verdicts():
    rows = [_row("sgd_linear", 8, 0, 95.0), _row("sgd_linear", 8, 1, 91.0), _row("sgd_linear", 32, 0, 89.5),
            _row("sgd_linear", 128, 0, 80.0), _row("sgd_linear", 128, 1, 30.0, "diverged", 12),
            _row("lamb", 8, 0, 90.0), _row("lamb", 8, 1, 90.5), _row("lamb", 32, 0, 89.5),
            _row("lamb", 128, 0, 89.0), _row("lamb", 128, 1, 88.0),
            _row("lars", 8, 0, 27.0), _row("lars", 128, 0, 26.0)]
    pts = aggregate(rows, ["sgd_linear", "lamb", "lars"], [8, 32, 128])
    p8 = pts[0]
    assert (p8["batch"], p8["mean_top1"], p8["spread"], p8["val_top1"]) == (8, 93.0, 4.0, [95.0, 91.0])
    p128 = pts[2]
    assert p128["val_top1"] == [80.0, None] and p128["diverged"] == ["seed 1: step 12"] and p128["mean_top1"] == 80.0
    v = verdicts(pts, 8, chance=25.0)
    # sgd_linear: tolerance = its largest seed spread (4 points): 89.5 >= 93 - 4 holds; 128 has a diverged seed
    assert v["sgd_linear"]["tolerance"] == 4.0
    assert (v["sgd_linear"]["holds"], v["sgd_linear"]["breaks"], v["sgd_linear"]["holds_up_to"]) == ([8, 32], [128], 32)
    assert v["lamb"]["breaks"] == [] and v["lamb"]["tolerance"] == 2.0   # spreads 0.5 / 1.0: the 2-point floor
    assert not v["lars"]["learned_at_base"] and v["lars"]["holds"] == []


def test_a_recipe_with_a_seed_at_chance_at_the_base_batch_did_not_learn_there():
    """The study's LAMB: batch-8 seeds at 39.1 and 15.3 % (chance 12.5 %), 85.3 % at 64, 79.1 % at 512.
    Its mean (27.2 %) is 14.7 points above chance, but one seed never left it: no "holds" verdict
    (it would hold within the 23.9-point spread), and the line gives every batch's mean instead."""
    from tsm_ds.experiments.large_batch.study_report import verdict_lines

    rows = [_row("lamb", 8, 0, 39.1), _row("lamb", 8, 1, 15.3), _row("lamb", 64, 0, 85.3),
            _row("lamb", 512, 0, 79.0), _row("lamb", 512, 1, 79.2),
            _row("lars", 8, 0, 86.0), _row("lars", 8, 1, 85.7), _row("lars", 64, 0, 30.0, "diverged", 29),
            _row("lars", 512, 0, 30.0, "diverged", 4)]
    pts = aggregate(rows, ["lamb", "lars"], [8, 64, 512])
    v = verdicts(pts, 8, chance=12.5)
    assert not v["lamb"]["learned_at_base"] and v["lamb"]["holds"] == [] and v["lamb"]["breaks"] == [8, 64, 512]
    assert v["lars"]["learned_at_base"] and (v["lars"]["holds"], v["lars"]["breaks"]) == ([8], [64, 512])
    lamb, lars = verdict_lines(v, [8, 64, 512], pts)
    assert lamb == ("- (d) LAMB, square-root rule + warm-up: did not learn at the base batch with every seed "
                    "(27.2% mean (seeds: 39.1%, 15.3%)): nothing to hold; mean top-1 per batch: 8: 27.2%, "
                    "64: 85.3%, 512: 79.1%.")
    assert lars == ("- (c) LARS, linear rule + warm-up: holds up to 8, breaks at 64, 512 "
                    "(tolerance 2.0 points; base 85.8%).")


def test_choose_lr():
    rows = [{"base_lr": 0.003, "status": "completed", "val_top1": 90.0, "best_val_top1": 90.0},
            {"base_lr": 0.01, "status": "completed", "val_top1": 94.0, "best_val_top1": 95.0},
            {"base_lr": 0.03, "status": "diverged", "val_top1": None, "best_val_top1": None}]
    assert choose_lr(rows)[0] == 0.01
    rows[0]["val_top1"], rows[0]["best_val_top1"] = 94.0, 95.0          # a tie: the smaller lr
    assert choose_lr(rows)[0] == 0.003
    lr, why = choose_lr([dict(r, status="diverged") for r in rows])
    assert lr == 0.003 and "no sweep run completed" in why


def test_cli_options(tmp_path):
    from tsm_ds.cli.bench_large_batch import COMMAND, main, settings_from
    from tsm_ds.config import Config, parse

    def settings(*argv):
        return settings_from(parse(COMMAND, Config, list(argv))[0])

    s = settings("--quick", "--sgd-lrs", "0.1,0.2", "--seeds", "3", "--no-cache")
    assert s.batches == QUICK.batches and s.sgd_lrs == (0.1, 0.2) and s.seeds == (3,) and not s.cache_decoded
    assert s.micro_batch == QUICK.micro_batch and settings("--micro-batch-size", "4").micro_batch == 4
    assert settings("--micro-batch", "4").micro_batch == 4          # the former spelling (a prefix)
    assert settings().cache_decoded and settings("--batches", "4,16").batches == (4, 16)
    hard = settings("--difficulty", "demo", "--headroom", "0")
    assert (hard.difficulty, hard.noise, hard.num_frames, hard.headroom) == ("demo", (0.01, 0.05), 16, 0)
    assert main(["--recipes", "lars", "--calibrate-only", "--out-dir", str(tmp_path)]) == 2
    assert main(["--recipes", "sgd_linear,adam", "--out-dir", str(tmp_path)]) == 2
    assert main(["--batches", "8,20", "--out-dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())                                  # refused before any work


@pytest.mark.slow
def test_quick_end_to_end_through_the_trainer(tmp_path, capsys):
    """--quick with (a), (b), and LARS and LAMB at an lr far too large: 7 runs of tsm_ds.train.
    Checks each run's batch, accumulation and lr as read back from its config.json, the same clips at
    every batch, LARS held by its clipped trust ratio (every group adapted: its steps are bounded by
    trust_coeff x |w| whatever the lr), and a diverged run (LAMB, whose BatchNorm and bias groups
    take the raw lr) reported as a result, not a failure."""
    from tsm_ds.cli.bench_large_batch import main

    out = tmp_path / "lb"
    argv = ["--quick", "--recipes", "sgd_fixed,sgd_linear,lars,lamb", "--lars-base-lr", "1e4", "--lamb-base-lr", "1e4"]
    code = main([*argv, "--out-dir", str(out)])
    assert code == 0, capsys.readouterr().err
    rep = json.loads((out / "large_batch.json").read_text())
    assert rep["sgd_lr"] == QUICK.sgd_lrs[0] and len(rep["sweep"]) == 1
    rows = {r["name"]: r for r in rep["rows"]}
    assert set(rows) == {"sgd_lr0.01_b2_s0", "sgd_fixed_b8_s0", "sgd_linear_b8_s0", "lars_b2_s0", "lars_b8_s0",
                         "lamb_b2_s0", "lamb_b8_s0"}
    assert rows["sgd_lr0.01_b2_s0"]["recipes"] == ["sgd_fixed", "sgd_linear"]
    expect_lr = {"sgd_lr0.01_b2_s0": 0.01, "sgd_fixed_b8_s0": 0.01, "sgd_linear_b8_s0": 0.04,
                 "lars_b2_s0": 1e4, "lars_b8_s0": 4e4, "lamb_b2_s0": 1e4, "lamb_b8_s0": 2e4}
    for name, r in rows.items():
        cfg = json.loads((out / "runs" / name / "config.json").read_text())
        assert cfg["resolved_ds_config"]["train_batch_size"] == r["global_batch"] == r["batch"]
        assert r["micro_batch"] == 2 and r["accum"] == r["batch"] // 2 and r["world_size"] == 1
        assert r["lr"] == pytest.approx(expect_lr[name])
        assert r["planned_steps"] == 16 // r["batch"]
        assert not (out / "runs" / name / "checkpoints").exists()      # deleted after the run
        if name.startswith("lamb"):
            assert r["status"] == "diverged" and r["exit_code"] == 3 and 1 <= r["diverged_at"] <= r["planned_steps"]
        elif name.startswith("lars"):
            assert r["status"] == "completed" and r["steps"] == 16 // r["batch"]   # the clipped trust ratio holds
        else:
            assert r["status"] == "completed" and r["clips_seen"] == 16 and r["steps"] == 16 // r["batch"]
            assert r["val_clips"] == 4
            # --eval-every 0.5: one evaluation mid-epoch on the capped subset (2 clips), the last on all 4
            assert [(h["step"], h["val_clips"]) for h in r["history"]] == [(r["steps"] // 2, 2), (r["steps"], 4)]
            assert "--eval-every" in r["cmd"] and "--eval-max-clips" in r["cmd"]
    md = (out / "large_batch.md").read_text()
    assert "diverged at" in md and (out / "large_batch.png").stat().st_size > 0
    assert rep["generator"]["noise"] == list(QUICK.noise) and rep["headroom"] is None
    assert rep["target_top1"] is not None and "time-to-accuracy" in md and "Projection:" in md
    assert "Calibration:" in md and rep["calibration"]["gain"] is None
    # a second call reuses every recorded run, and copies the report into a tracked folder
    assert main([*argv, "--out-dir", str(out), "--results-dir", str(tmp_path / "results")]) == 0
    again = json.loads((tmp_path / "results" / "large_batch.json").read_text())
    assert again["rows"] == rep["rows"] and (tmp_path / "results" / "large_batch.md").is_file()


def test_history_time_to_accuracy_calibration_and_projection(tmp_path):
    hist = [{"epoch": 0, "step": 10, "val_top1": 40.0, "val_top5": 100.0, "val_clips": 500},
            {"epoch": 0, "step": 20, "val_top1": 70.0, "val_top5": 100.0, "val_clips": 500},
            {"epoch": 1, "step": 40, "val_top1": 68.0, "val_top5": 100.0, "val_clips": 2000}]
    _write_run(tmp_path / "a", {"status": "completed", "steps": 40, "val_top1": 68.0, "best_val_top1": 68.0,
                                "val_clips": 2000, "history": hist})
    r = read_run(tmp_path / "a")
    assert [h["step"] for h in r["history"]] == [10, 20, 40] and r["best_val_top1"] == 70.0   # the best evaluation
    row = {**r, "name": "a", "recipes": ["lamb"], "batch": 32, "seed": 0, "wall_s": 1.0}
    assert time_to_accuracy(row, 66.5) == (20, 640) and time_to_accuracy(row, 71.0) == (None, None)
    assert time_to_accuracy({**row, "status": "diverged"}, 10.0) == (None, None)
    assert "| a | lamb | 32 | 0 | 0.04 | 40 | completed | 68.0 | 70.0 | 20 | 640 |" in runs_table([row], 66.5)

    def run(recipes, batch, seed, final, curve, status="completed", lr=0.01):
        return {"name": f"{recipes}_{batch}_{seed}", "recipes": list(recipes), "batch": batch, "global_batch": batch,
                "seed": seed, "status": status, "val_top1": final, "best_val_top1": final, "base_lr": lr,
                "diverged_at": 3 if status == "diverged" else None, "micro_batch": 8, "accum": batch // 8,
                "lr": lr, "warmup_steps": 1, "steps": 100, "wall_s": 1.0,
                "history": [{"step": s_, "val_top1": v} for s_, v in curve]}

    rows = [run(("sgd_fixed", "sgd_linear"), 8, 0, 80.0, [(100, 50.0), (200, 78.0), (400, 80.0)]),
            run(("lamb",), 8, 0, 70.0, [(400, 70.0)]),
            run(("lamb",), 512, 0, 77.0, [(4, 60.0), (8, 77.0)]), run(("lamb",), 512, 1, 76.5, [(8, 76.5)]),
            run(("lars",), 512, 0, 79.0, [(2, 79.0)]), run(("lars",), 512, 1, None, [], "diverged"),
            run((), 8, 0, 99.0, [(10, 99.0)])]                     # the headroom run sets no target
    target = target_top1(rows, 8)
    assert target == pytest.approx(0.95 * 80.0)
    pts = aggregate(rows, ["sgd_fixed", "lars", "lamb"], [8, 512], target)
    lamb512 = next(p for p in pts if p["recipe"] == "lamb" and p["batch"] == 512)
    assert lamb512["clips_to_target"] == [4096, 4096] and lamb512["reached"] == "2/2"
    proj = projection(pts, 8, 512)
    # lars: one seed diverged but its completed seed reached the target -> it qualifies with the fewest clips
    assert proj["recipe"] == "lars" and proj["base_recipe"] == "sgd_fixed" and proj["base_clips"] == 1600
    assert proj["inflation"] == pytest.approx(1024 / 1600)
    assert proj["projected_time_s"] == pytest.approx(proj["model_time_s"] * 1024 / 1600)
    assert proj["paper_time"] == "14 min 13 s" and "paper: 14 min 13 s" in proj["text"]
    none = projection(aggregate(rows[:2], ["sgd_fixed", "lamb"], [8, 512], target), 8, 512)
    assert none["recipe"] is None and none["projected_time_s"] is None and "no projection" in none["text"]

    # the guide's table: one line per recipe, batch and seed, outcomes and time to accuracy named
    table = readme_table(pts).splitlines()
    assert table[2] == "| sgd_fixed | 8 | 0 | 0.01 | 100 | completed | 80.0 | 80.0 | 200 / 1,600 |"
    assert "| lars | 512 | 0 | 0.01 | 100 | completed | 79.0 | 79.0 | 2 / 1,024 |" in table
    assert "| lars | 512 | 1 | 0.01 | 100 | diverged at step 3 | - | - | not reached |" in table
    assert "| lamb | 8 | 0 | 0.01 | 100 | completed | 70.0 | 70.0 | not reached |" in table
    assert len(table) == 2 + 6                       # sgd_fixed 8; lars 512 x2; lamb 8, 512 x2 (headroom: none)

    sweep = [dict(rows[0], base_lr=0.01), dict(rows[0], base_lr=0.03, val_top1=50.0, name="x")]
    c = calibration(sweep, dict(rows[-1], val_top1=86.0), 0.01, factor=4)
    assert (c["best_sgd_top1"], c["gain"], c["in_range"], c["gained"], c["passed"]) == (80.0, 6.0, True, True, True)
    c = calibration(sweep, dict(rows[-1], val_top1=83.0), 0.01, factor=4)
    assert c["gain"] == 3.0 and not c["passed"] and "NO" in c["text"]
    c = calibration([dict(sweep[0], val_top1=97.0)], None, 0.01, factor=0)
    assert not c["in_range"] and c["gain"] is None and not c["passed"] and "no headroom run" in c["text"]


def test_large_batch_guide_table_is_the_committed_report():
    """docs/large-batch.md shows the committed study, number for number: its table is
    :func:`readme_table` of ``results/large_batch/large_batch.json`` and its projection the report's.
    While no report is committed (the study has not finished), the guide must say so and show no
    result table."""
    repo = Path(__file__).resolve().parents[2]
    guide = (repo / "docs" / "large-batch.md").read_text()
    committed = repo / "results" / "large_batch" / "large_batch.json"
    if committed.is_file():
        rep = json.loads(committed.read_text())
        assert not rep["calibrate_only"]
        assert readme_table(rep["points"]) in guide
        assert rep["projection"]["text"] in guide
        assert rep["calibration"]["passed"] and "Calibration **passed**" in guide
    else:
        assert "**Results**: the study has not finished" in guide
        assert "| recipe | global batch | seed |" not in guide
        assert "has not finished" in (repo / "results" / "large_batch" / "README.md").read_text()


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
