"""tsm-ds bench multigrid (tsm_ds.experiments.multigrid_study): the runs and their training commands,
precise BatchNorm for a one-shape run, the schedule's steps and costs, the timeline (evaluations
apart), time to accuracy, the verdict by the large-batch study's pass rule, the estimate in --help, no
absolute path in the committed results, and --quick end to end through the trainer."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tsm_ds.config import Config, parse
from tsm_ds.config.commands import TRAIN
from tsm_ds.experiments.multigrid_study import plan, report
from tsm_ds.experiments.multigrid_study.plan import QUICK, MGSettings

REPO = Path(__file__).resolve().parents[2]


def test_precise_bn_is_on_with_multigrid_and_wherever_it_is_given():
    """Default: 200 micro-batches with --multigrid, off without; a value given applies to a one-shape run."""
    def n(*argv):
        return parse(TRAIN, Config, ["--arch", "resnet18", *argv])[0].schedule.precise_bn()

    assert (n(), n("--multigrid", "long"), n("--precise-bn-batches", "50")) == (0, 200, 50)
    assert n("--multigrid", "long", "--precise-bn-batches", "0") == 0


def test_runs_commands_and_recipe(tmp_path):
    s = MGSettings()
    assert [a.name for a in plan.arms(s)] == ["base_s0", "mg_x1.5_s0", "mg_x1_s0", "base_s1", "mg_x1.5_s1", "mg_x1_s1"]
    recipe = plan.write_recipe(tmp_path, s)
    cfg_json = json.loads(recipe.read_text())["tsm_ds"]
    assert cfg_json["lr_scaling"] == {"rule": "linear", "base_lr": 0.003, "base_batch": 8}
    assert "zero_init_residual" not in cfg_json
    assert cfg_json["lr_schedule"]["type"] == "step" and cfg_json["lr_schedule"]["gamma"] == 0.1
    data = {"train_list": "data/train.txt", "val_list": "data/val.txt", "root": "data"}
    base, mg = (plan.train_command(a, s, "recipes/r.json", data, Path("runs")) for a in plan.arms(s)[:2])
    b, m = parse(TRAIN, Config, base[3:])[0], parse(TRAIN, Config, mg[3:])[0]
    for c in (b, m):   # the large-batch study's task and base run
        assert (c.model.arch, c.model.num_segments, c.data.img_size, c.data.flip) == ("resnet18", 4, 32, False)
        assert (c.schedule.batch_size, c.schedule.micro_batch_size, c.schedule.epochs) == (8, 8, 10)
        assert (c.schedule.lr_steps, c.schedule.warmup_epochs, c.schedule.precise_bn()) == ([6.0, 8.0], 0.0, 50)
        assert c.model.ghost_bn_clips is None and c.schedule.eval_max_clips == 500
        assert c.schedule.head_lr_mults == "on"
    assert (b.schedule.multigrid, m.schedule.multigrid, m.schedule.multigrid_epoch_factor) == ("none", "long", 1.5)
    assert b.output.run_name == "base_s0" and m.output.run_name == "mg_x1.5_s0"


def test_steps_and_costs_are_the_schedules():
    """Base: 10 epochs x 640 steps of 8 x 4 x 32 px; multigrid: the trainer's schedule (4,000 / 2,720 steps)."""
    s = MGSettings()
    base, mg15, mg10 = (plan.step_costs(s, f) for f in (None, 1.5, 1.0))
    assert len(base) == 6400 and set(base) == {(8, 4, 32)}
    assert len(mg15) == plan.schedule_for(s, 1.5).total_steps(5120) == 4000
    assert len(mg10) == plan.schedule_for(s, 1.0).total_steps(5120) == 2720
    assert mg15[0] == (32, 2, 24) and mg15[-1] == (8, 4, 32)          # first stage, final stage
    assert plan.cost_to_step(base, 6400) == 6400 * 8 * 4 * 32 ** 2
    assert plan.cost_to_step(mg15, 2) == 2 * 32 * 2 * 24 ** 2
    s.check()
    with pytest.raises(ValueError, match="lr_steps"):
        MGSettings(lr_steps=(6.0, 12.0)).check()


def _hist(*rows):
    return [{"step": st, "val_top1": t, "val_clips": 500, "wall_s": w, "eval_s": e, "precise_bn_s": 1.0,
             "cpu_s": w / 2, "eval_cpu_s": e / 2} for st, t, w, e in rows]


