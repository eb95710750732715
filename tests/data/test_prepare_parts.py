"""``tsm-ds prepare`` in parts (``--part I/N``, SLURM array tasks) and ``--merge`` on tiny synthesised
trees: the split, resuming a part, the merge against a one-node prepare, the merge's refusals."""
from __future__ import annotations

import json
import os
import random

import pytest

from tsm_ds.cli import prepare as prepare_cli
from tsm_ds.data import prepare_parts as PP
from tsm_ds.data.prepare import prepare_video
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import write_numbered_video

NO_SLURM = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX")


@pytest.fixture(autouse=True)
def _no_array_job(monkeypatch):
    for v in NO_SLURM:
        monkeypatch.delenv(v, raising=False)


@pytest.fixture()
def tree(tmp_path):
    """5 short videos in 2 classes (one in a sub-folder) and one broken file."""
    src = tmp_path / "src"
    (src / "a" / "sub").mkdir(parents=True)
    (src / "b").mkdir()
    write_numbered_video(src / "a" / "one.mp4", 6, gop=6, bframes=0)
    write_numbered_video(src / "a" / "sub" / "three.mp4", 5, gop=5, bframes=0)
    write_numbered_video(src / "a" / "zz.avi", 4, codec="mpeg4", gop=4, bframes=0)
    write_numbered_video(src / "b" / "two.avi", 7, codec="mpeg4", gop=7, bframes=0)
    write_numbered_video(src / "b" / "four.mp4", 5, gop=5, bframes=0)
    (src / "b" / "broken.mp4").write_bytes(b"\x00\x01" * 500)
    return src


def _run(*args) -> int:
    return prepare_cli.main([str(a) for a in args] + ["--workers", "1", "--short-side", "32"])


