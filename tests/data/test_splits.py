"""One dataset resolver (tsm_ds.data.splits.resolve_split) for training and evaluation.

The training command's resolution (``tsm_ds.cli.train.select_data``) and ``tsm-ds eval``'s
(``tsm_ds.inference.evaluate.load_records``) give the same path lists for a manifest tree (given as
the folder or as its videos/), a train/ + val/ tree, a hold-out tree and list files; a run's
config.json reproduces its split (val_fraction included); missing or empty data is named; the demo
dataset is only generated when the train command asks for it, and that is logged.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.cli import eval as eval_cli
from tsm_ds.cli.train import parse_config, select_data
from tsm_ds.config import Config, parse
from tsm_ds.config.commands import EVAL
from tsm_ds.config.record import run_record
from tsm_ds.data import splits
from tsm_ds.data.splits import resolve_split, split_from_record
from tsm_ds.inference.evaluate import find_run_config, load_records
from tsm_ds.utils.node import free_port

LOG = logging.getLogger("test_splits")

#: the validation clips of ../shared/data/videos: per class the last source_group (sorted)
SHARED_VAL = ["juggling_soccer_ball/v_SoccerJuggling_g24_c01_part1.avi",
              "juggling_soccer_ball/v_SoccerJuggling_g24_c01_part2.avi",
              "tai_chi/ta_chi_part1.mp4", "tai_chi/ta_chi_part2.mp4",
              "using_segway/WUzgd7C1pWA.mp4",
              "walking/openpose_street_video.mp4",
              "waving/TrumanShow_wave_f_nm_np1_fr_med_26.avi"]


def _touch(root: Path, rels: list[str]) -> None:
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")   # records need only paths


def _paths(records) -> list[str]:
    return [r.path for r in records]


def _train_cfg(argv: list[str]):
    """The train command's tree (flags, then $TSM_DS_DATA), its notes logged as the command does."""
    cfg, notes = parse_config(argv, environ=dict(os.environ))
    for note in notes:
        LOG.info("%s", note)
    return cfg


def _train_split(*flags: str, tmp_path: Path):
    split, _flip = select_data(_train_cfg(list(flags) + ["--output-dir", str(tmp_path / "runs")]), LOG)
    return split


def _records(argv: list[str]):
    """``tsm-ds eval``'s records for its command line (parsed as the command parses it)."""
    cfg = parse(EVAL, Config, argv)[0]
    return load_records(cfg.checkpoint.checkpoint, data=cfg.data.data, list_file=cfg.eval.list, root=cfg.eval.root,
                        split=cfg.eval.split, val_fraction=cfg.data.val_fraction)


def _eval(*flags: str) -> tuple[list[str], list[str] | None, dict]:
    records, names, info = _records(["--checkpoint", "unused.pt", "--out", "unused"] + list(flags))
    return _paths(records), names, info


def test_manifest_tree_as_folder_and_as_videos_folder(shared_data, tmp_path):
    expected_val = [str(shared_data / "videos" / p) for p in SHARED_VAL]
    classes = ["juggling_soccer_ball", "tai_chi", "using_segway", "walking", "waving"]
    for data in (shared_data, shared_data / "videos"):
        split = _train_split("--data", str(data), tmp_path=tmp_path)
        assert split.kind == "manifest" and split.class_names == classes
        assert _paths(split.val) == expected_val
        assert len(split.train) == 10 and not set(_paths(split.train)) & set(expected_val)
        for side in ([], ["--split", "val"]):     # a manifest carries its split: val by default
            paths, names, info = _eval("--data", str(data), *side)
            assert paths == expected_val and names == classes and info["split"] == "val"
        assert _eval("--data", str(data), "--split", "train")[0] == _paths(split.train)
        assert _eval("--data", str(data), "--split", "all")[0] == sorted(_paths(split.train) + expected_val)
    assert _paths(resolve_split(data=shared_data).train) == _paths(resolve_split(data=shared_data / "videos").train)


