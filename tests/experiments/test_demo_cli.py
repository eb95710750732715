"""``tsm-ds demo``: the launcher commands it builds, and one tiny end-to-end run (slow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tsm_ds.cli import demo as demo_cli
from tsm_ds.config import Config, parse
from tsm_ds.config.commands import TRAIN
from tsm_ds.experiments import demo


def _cfg(*extra: str) -> Config:
    return parse(demo_cli.COMMAND, Config, ["--out", "unused", *extra])[0]


def _script_args(cmd: list[str]) -> list[str]:
    """What follows the training module (``--module tsm_ds.train``) in a launcher command."""
    assert cmd[cmd.index(demo.TRAIN_MODULE) - 1] == "--module"
    return cmd[cmd.index(demo.TRAIN_MODULE) + 1:]


def test_tsm_and_tsn_commands_differ_only_in_the_shift_and_run_name(tmp_path):
    data = {"train_list": str(tmp_path / "train.txt"), "val_list": str(tmp_path / "val.txt"),
            "root": str(tmp_path)}
    cfg = _cfg("--epochs", "3", "--batch-size", "12", "--nproc", "3")
    settings = demo_cli.demo_settings(cfg)
    tsm = demo.train_command("tsm", settings, data, tmp_path / "runs")
    tsn = demo.train_command("tsn", settings, data, tmp_path / "runs")
    # the launcher: 3 ranks on this machine
    assert tsm[tsm.index("--num_gpus") + 1] == "3"
    a, b = _script_args(tsm), _script_args(tsn)
    assert len(a) == len(b)
    diff = {(x, y) for x, y in zip(a, b) if x != y}
    assert diff == {("bidirectional", "none"), ("tsm", "tsn")}
    # and the training command's own parser takes every flag, with flip off and the per-rank micro-batch
    parsed, _ = parse(TRAIN, Config, a)
    assert parsed.data.flip is False and parsed.logging.progress is False
    assert parsed.model.shift == "bidirectional" and parse(TRAIN, Config, b)[0].model.shift == "none"
    s = parsed.schedule
    assert (s.batch_size, s.micro_batch_size, s.epochs, s.lr, s.warmup_steps) == (12, 4, 3, 3e-4, 20)
    assert (parsed.model.arch, parsed.data.img_size, parsed.model.dropout) == ("resnet18", 64, 0.0)
    assert parsed.data.train_list == data["train_list"] and parsed.data.val_list == data["val_list"]
    assert Path(parsed.engine.deepspeed_config).name == "cpu_demo_adamw.json"
    assert Path(parsed.engine.deepspeed_config).is_file()


def test_demo_settings_defaults_are_the_commands():
    """The library's defaults (run_demo without arguments) are ``tsm-ds demo``'s."""
    assert demo_cli.demo_settings(_cfg()) == demo.DemoSettings()
    assert demo.DemoSettings().deepspeed_config == demo.DEFAULT_RECIPE == "cpu_demo_adamw"
    # the old spelling of the recipe flag still works
    assert _cfg("--deepspeed-config", "cpu_fp32").engine.deepspeed_config == "cpu_fp32"


def test_bad_arguments_return_2(capsys):
    assert demo_cli.main(["--models", "tsm,i3d"]) == 2
    assert "i3d" not in demo.MODELS and "--models" in capsys.readouterr().err
    assert demo_cli.main(["--batch-size", "5", "--nproc", "2"]) == 2
    assert "not divisible" in capsys.readouterr().err


def test_videos_no_longer_than_the_clip_are_refused(tmp_path, capsys):
    """8-frame videos with 8 segments: validation clips would be frame 0 repeated (no motion)."""
    assert demo_cli.main(["--out", str(tmp_path / "d"), "--num-frames", "8", "--num-segments", "8",
                          "--dry-run"]) == 2
    assert "--num-frames 8 must exceed --num-segments 8" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before generating anything
    cfg = _cfg()
    assert (cfg.demo.num_frames, cfg.model.num_segments, tuple(cfg.demo.speed)) == (16, 8, (1.5, 2.5))
    assert tuple(_cfg("--speed", "1", "2").demo.speed) == (1.0, 2.0)


def test_results_table_reports_both_models_and_chance():
    rows = [{"model": "tsm", "shift": "bidirectional", "val_top1": 95.5, "best_val_top1": 96.0,
             "val_clips": 200, "steps": 200, "wall_s": 151.2},
            {"model": "tsn", "shift": "none", "val_top1": 27.0, "best_val_top1": 30.5,
             "val_clips": 200, "steps": 200, "wall_s": 140.0}]
    table = demo.format_table(rows, 4)
    lines = table.splitlines()
    assert lines[2] == "| TSM | bidirectional | 95.5% | 96.0% | 200 | 200 | 151 s |"
    assert lines[3] == "| TSN | none | 27.0% | 30.5% | 200 | 200 | 140 s |"
    assert "Chance: 25.0% (4 classes)" in table


@pytest.mark.slow
def test_demo_end_to_end_through_the_launcher(tmp_path, capsys):
    """Two launcher runs (2 ranks each) of one optimizer step on 8 clips: the plumbing, not the
    accuracy (that needs minutes; see the README's demo section)."""
    out = tmp_path / "demo"
    code = demo_cli.main(["--out", str(out), "--train-per-class", "2", "--val-per-class", "1",
                          "--num-frames", "10", "--epochs", "1", "--batch-size", "8", "--warmup-steps", "1",
                          "--num-workers", "0"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((out / "demo_results.json").read_text())
    assert [r["model"] for r in report["rows"]] == ["tsm", "tsn"]
    for row in report["rows"]:
        # 8 training clips / (4 per rank x 2 ranks) = 1 step; 4 validation clips, each once
        assert row["steps"] == 1 and row["val_clips"] == 4
        assert row["val_top1"] in (0.0, 25.0, 50.0, 75.0, 100.0)
        assert (Path(row["run_dir"]) / "best_model.pt").is_file()
    assert report["chance_top1"] == 25.0
    assert "| TSM | bidirectional |" in printed and "| TSN | none |" in printed
    assert (out / "demo_results.md").read_text().startswith("# tsm-ds demo")