def _tree_bytes(root) -> dict[str, bytes]:
    """Every output file under root except the lists, reports and part reports: rel path -> bytes."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if not rel.startswith(PP.PARTS_DIR + os.sep) and f not in ("all.txt", "classes.txt", "prepare_report.json"):
                out[rel] = open(os.path.join(dirpath, f), "rb").read()
    return out


# ------------------------------------------------------------------------------------------------
# which part, and the split


def test_parse_part_and_its_errors():
    assert PP.parse_part("3/64") == (3, 64)
    assert PP.parse_part(" 0 / 1 ") == (0, 1)
    for bad in ("3", "a/b", "4/4", "1/0", "-1/4"):
        with pytest.raises(PP.PartsError, match="--part"):
            PP.parse_part(bad)


def test_part_precedence_flag_then_array_then_none():
    array = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "0",
             "SLURM_ARRAY_TASK_MAX": "7"}
    assert PP.resolve_part(None, None, {}) is None
    assert PP.resolve_part("1/4", None, array) == (1, 4, "--part")           # the flag wins over the array
    assert PP.resolve_part(None, None, array) == (3, 8, "SLURM_ARRAY_TASK_ID=3")
    no_count = {k: v for k, v in array.items() if k != "SLURM_ARRAY_TASK_COUNT"}
    assert PP.resolve_part(None, None, no_count) == (3, 8, "SLURM_ARRAY_TASK_ID=3")   # MAX - MIN + 1
    # a rerun of some parts: --array=3,7 with --parts 8
    rerun = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "3",
             "SLURM_ARRAY_TASK_MAX": "7"}
    assert PP.resolve_part(None, 8, rerun) == (7, 8, "SLURM_ARRAY_TASK_ID=7")
    with pytest.raises(PP.PartsError, match=r"--array=3-7 .*--parts N"):
        PP.resolve_part(None, None, rerun)                                      # not 0-<N-1>
    with pytest.raises(PP.PartsError, match=r"not a part of --parts 4"):
        PP.resolve_part(None, 4, {**array, "SLURM_ARRAY_TASK_ID": "5"})
    with pytest.raises(PP.PartsError, match="not an array job"):
        PP.resolve_part(None, 4, {})
    with pytest.raises(PP.PartsError, match="disagree"):
        PP.resolve_part("1/4", 8, {})
    stepped = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
               "SLURM_ARRAY_TASK_MAX": "6"}                                     # --array=0-6:2
    with pytest.raises(PP.PartsError, match="is not 0-3"):
        PP.resolve_part(None, None, stepped)


def test_split_is_deterministic_disjoint_and_covers_the_source():
    recs = [VideoRecord(f"/d/c{c}/v{k:03d}.mp4", c) for c in range(7) for k in range(13)]
    for n in (1, 2, 3, 5, 64, 200):
        shuffled = recs[:]
        random.Random(n).shuffle(shuffled)
        parts = [PP.split_records(shuffled, i, n) for i in range(n)]
        assert parts == [PP.split_records(recs, i, n) for i in range(n)]     # from the sorted list only
        flat = [r.path for p in parts for r in p]
        assert sorted(flat) == sorted(r.path for r in recs)                  # every video exactly once
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1
    # strided: part 0 of 7 gets a video of every class
    assert {r.label for r in PP.split_records(recs, 0, 7)} == set(range(7))
    with pytest.raises(PP.PartsError):
        PP.split_records(recs, 2, 2)


# ------------------------------------------------------------------------------------------------
# parts, resume, merge


def test_two_parts_then_merge_equal_a_one_node_prepare(tree, tmp_path, capsys):
    one, multi = tmp_path / "one", tmp_path / "multi"
    assert _run(tree, one) == 1                                   # broken.mp4 fails
    rcs = [_run(tree, multi, "--part", f"{i}/2") for i in range(2)]
    assert sorted(rcs) == [0, 1]                                  # the part holding broken.mp4 says so
    for name in ("all.txt", "classes.txt", "prepare_report.json"):
        assert not (multi / name).exists()                        # parts write no global list
    reports = [json.loads(PP.part_report_path(multi, i, 2).read_text()) for i in range(2)]
    assert [r["counts"]["videos"] for r in reports] == [3, 3]
    assert sum(r["counts"]["failed"] for r in reports) == 1
    capsys.readouterr()
    assert _run(tree, multi, "--merge") == 1                      # the merged set still has the failure
    out = capsys.readouterr().out
    assert "2 parts, 6 videos (packed): 5 ready" in out and out.count("  failed ") == 1
    for name in ("all.txt", "classes.txt", "prepare_report.json"):
        assert (multi / name).read_bytes() == (one / name).read_bytes(), name
    rows = json.loads((multi / "prepare_report.json").read_text())["files"]
    bad = [r for r in rows if r["status"] == "failed"]
    assert len(bad) == 1 and bad[0]["src"].endswith("broken.mp4") and bad[0]["reason"]
    assert _tree_bytes(multi) == _tree_bytes(one)                 # the packs, byte for byte
    assert len(_tree_bytes(one)) == 5


def test_frames_and_video_modes_merge_equal_a_one_node_prepare(tree, tmp_path):
    for mode in ("frames", "video"):
        one, multi = tmp_path / f"one_{mode}", tmp_path / f"multi_{mode}"
        _run(tree, one, "--mode", mode)
        for i in range(3):
            _run(tree, multi, "--part", f"{i}/3", "--mode", mode)
        assert _run(tree, multi, "--merge", "--mode", mode) == 1
        for name in ("all.txt", "classes.txt", "prepare_report.json"):
            assert (multi / name).read_bytes() == (one / name).read_bytes(), (mode, name)
        # JPEGs (Pillow) and x264 with one pinned thread: the same bytes
        assert _tree_bytes(multi) == _tree_bytes(one), mode


def test_a_killed_part_rerun_redoes_no_finished_video(tree, tmp_path):
    out = tmp_path / "out"
    _run(tree, out, "--part", "1/2")
    first = json.loads(PP.part_report_path(out, 1, 2).read_text())
    assert first["counts"] == {"videos": 3, "done": 2, "skipped": 0, "failed": 1, "temporaries_removed": 0}
    done = [r["out"] for r in first["files"] if r["status"] == "done"]
    # a kill midway: the part report is gone (written last), one output not yet written, and the
    # writer of that output left its temporary file (atomic_path's name) beside it
    PP.part_report_path(out, 1, 2).unlink()
    lost, kept = out / done[0], out / done[1]
    lost.unlink()
    (lost.parent / f".{lost.name}.ab12cd_x.jpack").write_bytes(b"half a pack")
    kept_mtime = kept.stat().st_mtime_ns
    _run(tree, out, "--part", "1/2")
    again = json.loads(PP.part_report_path(out, 1, 2).read_text())
    assert again["counts"] == {"videos": 3, "done": 1, "skipped": 1, "failed": 1, "temporaries_removed": 1}
    status = {r["out"]: r["status"] for r in again["files"]}
    assert status[done[0]] == "done" and status[done[1]] == "skipped (exists)"
    assert kept.stat().st_mtime_ns == kept_mtime                   # not rewritten
    assert lost.is_file() and not list(lost.parent.glob(f".{lost.name}.*"))
    # the broken file is tried again (it may have been a transient read error) and fails again
    assert [r["status"] for r in again["files"] if r["src"].endswith("broken.mp4")] == ["failed"]


def test_array_task_takes_its_part_from_slurm(tree, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "0")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MAX", "1")
    _run(tree, out)
    assert "part 1 of 2 (from SLURM_ARRAY_TASK_ID=1)" in capsys.readouterr().out
    assert [p.name for p in (out / PP.PARTS_DIR).iterdir()] == ["part-0001-of-0002.json"]
    # the merge is refused inside a multi-task array (every task would merge)
    assert _run(tree, out, "--merge") == 2
    assert "once after the array" in capsys.readouterr().err
    # and a bad array is refused before any work, naming the fix
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MAX", "2")
    assert _run(tree, out) == 2
    assert "submit --array=0-<N-1>" in capsys.readouterr().err


def test_merge_refusals_name_the_missing_parts_and_the_fix(tree, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(tree, out, "--merge") == 2
    assert "no part report" in capsys.readouterr().err
    _run(tree, out, "--part", "1/3")
    assert _run(tree, out, "--merge") == 2
    err = capsys.readouterr().err
    assert "2 of 3 parts have no report" in err and "part-0000-of-0003.json" in err and "part-0002-of-0003.json" in err
    assert "sbatch --array=0,2 launch/slurm_prepare.sbatch SRC OUT --parts 3" in err
    for i in (0, 2):
        _run(tree, out, "--part", f"{i}/3")
    # options given to the merge must be the parts'
    assert _run(tree, out, "--merge", "--mode", "frames") == 2
    assert "--mode frames given, but the parts were prepared with --mode packed" in capsys.readouterr().err
    assert prepare_cli.main([str(tree), str(out), "--merge", "--short-side", "64"]) == 2
    assert "--short-side 64 given" in capsys.readouterr().err
    # the source changed after the parts ran
    write_numbered_video(tree / "b" / "late.mp4", 3, gop=3, bframes=0)
    assert _run(tree, out, "--merge") == 2
    assert "missing (" in capsys.readouterr().err and not (out / "all.txt").exists()
    (tree / "b" / "late.mp4").unlink()
    # reports of another split beside these
    _run(tree, out, "--part", "0/1")
    assert _run(tree, out, "--merge") == 2
    assert "different splits (1 of 1; 3 of 3 parts)" in capsys.readouterr().err
    (PP.part_report_path(out, 0, 1)).unlink()
    assert _run(tree, out, "--merge") == 1 and (out / "all.txt").is_file()


def test_video_mode_bytes_repeat(tree, tmp_path):
    """libx264 with its thread count pinned (x264-params threads=1): the same bytes run to run."""
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    for dst in (a, b):
        prepare_video(str(tree / "a" / "one.mp4"), str(dst), short_side=32, keyint=2)
    assert a.read_bytes() == b.read_bytes()