def test_train_val_folders(tmp_path):
    root = tmp_path / "tv"
    _touch(root, ["train/cat/c1.mp4", "train/cat/c2.mp4", "train/dog/d1.avi", "train/dog/notes.txt",
                  "val/cat/c9.mp4", "val/dog/d8.mkv", "val/dog/d9.mkv"])
    expected_val = [str(root / "val/cat/c9.mp4"), str(root / "val/dog/d8.mkv"), str(root / "val/dog/d9.mkv")]
    split = _train_split("--data", str(root), tmp_path=tmp_path)
    assert split.kind == "train_val_folders" and split.class_names == ["cat", "dog"]
    assert _paths(split.val) == expected_val and [r.label for r in split.val] == [0, 1, 1]
    assert _paths(split.train) == [str(root / "train/cat/c1.mp4"), str(root / "train/cat/c2.mp4"),
                                   str(root / "train/dog/d1.avi")]
    assert _eval("--data", str(root))[0] == expected_val          # val by default
    assert _eval("--data", str(root), "--split", "val")[0] == expected_val
    assert _eval("--data", str(root), "--split", "train")[0] == _paths(split.train)


def _holdout_tree(root: Path) -> None:
    _touch(root, [f"a/a{i}.mp4" for i in range(5)] + [f"b/b{i}.mp4" for i in range(4)] + ["c/only.mp4"])


def test_holdout_tree(tmp_path):
    root = tmp_path / "tree"
    _holdout_tree(root)
    # val_fraction 0.4: class a (5 files) round(2.0) = 2, b (4) round(1.6) = 2, c (1 file) none
    expected_val = [str(root / p) for p in ("a/a3.mp4", "a/a4.mp4", "b/b2.mp4", "b/b3.mp4")]
    split = _train_split("--data", str(root), "--val-fraction", "0.4", tmp_path=tmp_path)
    assert split.kind == "holdout" and split.class_names == ["a", "b", "c"]
    assert _paths(split.val) == expected_val
    assert _paths(split.train) == [str(root / p) for p in ("a/a0.mp4", "a/a1.mp4", "a/a2.mp4", "b/b0.mp4",
                                                          "b/b1.mp4", "c/only.mp4")]
    assert _eval("--data", str(root), "--split", "val", "--val-fraction", "0.4")[0] == expected_val
    assert _eval("--data", str(root), "--split", "train", "--val-fraction", "0.4")[0] == _paths(split.train)
    # no hold-out information on the command line: every video, as before (sorted by path)
    paths, names, info = _eval("--data", str(root))
    assert info["split"] == "all" and names == ["a", "b", "c"]
    assert paths == sorted(_paths(split.train) + expected_val) and len(paths) == 10
    # the default fraction 0.2 holds out 1 + 1 clips: another split, so the fraction matters
    assert _paths(resolve_split(data=root).val) == [str(root / "a/a4.mp4"), str(root / "b/b3.mp4")]


def _run_dir(tmp_path: Path, args_flags: list[str], name: str = "run") -> tuple[Path, object]:
    """A run folder with config.json as the train command writes it (the tree + split record)."""
    cfg = _train_cfg(args_flags + ["--output-dir", str(tmp_path / "runs")])
    split, flip = select_data(cfg, LOG)
    run = tmp_path / name
    (run / "checkpoints" / "step00000001").mkdir(parents=True)
    (run / "best_model.pt").write_bytes(b"")
    record = run_record(cfg, deepspeed_config="cpu_fp32.json", data_description=split.description,
                        split=split.as_dict(), flip=flip)
    (run / "config.json").write_text(json.dumps({**record, "class_names": split.class_names}, default=str))
    return run, split


