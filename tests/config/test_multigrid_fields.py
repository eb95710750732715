"""The multigrid options of the schedule section: flags of training and ``tsm-ds config``, defaults off,
bad values refused naming the flag, recorded in config.json (older records get the defaults)."""
from __future__ import annotations

import pytest

from tsm_ds.config import Config, parse, to_argv
from tsm_ds.config.commands import TRAIN
from tsm_ds.config.fields import build_parser
from tsm_ds.config.record import tree_from_record, tree_to_record
from tsm_ds.config.tree import MULTIGRID_CHOICES
from tsm_ds.engine.loop.multigrid import MODES, build_schedule


def test_defaults_are_off_and_the_flags_are_in_the_help():
    cfg, _ = parse(TRAIN, Config, [])
    s = cfg.schedule
    assert (s.multigrid, s.multigrid_final_stage, s.multigrid_min_frames, s.multigrid_epoch_factor) == \
        ("none", True, 2, 1.5)
    assert MULTIGRID_CHOICES == MODES
    text = build_parser(TRAIN, Config).format_help()   # tsm-ds train and python -m tsm_ds.train
    for flag in ("--multigrid {none,long,short,long+short}", "--multigrid-final-stage, --no-multigrid-final-stage",
                 "--multigrid-min-frames", "--multigrid-epoch-factor"):
        assert flag in text, flag


def test_values_parse_round_trip_and_feed_the_schedule():
    cfg, given = parse(TRAIN, Config, ["--no-multigrid-final-stage", "--multigrid-min-frames", "3",
                                       "--multigrid-epoch-factor", "1"])
    assert given == {"schedule.multigrid_final_stage", "schedule.multigrid_min_frames",
                     "schedule.multigrid_epoch_factor"}
    opts = cfg.schedule.multigrid_options()
    assert opts == {"mode": "none", "final_stage": False, "min_frames": 3, "epoch_factor": 1.0}
    argv = to_argv(TRAIN, Config, cfg)
    assert argv == ["--no-multigrid-final-stage", "--multigrid-min-frames", "3", "--multigrid-epoch-factor", "1.0"]
    back, _ = parse(TRAIN, Config, argv)
    assert tree_to_record(back) == tree_to_record(cfg)
    sched = build_schedule(frames=8, crop=224, global_batch=64, epochs=50, lr_steps=[20, 40],
                           **{**opts, "mode": "long"})
    assert sched.epochs == 50 and len(sched.stages) == 12   # no final stage, epoch factor 1


def test_bad_values_name_the_flag(capsys):
    assert parse(TRAIN, Config, ["--multigrid", "long+short"])[0].schedule.multigrid == "long+short"
    for argv, msg in ((["--multigrid", "longer"], "--multigrid 'longer': choose one of"),
                      (["--precise-bn-batches", "-1"], "--precise-bn-batches -1: must be >= 0"),
                      (["--multigrid-min-frames", "0"], "--multigrid-min-frames 0: must be >= 1"),
                      (["--multigrid-epoch-factor", "0"], "--multigrid-epoch-factor 0: must be > 0")):
        with pytest.raises(SystemExit):
            parse(TRAIN, Config, argv)
        assert msg in capsys.readouterr().err


def test_config_json_records_them_and_older_records_get_the_defaults():
    cfg, _ = parse(TRAIN, Config, ["--multigrid-min-frames", "4"])
    rec = tree_to_record(cfg)
    assert {k: v for k, v in rec["schedule"].items() if k.startswith("multigrid")} == \
        {"multigrid": "none", "multigrid_final_stage": True, "multigrid_min_frames": 4, "multigrid_epoch_factor": 1.5}
    old = {k: dict(v) for k, v in rec.items()}
    for k in [k for k in old["schedule"] if k.startswith("multigrid")]:
        del old["schedule"][k]
    back, notes = tree_from_record({"schema_version": 2, "config": old})
    assert back.schedule.multigrid_min_frames == 2 and back.schedule.multigrid == "none" and notes == []