def test_timeline_leaves_evaluations_out_and_time_to_target():
    tl = report.timeline(_hist((320, 20.0, 100.0, 10.0), (640, 50.0, 210.0, 10.0), (960, 60.0, 320.0, 30.0)))
    assert [h["train_s"] for h in tl] == [100.0, 200.0, 300.0]
    assert [h["train_cpu_s"] for h in tl] == [50.0, 100.0, 150.0]   # CPU seconds, evaluations' CPU apart
    row = {"status": "completed", "timeline": tl, "steps": 960, "planned_steps": 6400, "epoch_factor": None}
    m = report.run_metrics(row, MGSettings(), target=50.0)
    assert m["train_s"] == 300.0 and m["eval_s"] == 50.0 and m["precise_bn_s"] == 3.0 and m["train_cpu_s"] == 150.0
    assert m["to_target"] == {"train_s": 200.0, "train_cpu_s": 100.0, "step": 640, "top1": 50.0,
                              "cost": 640 * 8 * 4 * 1024}
    assert m["schedule_ok"] is True and report.run_metrics(row, MGSettings(), target=61.0)["to_target"] is None


def _row(arm, seed, top1, train_s, *, factor=None, steps=6400, cpu=None):
    hit = {"train_s": train_s / 2, "train_cpu_s": None if cpu is None else cpu / 2, "step": steps // 2,
           "cost": steps * 5, "top1": top1}
    return {"name": f"{arm}_s{seed}", "arm": arm, "seed": seed, "status": "completed", "val_top1": top1,
            "epoch_factor": factor, "steps": steps,
            "metrics": {"train_s": train_s, "train_cpu_s": cpu, "steps": steps, "cost": steps * 10, "to_target": hit}}


def test_verdict_is_the_large_batch_pass_rule_and_the_speed_goal():
    s = MGSettings()
    rows = [_row("base", 0, 80.0, 1000.0), _row("base", 1, 82.0, 1000.0),
            _row("mg_x1.5", 0, 80.5, 600.0, factor=1.5, steps=4000), _row("mg_x1.5", 1, 81.0, 640.0, factor=1.5,
                                                                             steps=4000),
            _row("mg_x1", 0, 70.0, 420.0, factor=1.0, steps=2720)]
    v = report.verdicts(rows, s)
    a = v["arms"]["mg_x1.5"]
    assert v["target_top1"] == 81.0 and a["diff"] == pytest.approx(-0.25)
    # SE: the seeds' spread (base sd 1.41, arm sd 0.35) against the binomial floor on 2,000 clips x 2
    se_seeds = ((2.0 / 2) + (0.125 / 2)) ** 0.5
    assert a["se"] == pytest.approx(se_seeds) and a["tolerance"] == pytest.approx(2 * se_seeds)
    assert a["verdict"] == "pass" and a["speed"] == pytest.approx(0.62) and a["steps_ratio"] == 0.625
    assert a["goal"] == "met" and a["to_target_speed"] == pytest.approx(0.31)
    assert v["arms"]["mg_x1"]["goal"] == "pending"           # one seed of two
    slow = [*rows[:2], _row("mg_x1.5", 0, 81.0, 700.0, factor=1.5), _row("mg_x1.5", 1, 81.0, 700.0, factor=1.5)]
    assert report.verdicts(slow, s)["arms"]["mg_x1.5"]["goal"] == "missed"
    # CPU seconds where recorded decide (a co-tenant slowed the base's wall time, not its CPU time)
    cpu = [_row("base", 0, 80.0, 2000.0, cpu=1000.0), _row("base", 1, 82.0, 1000.0, cpu=1000.0),
           _row("mg_x1.5", 0, 80.5, 600.0, factor=1.5, cpu=700.0), _row("mg_x1.5", 1, 81.0, 640.0, factor=1.5,
                                                                          cpu=700.0)]
    a = report.verdicts(cpu, s)["arms"]["mg_x1.5"]
    assert a["speed"] == pytest.approx(620 / 1500) and a["speed_cpu"] == pytest.approx(0.7) and a["goal"] == "missed"
    assert "training CPU time 0.70x" in a["goal_text"] and a["to_target_speed"] == pytest.approx(0.35)
    md = report.verdict_table(report.verdicts(rows, s)) + report.runs_table(rows)
    assert "| mg_x1.5 | 2 | 80.8 | 81.0 | -0.2 |" in md and "**met**" in md and "| - (0.62) |" in md


def test_help_shows_the_libraries_estimate():
    from tsm_ds.config import tools

    text = plan.estimate_text(MGSettings())
    assert text in tools.MULTIGRID_ESTIMATE in tools.BENCH_MULTIGRID.epilog
    est = plan.estimate_seconds(MGSettings())
    assert est["runs"] == 6 and est["cpu_s"] <= 2.5 * 3600   # the brief: about 2 h of one core


def test_cli_settings_of_the_command_line():
    from tsm_ds.cli.bench_multigrid import COMMAND, settings_from

    def settings(*argv):
        return settings_from(parse(COMMAND, Config, list(argv))[0])

    assert settings() == MGSettings()
    assert settings("--quick") == QUICK
    s = settings("--epochs", "12", "--lr-steps", "8", "10", "--lr", "0.01", "--seeds", "3",
                 "--epoch-factors", "1.5", "--precise-bn-batches", "20", "--multigrid", "long+short")
    assert (s.epochs, s.lr_steps, s.lr, s.seeds, s.epoch_factors, s.precise_bn_batches, s.mode) == (
        12, (8.0, 10.0), 0.01, (3,), (1.5,), 20, "long+short")