def test_val_fraction_reproduced_from_config_json(tmp_path):
    root = tmp_path / "tree"
    _holdout_tree(root)
    run, split = _run_dir(tmp_path, ["--data", str(root), "--val-fraction", "0.4"])
    expected_val = [str(root / p) for p in ("a/a3.mp4", "a/a4.mp4", "b/b2.mp4", "b/b3.mp4")]
    assert _paths(split.val) == expected_val
    for ck in (run / "best_model.pt", run / "last_model.pt", run, run / "checkpoints",
               run / "checkpoints" / "step00000001"):
        assert find_run_config(ck) == run / "config.json"
        records, names, info = _records(["--checkpoint", str(ck), "--out", "unused"])
        assert _paths(records) == expected_val and names == ["a", "b", "c"]
        assert info["split"] == "val" and str(run / "config.json") in info["description"]
        assert info["run_split"]["val_fraction"] == 0.4 and info["run_split"]["kind"] == "holdout"
    assert _paths(_records(["--checkpoint", str(run), "--out", "u", "--split", "train"])[0]) == _paths(split.train)
    # a config.json without the split record gives the same records (from the data fields)
    old = json.loads((run / "config.json").read_text())
    del old["split"]
    assert _paths(split_from_record(old).val) == expected_val
    # so does a schema-1 config.json (tsm_ds <= 52ba896: flat "flags", with or without "split")
    legacy = {"flags": {"data": str(root), "val_fraction": 0.4, "train_list": None, "val_list": None,
                        "classes": None, "split": split.as_dict()}}
    assert _paths(split_from_record(legacy).val) == expected_val
    del legacy["flags"]["split"]
    assert _paths(split_from_record(legacy).val) == expected_val
    # data that now resolves differently is refused, not silently evaluated
    _touch(root, ["train/a/x.mp4", "val/a/y.mp4"])
    with pytest.raises(ValueError, match=r"split as 'holdout'.*now resolves as 'train_val_folders'"):
        split_from_record(json.loads((run / "config.json").read_text()))


def test_lists_relative_to_data(tmp_path):
    data = tmp_path / "clips"
    _touch(data, ["x/one.mp4", "x/two.mp4", "y/three.mp4"])
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "train.txt").write_text("x/one.mp4 0\ny/three.mp4 1\n")
    (lists / "val.txt").write_text("# held out\nx/two.mp4 0\n")
    (lists / "classes.txt").write_text("xx\nyy\n")
    flags = ["--data", str(data), "--train-list", str(lists / "train.txt"), "--val-list", str(lists / "val.txt"),
             "--classes", str(lists / "classes.txt")]
    run, split = _run_dir(tmp_path, flags)
    assert split.kind == "lists" and split.class_names == ["xx", "yy"]
    assert _paths(split.train) == [str(data / "x/one.mp4"), str(data / "y/three.mp4")]
    assert _paths(split.val) == [str(data / "x/two.mp4")]
    records, names, _ = _records(["--checkpoint", str(run / "best_model.pt"), "--out", "u"])
    assert _paths(records) == [str(data / "x/two.mp4")] and names == ["xx", "yy"]
    # without data, paths are relative to the list file's folder; class names default to class_<i>
    alone = resolve_split(train_list=lists / "train.txt")
    assert _paths(alone.train) == [str(lists / "x/one.mp4"), str(lists / "y/three.mp4")]
    assert alone.val == [] and alone.class_names == ["class_0", "class_1"]
    with pytest.raises(ValueError, match="without a training list"):
        resolve_split(data=data, val_list=lists / "val.txt")


def test_missing_or_empty_data_is_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=re.escape(f"data folder {missing} does not exist")):
        resolve_split(data=missing)
    with pytest.raises(FileNotFoundError, match=re.escape(f"data folder {missing} does not exist")):
        _eval("--data", str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=re.escape(f"{empty}: no class folders")):
        resolve_split(data=empty)
    _touch(empty, ["cls/readme.txt"])   # a class folder without videos
    with pytest.raises(ValueError, match=re.escape(str(empty)) + ": per-class hold-out .*: no training videos found"):
        resolve_split(data=empty)
    with pytest.raises(ValueError, match="no data given"):
        resolve_split()
    with pytest.raises(FileNotFoundError, match=r"no data given \(--data DIR or --list FILE\) .*config\.json "
                                                + re.escape(f"next to the checkpoint {tmp_path / 'x.pt'}")):
        _eval_in(tmp_path / "x.pt")
    with pytest.raises(ValueError, match="--split applies to --data"):
        _eval("--list", str(tmp_path / "l.txt"), "--split", "val")


def _eval_in(checkpoint: Path):
    return _records(["--checkpoint", str(checkpoint), "--out", "u"])


