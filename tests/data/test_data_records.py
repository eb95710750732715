"""Annotation readers: list files, official frame lists, class folders, Kinetics CSV, manifest split."""
from __future__ import annotations

from pathlib import Path

import pytest

from tsm_ds.data import records as R


def test_video_list_relative_to_list_dir_and_root(tmp_path):
    lst = tmp_path / "train.txt"
    lst.write_text("# comment\na/x.mp4 3\n\n/abs/y y.avi 0\n")
    recs = R.read_video_list(lst)
    assert recs == [R.VideoRecord(str(tmp_path / "a/x.mp4"), 3), R.VideoRecord("/abs/y y.avi", 0)]
    recs = R.read_video_list(lst, root="/data")
    assert recs[0].path == "/data/a/x.mp4"


def test_official_frame_list(tmp_path):
    lst = tmp_path / "kinetics_train.txt"
    lst.write_text("abseiling/abc_000001_000011 300 0\nzumba/q 64 399\n")
    recs = R.read_video_list(lst, root="/frames")
    assert recs == [R.VideoRecord("/frames/abseiling/abc_000001_000011", 0, 300),
                    R.VideoRecord("/frames/zumba/q", 399, 64)]


def test_malformed_list_names_file_and_line(tmp_path):
    lst = tmp_path / "bad.txt"
    lst.write_text("a.mp4 1\nb.mp4 cat\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        R.read_video_list(lst)


def test_write_then_read_list(tmp_path):
    recs = [R.VideoRecord(str(tmp_path / "c/1.mp4"), 2), R.VideoRecord(str(tmp_path / "f"), 1, 40)]
    R.write_video_list(tmp_path / "l.txt", recs, root=tmp_path)
    assert (tmp_path / "l.txt").read_text() == "c/1.mp4 2\nf 40 1\n"
    assert R.read_video_list(tmp_path / "l.txt") == recs


def test_class_folders(tmp_path):
    for c, files in {"waving": ["b.avi", "a.mp4", "notes.txt"], "archery": ["z.mkv"]}.items():
        (tmp_path / c).mkdir()
        for f in files:
            (tmp_path / c / f).write_bytes(b"x")
    (tmp_path / "archery" / "frames_clip").mkdir()
    (tmp_path / "archery" / "frames_clip" / "img_00001.jpg").write_bytes(b"x")
    recs, names = R.read_class_folders(tmp_path)
    assert names == ["archery", "waving"]
    assert [(Path(r.path).relative_to(tmp_path).as_posix(), r.label) for r in recs] == [
        ("archery/frames_clip", 0), ("archery/z.mkv", 0), ("waving/a.mp4", 1), ("waving/b.avi", 1)]
    with pytest.raises(ValueError, match="not in the given class names"):
        R.read_class_folders(tmp_path, class_names=["waving"])


def test_class_name_normalisation_official():
    assert R.normalize_class_name("petting animal (not cat)") == "petting_animal_not_cat"
    assert R.normalize_class_name("passing American football (in game)") == \
        "passing_American_football_in_game"
    assert R.normalize_class_name("tying bow tie") == "tying_bow_tie"
    assert R.normalize_class_name("\"dancing\" 'x'") == "dancing_x"


def test_kinetics_csv(tmp_path):
    names = ["abseiling", "petting animal (not cat)", "using segway"]
    (tmp_path / "map.txt").write_text("\n".join(names) + "\n")
    root = tmp_path / "clips"
    (root / "petting_animal_not_cat").mkdir(parents=True)
    (root / "petting_animal_not_cat" / "AbC_000010_000020.mp4").write_bytes(b"x")
    (root / "using segway").mkdir()
    (root / "using segway" / "seg_000003_000013.mkv").write_bytes(b"x")
    csv = tmp_path / "train.csv"
    csv.write_text("label,youtube_id,time_start,time_end,split,is_cc\n"
                   "\"petting animal (not cat)\",AbC,10,20,train,0\n"
                   "using segway,seg,3,13,train,0\n"
                   "abseiling,gone,0,10,train,0\n")
    with pytest.raises(ValueError, match="1 clips not found"):
        R.read_kinetics_csv(csv, root, tmp_path / "map.txt")
    with pytest.warns(RuntimeWarning, match="1 clips not found"):
        recs, got_names = R.read_kinetics_csv(csv, root, tmp_path / "map.txt", missing="skip")
    assert got_names == names
    assert [(Path(r.path).name, r.label) for r in recs] == [("AbC_000010_000020.mp4", 1),
                                                            ("seg_000003_000013.mkv", 2)]
    test_csv = tmp_path / "test.csv"
    (root / "t_000001_000011.mp4").write_bytes(b"x")
    test_csv.write_text("youtube_id,time_start,time_end,split\nt,1,11,test\n")
    recs, _ = R.read_kinetics_csv(test_csv, root, names)
    assert [(Path(r.path).name, r.label) for r in recs] == [("t_000001_000011.mp4", -1)]
    assert R.kinetics_clip_name("x", 5.0, 15.0) == "x_000005_000015.mp4"


def test_kinetics400_label_map(shared_data):
    names = R.read_label_map(shared_data / "kinetics400_labels.txt")
    assert len(names) == 400
    assert names[0] == "abseiling" and names[5] == "archery" and names[399] == "zumba"
    assert names[375] == "using segway" and names[346] == "tai chi"
    assert names[171] == "juggling soccer ball"


def test_split_by_source_group(shared_data):
    train, val, classes = R.split_by_source_group(shared_data)
    assert classes == ["juggling_soccer_ball", "tai_chi", "using_segway", "walking", "waving"]
    assert len(train) + len(val) == 17 and len(val) == 7  # 2 + 2 + 1 + 1 + 1 val clips
    assert {r.label for r in val} == set(range(5)) == {r.label for r in train}
    for r in train + val:  # the label is the folder
        assert Path(r.path).parent.name == classes[r.label] and Path(r.path).is_file()
    # parts of one source video never on both sides: tai_chi parts share a stem prefix
    stem = lambda r: Path(r.path).stem.split("_part")[0]  # noqa: E731
    assert not {stem(r) for r in train} & {stem(r) for r in val}
