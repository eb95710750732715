"""``tsm-ds demo``: the launcher commands it builds, and one tiny end-to-end run (slow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tsm_ds.bench import demo
from tsm_ds.cli import demo as demo_cli


def _args(*extra: str):
    return demo_cli.build_parser().parse_args(["--out", "unused", *extra])


def _script_args(cmd: list[str]) -> list[str]:
    """What follows the training module (``--module tsm_ds.train``) in a launcher command."""
    assert cmd[cmd.index(demo.TRAIN_MODULE) - 1] == "--module"
    return cmd[cmd.index(demo.TRAIN_MODULE) + 1:]


def test_tsm_and_tsn_commands_differ_only_in_the_shift_and_run_name(tmp_path):
    data = {"train_list": str(tmp_path / "train.txt"), "val_list": str(tmp_path / "val.txt"),
            "root": str(tmp_path)}
    args = _args("--epochs", "3", "--batch-size", "12", "--nproc", "3")
    settings = demo_cli.training_settings(args)
    tsm = demo.train_command("tsm", settings, data, tmp_path / "runs")
    tsn = demo.train_command("tsn", settings, data, tmp_path / "runs")
    # the launcher: 3 ranks on this machine
    assert tsm[tsm.index("--num_gpus") + 1] == "3"
    a, b = _script_args(tsm), _script_args(tsn)
    assert len(a) == len(b)
    diff = {(x, y) for x, y in zip(a, b) if x != y}
    assert diff == {("bidirectional", "none"), ("tsm", "tsn")}
    # and train.py's own parser takes every flag, with flip off and the per-rank micro-batch
    from tsm_ds.train import build_parser
    parsed = build_parser().parse_args(a)
    assert parsed.no_flip is True
    assert parsed.shift == "bidirectional" and build_parser().parse_args(b).shift == "none"
    assert (parsed.batch_size, parsed.micro_batch_size, parsed.epochs) == (12, 4, 3)
    assert parsed.train_list == data["train_list"] and parsed.val_list == data["val_list"]
    assert Path(parsed.deepspeed_config).name == "cpu_demo_adamw.json"
    assert Path(parsed.deepspeed_config).is_file()


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
    args = _args()
    assert (args.num_frames, args.num_segments, tuple(args.speed)) == (16, 8, (1.5, 2.5))


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