def test_demo_only_when_asked_and_logged(monkeypatch, tmp_path, caplog):
    calls = []

    def fake_demo(root, *, seed, clips):
        calls.append((Path(root), seed, clips))
        sp = resolve_split(data=tree)
        sp.demo = True
        return sp

    tree = tmp_path / "tree"
    _holdout_tree(tree)
    monkeypatch.setattr(splits, "demo_split", fake_demo)
    monkeypatch.setattr(splits, "DEFAULT_SHARED", tmp_path / "absent")
    monkeypatch.delenv("TSM_DS_DATA", raising=False)
    caplog.set_level(logging.INFO, logger=LOG.name)
    # data given (a flag, or $TSM_DS_DATA): never the demo
    split = _train_split("--data", str(tree), tmp_path=tmp_path)
    assert not split.demo and not calls
    monkeypatch.setenv("TSM_DS_DATA", str(tree))
    split = _train_split(tmp_path=tmp_path)
    assert not split.demo and not calls and split.data == str(tree)
    assert f"no --data given: using {tree} ($TSM_DS_DATA)" in caplog.text
    # the resolver itself never falls back to generated data
    with pytest.raises(ValueError, match="no data given"):
        resolve_split()
    assert not (tmp_path / "runs").exists()
    # nothing given and nothing found: the train command asks for the demo and says so
    monkeypatch.delenv("TSM_DS_DATA")
    caplog.clear()
    cfg = _train_cfg(["--output-dir", str(tmp_path / "runs"), "--demo-clips", "3", "--seed", "5"])
    split, flip = select_data(cfg, LOG)
    assert calls == [(tmp_path / "runs" / "demo_data", 5, 3)] and split.demo and not flip
    assert "using the generated demo dataset in" in caplog.text
    assert "demo dataset: direction classes, so horizontal flip is turned off" in caplog.text
    assert cfg.data.flip and cfg.data.data is None and cfg.data.train_list is None   # the tree untouched


# ------------------------------------------------------------------------------------------------
# end to end: a tiny training run, then tsm-ds eval with no data flag


@pytest.mark.slow
def test_eval_checkpoint_without_data_flag_uses_the_runs_validation_clips(tmp_path, capsys):
    import csv

    import numpy as np

    from tsm_ds.data.testvideo import write_numbered_video

    tree = tmp_path / "tree"
    for cls in ("left", "right"):
        for i in range(4):
            (tree / cls).mkdir(parents=True, exist_ok=True)
            write_numbered_video(tree / cls / f"{cls}{i}.mp4", 8, width=128, height=32)
    expected_val = [str(tree / p) for p in ("left/left2.mp4", "left/left3.mp4", "right/right2.mp4",
                                            "right/right3.mp4")]   # val_fraction 0.5; 0.2 would hold out 2
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tsm_ds.train", "--deepspeed_config", "cpu_fp32", "--data", str(tree),
           "--val-fraction", "0.5", "--arch", "resnet18", "--num-segments", "2", "--img-size", "32",
           "--batch-size", "2", "--micro-batch-size", "2", "--max-steps", "1", "--epochs", "1", "--num-workers",
           "0", "--output-dir", str(tmp_path / "runs"), "--run-name", "tiny", "--no-progress"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:]
    run = tmp_path / "runs" / "tiny"
    rec = json.loads((run / "config.json").read_text())["split"]
    assert (rec["kind"], rec["val_fraction"], rec["val_clips"]) == ("holdout", 0.5, 4)

    capsys.readouterr()
    assert eval_cli.main(["--checkpoint", str(run / "best_model.pt"), "--out", str(tmp_path / "e1")]) == 0
    out = capsys.readouterr().out
    assert f"read from {run / 'config.json'}" in out and "4 videos" in out
    assert eval_cli.main(["--checkpoint", str(run / "best_model.pt"), "--data", str(tree), "--split", "val",
                          "--val-fraction", "0.5", "--out", str(tmp_path / "e2")]) == 0
    rows1 = list(csv.DictReader((tmp_path / "e1" / "predictions.csv").open()))
    rows2 = list(csv.DictReader((tmp_path / "e2" / "predictions.csv").open()))
    assert [r["path"] for r in rows1] == [r["path"] for r in rows2] == expected_val
    np.testing.assert_array_equal(np.load(tmp_path / "e1" / "scores.npz")["scores"],
                                  np.load(tmp_path / "e2" / "scores.npz")["scores"])
    meta = json.loads((tmp_path / "e1" / "metrics.json").read_text())["meta"]
    assert meta["data"] == str(run / "config.json") and meta["split"] == "val"
