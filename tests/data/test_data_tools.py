"""``tsm-ds prepare`` and ``tsm-ds check-videos`` on tiny synthesised trees."""
from __future__ import annotations

import json
import warnings

import numpy as np

from tsm_ds.cli import check_videos as check_cli
from tsm_ds.cli import prepare as prepare_cli
from tsm_ds.data import check
from tsm_ds.data import video as D
from tsm_ds.data.records import read_video_list
from tsm_ds.data.testvideo import read_number


def test_prepare_video_mode_resumes_and_reports_bad_files(tree, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    (out / "a" / "one.mp4.part.mp4").write_bytes(b"half-written by an interrupted run")
    rc = prepare_cli.main([str(tree), str(out), "--mode", "video", "--short-side", "0", "--keyint", "4",
                           "--workers", "1"])
    assert rc == 1  # broken.mp4 failed, and says so
    report = json.loads((out / "prepare_report.json").read_text())
    status = {r["src"].split("/")[-1]: r["status"] for r in report["files"]}
    assert status == {"one.mp4": "done", "two.avi": "done", "broken.mp4": "failed"}
    assert "broken.mp4" in capsys.readouterr().out
    recs = read_video_list(out / "all.txt")
    assert [(r.path.split("/")[-1], r.label) for r in recs] == [("one.mp4", 0), ("two.mp4", 1)]
    assert (out / "classes.txt").read_text() == "a\nb\n"
    # every frame kept, in order, now with a keyframe every 4 frames
    one = recs[0].path
    assert D.count_frames(one) == 20
    assert [read_number(f) for f in D.decode_all_frames(one)] == list(range(20))
    assert D.get_index(one).key_pos.tolist() == [0, 4, 8, 12, 16]
    st = D.DecodeStats()
    assert [read_number(f) for f in D.decode_frames(one, [19], stats=st)] == [19]
    assert st.decoded <= 4 + 2
    assert [read_number(f) for f in D.decode_all_frames(recs[1].path)] == list(range(13))
    # a rerun skips what is done
    prepare_cli.main([str(tree), str(out), "--mode", "video", "--short-side", "0", "--workers", "1"])
    report = json.loads((out / "prepare_report.json").read_text())
    assert sorted(r["status"] for r in report["files"]) == ["failed", "skipped (exists)",
                                                            "skipped (exists)"]


def test_prepare_frames_mode_writes_official_frame_list(tree, tmp_path):
    out = tmp_path / "frames"
    prepare_cli.main([str(tree), str(out), "--mode", "frames", "--short-side", "32", "--workers", "1"])
    recs = read_video_list(out / "all.txt")
    assert [(r.path.split("/")[-1], r.num_frames, r.label) for r in recs] == [("one", 20, 0),
                                                                             ("two", 13, 1)]
    frames = D.decode_frames(recs[0].path, [0, 19], num_frames=20)
    assert frames.shape == (2, 32, 64, 3)  # 128x64 scaled to a short side of 32


def test_check_videos_report(tree, tmp_path, capsys):
    lst = tmp_path / "list.txt"
    lst.write_text(f"{tree}/a/one.mp4 0\n{tree}/b/broken.mp4 1\n{tmp_path}/nope.mp4 1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = check_cli.main([str(lst), "--workers", "1", "--full", "--out", str(tmp_path / "rep")])
    assert rc == 1
    rep = json.loads((tmp_path / "rep.json").read_text())
    rows = {r["path"].split("/")[-1]: r for r in rep["files"]}
    assert rows["one.mp4"]["status"] == "ok" and rows["one.mp4"]["num_frames"] == 20
    assert rows["one.mp4"]["decodable"] == 20 and rows["one.mp4"]["width"] == 128
    assert rows["broken.mp4"]["status"] == "unreadable" and rows["broken.mp4"]["reason"]
    assert rows["nope.mp4"]["status"] == "unreadable" and "not found" in rows["nope.mp4"]["reason"]
    md = (tmp_path / "rep.md").read_text()
    assert "broken.mp4" in md and "one.mp4" not in md
    assert rep["counts"] == {"ok": 1, "partial": 0, "unreadable": 2}


def test_check_file_partial_stream(shared_data):
    row = check.check_file(str(shared_data / "edge_cases" / "decord_corrupted.mp4"), full=True)
    assert row["status"] == "partial" and row["num_frames"] == 50 and row["decodable"] == 28
    assert "InvalidData" in row["reason"]
    assert np.isfinite(row["width"])
