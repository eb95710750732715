"""Files users edit by hand are checked at the door: a run's config.json and an engine JSON's
``tsm_ds`` block with a wrong type, a value outside its choices or an unknown key end with exit 2
and one line naming the file and the key (no traceback); a removed option of an old run is a
WARNING."""
from __future__ import annotations

import json
import logging

import pytest

from tsm_ds.config import Config, ConfigTreeError
from tsm_ds.config.record import tree_from_record, tree_to_record


def _record(**changes):
    rec = {"schema_version": 2, "config": tree_to_record(Config())}
    for path, v in changes.items():
        sec, name = path.split("__")
        rec["config"][sec][name] = v
    return rec


@pytest.mark.parametrize("path,value,expected", [
    ("model__num_segments", "eight", "expected an integer, found str"),
    ("data__img_size", 1.5, "expected an integer, found float"),
    ("data__flip", "yes", "expected true or false, found str"),
    ("schedule__lr_steps", ["20", 40], "expected a list of float"),
    ("model__shift", "sideways", "expected one of bidirectional, online, none"),
    ("schedule__epochs", None, "expected int, found null"),
])
def test_wrong_types_in_a_run_config_name_file_and_key(path, value, expected):
    with pytest.raises(ConfigTreeError) as e:
        tree_from_record(_record(**{path: value}), source="RUN/config.json")
    key = "config." + path.replace("__", ".")
    assert str(e.value).startswith(f"RUN/config.json: {key} = ") and expected in str(e.value)
    assert "\n" not in str(e.value)


def test_good_values_pass_and_ints_are_numbers():
    cfg, notes = tree_from_record(_record(schedule__lr=1, schedule__lr_steps=[20, 40.5], model__num_segments=16))
    assert cfg.schedule.lr == 1.0 and isinstance(cfg.schedule.lr, float) and cfg.model.num_segments == 16
    assert cfg.schedule.lr_steps == [20, 40.5] and notes == []


def test_train_with_a_hand_edited_config_exits_2_with_one_line(tmp_path, caplog):
    from tsm_ds.cli import train

    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(_record(model__num_segments="eight")))
    caplog.set_level(logging.INFO)
    assert train.main(["--config", str(bad), "--output-dir", str(tmp_path)]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"{bad}: config.model.num_segments = \"eight\": expected an integer, found str"]
    old = tmp_path / "old.json"   # an option removed since: named in a WARNING, the run goes on to its data
    rec = _record()
    rec["config"]["model"]["retired_option"] = 3
    old.write_text(json.dumps(rec))
    caplog.clear()
    train.main(["--config", str(old), "--output-dir", str(tmp_path), "--data", str(tmp_path / "none")])
    assert any(r.levelno == logging.WARNING
               and "config.model.retired_option is not an option any more" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d["tsm_ds"]["lr_schedule"].update(warmup_steps="ten"),
     'tsm_ds.lr_schedule.warmup_steps = "ten": expected an integer or "auto", found str'),
    (lambda d: d["tsm_ds"]["lr_scaling"].update(rule="quadratic"),
     'tsm_ds.lr_scaling.rule = "quadratic": expected "linear" or "sqrt" or "none", found str'),
    (lambda d: d["tsm_ds"].update(lr_shedule={"type": "step"}), "tsm_ds.lr_shedule: unknown key (a typo?)"),
    (lambda d: d["tsm_ds"]["lr_schedule"].update(warmup_step=3), "tsm_ds.lr_schedule.warmup_step: unknown key"),
    (lambda d: d["tsm_ds"].update(zero_init_residual="yes"), "expected true or false, found str"),
])
def test_engine_json_tsm_block_checked_at_load(tmp_path, capsys, edit, expected):
    from tsm_ds.cli import config as config_cli
    from tsm_ds.engine.config.recipes import ConfigError, load_config

    d = load_config("cpu_sgd_large_batch")
    edit(d)
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="^" + str(f).replace(".", r"\.")):
        load_config(f)
    assert config_cli.main(["--deepspeed_config", str(f), "--world-size", "2", "--train-samples", "64"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