#: an absolute path of a machine (as tests/experiments/test_large_batch.py refuses under results/)
_ABS = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|root|Users|opt|mnt|usr|var|data|scratch|private)/")


def test_committed_multigrid_results_hold_no_absolute_path():
    found = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "results" / "multigrid").rglob("*"))
             if p.is_file() and p.suffix in (".json", ".md")
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if _ABS.search(line)]
    assert not found, found[:5]


@pytest.mark.slow
def test_quick_end_to_end_through_the_trainer(tmp_path, capsys):
    """--quick: the base and one multigrid arm through tsm_ds.train; precise BatchNorm before every
    evaluation of both; rows, report, publish; --runs takes one run (as a second process would) and
    the next call the rest; a rerun starts no run."""
    from tsm_ds.cli.bench_multigrid import main

    out = tmp_path / "mg"
    assert main(["--quick", "--out-dir", str(out), "--runs", "nope_s0"]) == 2
    assert "--runs nope_s0: not a run of this study; its runs: base_s0, mg_x1.5_s0" in capsys.readouterr().err
    assert not out.exists()
    assert main(["--quick", "--out-dir", str(out), "--runs", "mg_x1.5_s0"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (out / "rows").iterdir()) == ["mg_x1.5_s0.json"]
    assert json.loads((out / "multigrid.json").read_text())["landed"] == 1
    capsys.readouterr()
    assert main(["--quick", "--out-dir", str(out), "--results-dir", str(tmp_path / "res")]) == 0, \
        capsys.readouterr().err
    assert re.findall(r"^(\S+): starting", capsys.readouterr().out, re.M) == ["base_s0"]   # the other one landed
    rep = json.loads((out / "multigrid.json").read_text())
    assert rep["landed"] == 2 and rep["complete"] and rep["verdicts"]["arms"]["mg_x1.5"]["goal"] in ("met", "missed")
    for r in rep["rows"]:
        assert r["status"] == "completed" and r["metrics"]["schedule_ok"]
        assert r["timeline"] and all(h["precise_bn_s"] is not None for h in r["timeline"])   # the base too
        assert all(h["train_cpu_s"] > 0 and h["eval_cpu_s"] > 0 for h in r["timeline"])
        assert r["shapes"] and r["metrics"]["train_s"] > 0
    assert {(s["frames"], s["crop"], s["clips"]) for s in rep["rows"][1]["shapes"]} == {(2, 24, 4), (2, 32, 2)}
    assert (tmp_path / "res" / "rows" / "base_s0.json").is_file()
    assert not _ABS.search((tmp_path / "res" / "multigrid.json").read_text().replace(str(tmp_path), "<tmp>"))
    capsys.readouterr()
    assert main(["--quick", "--out-dir", str(out)]) == 0
    assert "starting" not in capsys.readouterr().out


def test_guide_and_readme_show_the_committed_report():
    """docs/multigrid.md's report block is :func:`guide_block` of ``results/multigrid/multigrid.json``
    (number for number), README's multigrid line says how many runs have landed, and the pilot the
    estimate rests on is committed."""
    rep = json.loads((REPO / "results" / "multigrid" / "multigrid.json").read_text())
    assert report.guide_block(rep) in (REPO / "docs" / "multigrid.md").read_text()
    row = next(ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("| multigrid"))
    assert report.landed_text(rep) in row and "docs/multigrid.md#what-it-did-here" in row
    pilot = json.loads((REPO / "results" / "multigrid" / "pilot.json").read_text())["step_s"]
    assert (pilot["4x32x8"]["train_s_per_step"], pilot["2x24x32"]["train_s_per_step"]) == (
        plan.COST_S["base_step"], plan.COST_S["small_step"])


def test_isolation_run_is_the_cut_base_and_the_guide_quotes_it():
    """results/multigrid/isolation/base_e6_s0.json is the base recipe at 6 epochs (lr steps 3.6, 4.8)
    and docs/multigrid.md quotes its top-1, steps and training CPU seconds."""
    row = json.loads((REPO / "results" / "multigrid" / "isolation" / "base_e6_s0.json").read_text())
    c = parse(TRAIN, Config, row["cmd"][3:])[0]
    assert (c.schedule.epochs, c.schedule.lr_steps, c.schedule.multigrid) == (6, [3.6, 4.8], "none")
    assert (c.model.arch, c.model.num_segments, c.data.img_size, c.schedule.batch_size) == ("resnet18", 4, 32, 8)
    assert row["status"] == "completed" and row["steps"] == 3840 and row["val_clips"] == 2000
    guide = " ".join((REPO / "docs" / "multigrid.md").read_text().split())
    cpu = row["timeline"][-1]["train_cpu_s"]
    assert f"**{row['val_top1']:.1f} %** on all 2,000 clips in {cpu:.0f} training CPU seconds" in guide
