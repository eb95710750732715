"""The distributed datasets (``--dataset NAME --data ROOT``), each read from a small fixture in its
release's real format, generated here (a few ids, tiny numbered videos or JPEG frames), with what
real releases get wrong: listed videos missing on disk, duplicate ids, CRLF line ends, UTF-8 BOMs,
and (in their own tests) labels that are not in the label map.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.data import splits
from tsm_ds.data.datasets import DATASET_NAMES, DATASETS, PREPARED_FILE, read_dataset
from tsm_ds.data.testvideo import number_frame, write_numbered_video

REPO = Path(__file__).resolve().parents[2]
BOM = "\ufeff"


def _write(path: Path, text: str, *, crlf: bool = True, bom: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if crlf:
        text = text.replace("\n", "\r\n")
    path.write_bytes(((BOM if bom else "") + text).encode("utf-8"))
    return path


def _video(path: Path, frames: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    codec = {".webm": "libvpx-vp9", ".avi": "mpeg4", ".mp4": "libx264"}[path.suffix]
    write_numbered_video(path, frames, codec=codec, gop=frames, bframes=0)


def _frames(folder: Path, frames: int = 6, template: str = "{:05d}.jpg") -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(frames):
        Image.fromarray(number_frame(i)).save(folder / template.format(i + 1), quality=90)


def _ids(records) -> list[str]:
    return [Path(r.path).stem for r in records]


# ---- the fixtures: each dataset's files as its release ships them ---------------------------------------

SSV2_CLASSES = ["Pushing something from left to right", "Pushing something from right to left", "Holding something"]


def make_somethingv2(root: Path, *, later_layout: bool = False) -> Path:
    """Something-Something v2: train 11, 12, 13 (+ 14 missing on disk, 11 again); validation 21, 22
    (+ 23 missing); test 31 (+ 32 missing). JSON with CRLF and BOM, the labels' ids as strings."""
    if later_layout:
        ann = {s: root / "20bn-something-something-download-package-labels" / "labels" / f"{s}.json"
               for s in ("labels", "train", "validation", "test")}
    else:
        ann = {s: root / f"something-something-v2-{s}.json" for s in ("labels", "train", "validation", "test")}
    _write(ann["labels"], json.dumps({c: str(i) for i, c in enumerate(SSV2_CLASSES)}, indent=1))

    def item(vid, cls):   # the class is the template without brackets
        template = SSV2_CLASSES[cls].replace("something", "[something]")
        return {"id": vid, "label": template.replace("[something]", "a cup"), "template": template,
                "placeholders": ["a cup"]}

    _write(ann["train"], json.dumps([item("11", 0), item("12", 1), item("13", 2), item("14", 0), item("11", 0)],
                                    indent=1))
    _write(ann["validation"], json.dumps([item("21", 1), item("22", 2), item("23", 0)], indent=1))
    _write(ann["test"], json.dumps([{"id": "31"}, {"id": "32"}]), crlf=False)
    for vid in ("11", "12", "13", "21", "22", "31"):
        _video(root / "20bn-something-something-v2" / f"{vid}.webm")
    return root


def make_20bn_frames(root: Path, prefix: str, frames_dir: str, classes: list[str]) -> Path:
    """Something-Something v1 / Jester: labels (unsorted, BOM, CRLF), train 1, 2, 3 (+ 4 missing, 1
    again), validation 5 (+ 6 missing), test 7; frame folders <id>/00001.jpg."""
    _write(root / f"{prefix}-labels.csv", "\n".join(classes) + "\n")
    _write(root / f"{prefix}-train.csv", f"1;{classes[0]}\n2;{classes[1]}\n3;{classes[2]}\n1;{classes[0]}\n"
                                         f"4;{classes[0]}\n")
    _write(root / f"{prefix}-validation.csv", f"5;{classes[1]}\n6;{classes[2]}\n")
    _write(root / f"{prefix}-test.csv", "7\n", bom=False)
    for vid in ("1", "2", "3", "5", "7"):
        _frames(root / frames_dir / vid)
    return root


SSV1_CLASSES = ["Pushing something from right to left", "Holding something", "Pushing something from left to right"]
JESTER_CLASSES = ["Swiping Right", "Swiping Left", "Thumb Up"]


def make_ucf101(root: Path) -> Path:
    """UCF101 with splits 1 and 2: split 2's lists name g08/g09 (train) and g01 (test); the folder
    HandstandPushups holds v_HandStandPushups_*; YoYo g09 and g02 are missing on disk."""
    lists = root / "ucfTrainTestlist"
    _write(lists / "classInd.txt", "1 ApplyEyeMakeup\n2 HandstandPushups\n3 YoYo\n")
    _write(lists / "trainlist01.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi 1\n", bom=False)
    _write(lists / "testlist01.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi\n", bom=False)
    _write(lists / "trainlist02.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\n"
                                      "HandstandPushups/v_HandStandPushups_g08_c01.avi 2\n"
                                      "YoYo/v_YoYo_g08_c01.avi 3\nYoYo/v_YoYo_g09_c01.avi 3\n"
                                      "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\n")
    _write(lists / "testlist02.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi\n"
                                     "HandstandPushups/v_HandStandPushups_g01_c01.avi\nYoYo/v_YoYo_g02_c01.avi\n")
    for rel in ("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi", "HandstandPushups/v_HandStandPushups_g08_c01.avi",
                "YoYo/v_YoYo_g08_c01.avi", "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi",
                "HandstandPushups/v_HandStandPushups_g01_c01.avi"):
        _video(root / "UCF-101" / rel)
    return root


def make_hmdb51(root: Path) -> Path:
    """HMDB51 with splits 1 and 3 (lines end in a blank, as released): split 3 trains on brush 1, 4
    (missing) and wave 1 (listed twice), tests brush 2 and wave 2; brush 3 is unused."""
    sp = root / "testTrainMulti_7030_splits"
    _write(sp / "brush_hair_test_split3.txt", "brush_1.avi 1 \nbrush_2.avi 2 \nbrush_3.avi 0 \nbrush_4.avi 1 \n")
    _write(sp / "wave_test_split3.txt", "wave_1.avi 1 \nwave_2.avi 2 \nwave_1.avi 1 \n", bom=False)
    _write(sp / "brush_hair_test_split1.txt", "brush_1.avi 2 \nbrush_2.avi 1 \nbrush_3.avi 1 \n")
    _write(sp / "wave_test_split1.txt", "wave_1.avi 2 \nwave_2.avi 1 \n")
    for cls, name in (("brush_hair", "brush_1"), ("brush_hair", "brush_2"), ("brush_hair", "brush_3"),
                      ("wave", "wave_1"), ("wave", "wave_2")):
        _video(root / "hmdb51_org" / cls / f"{name}.avi")
    return root


KINETICS_CLASSES = ["abseiling", "petting animal (not cat)", "skiing (not slalom or crosscountry)",
                    "skiing crosscountry"]   # sorted as written: normalised names would sort the last two the other way


def make_kinetics(root: Path) -> Path:
    """Kinetics-700-2020 CSVs (CRLF, BOM): train a, b, c (+ d missing, a again); validate e (+ f
    missing); test g (no label column). Clips named <id>_<start:06d>_<end:06d>.mp4 under train/<class>/
    and a flat val/ and test/."""
    ann = root / "annotations"
    _write(ann / "train.csv", "label,youtube_id,time_start,time_end,split\n"
                              "abseiling,aaaaaaaaaaa,10,20,train\n"
                              "\"petting animal (not cat)\",bbbbbbbbbbb,0,10,train\n"
                              "skiing crosscountry,ccccccccccc,5,15,train\n"
                              "skiing (not slalom or crosscountry),ddddddddddd,1,11,train\n"
                              "abseiling,aaaaaaaaaaa,10,20,train\n")
    _write(ann / "validate.csv", "label,youtube_id,time_start,time_end,split\n"
                                 "abseiling,eeeeeeeeeee,30,40,validate\n"
                                 "skiing crosscountry,fffffffffff,2,12,validate\n")
    _write(ann / "test.csv", "youtube_id,time_start,time_end,split\nggggggggggg,0,10,test\n", bom=False)
    _video(root / "train" / "abseiling" / "aaaaaaaaaaa_000010_000020.mp4")
    _video(root / "train" / "petting_animal_not_cat" / "bbbbbbbbbbb_000000_000010.mp4")
    _video(root / "train" / "skiing_crosscountry" / "ccccccccccc_000005_000015.mp4")
    _video(root / "val" / "eeeeeeeeeee_000030_000040.mp4")
    _video(root / "test" / "ggggggggggg_000000_000010.mp4")
    return root


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("datasets")
    return {"somethingv2": make_somethingv2(base / "ssv2"),
            "somethingv1": make_20bn_frames(base / "ssv1", "something-something-v1", "20bn-something-something-v1",
                                            SSV1_CLASSES),
            "jester": make_20bn_frames(base / "jester", "jester-v1", "20bn-jester-v1", JESTER_CLASSES),
            "ucf101": make_ucf101(base / "ucf"), "hmdb51": make_hmdb51(base / "hmdb"),
            "kinetics700": make_kinetics(base / "k700")}


# ---- each reader ---------------------------------------------------------------------------------------

def test_names_are_the_config_choices():
    from tsm_ds.config.tree import DATASET_CHOICES

    assert DATASET_NAMES == DATASET_CHOICES
    assert [n for n, s in DATASETS.items() if not s.flip] == ["somethingv1", "somethingv2", "jester"]


@pytest.mark.parametrize("later", [False, True], ids=["original-files", "labels-folder"])
def test_somethingv2_release(tmp_path, later, caplog):
    root = make_somethingv2(tmp_path, later_layout=later)
    with caplog.at_level(logging.WARNING, logger="tsm_ds.data.datasets"):
        sp = read_dataset("somethingv2", root)
    assert sp.kind == "dataset" and sp.dataset == "somethingv2" and sp.flip is False
    assert sp.class_names == SSV2_CLASSES   # the labels file's id order
    assert _ids(sp.train) == ["11", "12", "13"] and [r.label for r in sp.train] == [0, 1, 2]
    assert _ids(sp.val) == ["21", "22"] and [r.label for r in sp.val] == [1, 2]
    assert _ids(sp.test) == ["31"] and sp.test[0].label == -1
    assert sp.missing == {"train": ["14"], "val": ["23"], "test": ["32"]}
    assert sp.duplicates == {"train": ["11"]}
    assert all(r.path.endswith(".webm") for r in sp.train)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "1 of 4 listed train videos are not on disk" in logged and ": 14" in logged
    assert "1 of 3 listed val videos" in logged and "23" in logged and "listed again" in logged


def test_somethingv2_unknown_template_names_file_and_line(tmp_path):
    root = make_somethingv2(tmp_path)
    doc = json.loads((root / "something-something-v2-validation.json").read_text(encoding="utf-8-sig"))
    doc[1]["template"] = "Spinning [something] twice"
    _write(root / "something-something-v2-validation.json", json.dumps(doc, indent=1))
    bad = root / "something-something-v2-validation.json"
    line = bad.read_bytes().decode("utf-8-sig").split("\r\n").index(" {", 2) + 1   # the second item's line
    with pytest.raises(ValueError, match=rf"validation\.json:{line}: id 22: the class 'Spinning something twice'"):
        read_dataset("somethingv2", root)


@pytest.mark.parametrize("name,classes,frames", [("somethingv1", SSV1_CLASSES, "20bn-something-something-v1"),
                                                 ("jester", JESTER_CLASSES, "20bn-jester-v1")])
def test_frame_folder_datasets(roots, name, classes, frames):
    sp = read_dataset(name, roots[name])
    assert sp.class_names == sorted(classes) and sp.flip is False   # sorted, as gen_label_sthv1.py
    assert _ids(sp.train) == ["1", "2", "3"]
    assert [sp.class_names[r.label] for r in sp.train] == classes
    assert _ids(sp.val) == ["5"] and sp.class_names[sp.val[0].label] == classes[1]
    assert _ids(sp.test) == ["7"] and sp.test[0].label == -1
    assert sp.missing == {"train": ["4"], "val": ["6"]} and sp.duplicates == {"train": ["1"]}
    assert all(r.frame_template == "{:05d}.jpg" and Path(r.path).parent.name == frames for r in sp.train)
    # the frames are read with the template: clip i is frames of its own folder
    train_set, val_set = splits.build_datasets(sp, num_segments=2, img_size=32, flip=sp.flip)
    item = val_set[0]
    assert tuple(item["clip"].shape) == (2, 3, 32, 32) and item["label"] == sp.val[0].label and item["bad"] == 0
    assert train_set[2]["label"] == sp.train[2].label and train_set[2]["bad"] == 0


def test_frame_template_option_and_a_wrong_one(roots, tmp_path):
    root = make_20bn_frames(tmp_path, "jester-v1", "20bn-jester-v1", JESTER_CLASSES)
    for vid in ("1", "2", "3", "5", "7"):   # frames extracted under another name
        folder = root / "20bn-jester-v1" / vid
        for f in sorted(folder.iterdir()):
            f.rename(folder / f"img_{f.name}")
    with pytest.raises(ValueError, match=r"20bn-jester-v1/1 has no 00001\.jpg .*img_00001\.jpg.*--frame-template"):
        read_dataset("jester", root)
    sp = read_dataset("jester", root, frame_template="img_{:05d}.jpg")
    assert sp.frame_template == "img_{:05d}.jpg" and len(sp.train) == 3
    _, val_set = splits.build_datasets(sp, num_segments=2, img_size=32)
    assert val_set[0]["bad"] == 0
    with pytest.raises(ValueError, match="not a format for a frame number"):
        read_dataset("jester", root, frame_template="frame_{x}.jpg")


def test_jester_label_not_in_the_labels_file(tmp_path):
    root = make_20bn_frames(tmp_path, "jester-v1", "20bn-jester-v1", JESTER_CLASSES)
    _write(root / "jester-v1-validation.csv", "5;Swiping Left\n6;Shaking Hand\n")
    with pytest.raises(ValueError, match=r"jester-v1-validation\.csv:2: id 6: the class 'Shaking Hand' is not in "
                                         r".*jester-v1-labels\.csv"):
        read_dataset("jester", root)


def test_ucf101_split_2_class_from_the_folder(roots):
    sp = read_dataset("ucf101", roots["ucf101"], split=2)
    assert sp.dataset_split == 2 and sp.flip is True
    assert sp.class_names == ["ApplyEyeMakeup", "HandstandPushups", "YoYo"]
    assert _ids(sp.train) == ["v_ApplyEyeMakeup_g08_c01", "v_HandStandPushups_g08_c01", "v_YoYo_g08_c01"]
    assert [r.label for r in sp.train] == [0, 1, 2]
    assert _ids(sp.val) == ["v_ApplyEyeMakeup_g01_c01", "v_HandStandPushups_g01_c01"]
    assert [r.label for r in sp.val] == [0, 1]
    assert sp.missing == {"train": ["YoYo/v_YoYo_g09_c01.avi"], "val": ["YoYo/v_YoYo_g02_c01.avi"]}
    assert sp.duplicates == {"train": ["ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi"]}
    one = read_dataset("ucf101", roots["ucf101"])   # split 1 by default: its own lists
    assert one.dataset_split == 1 and _ids(one.train) == ["v_ApplyEyeMakeup_g01_c01"]


def test_ucf101_errors_name_file_and_line(tmp_path):
    root = make_ucf101(tmp_path)
    lists = root / "ucfTrainTestlist"
    _write(lists / "trainlist02.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\n"
                                      "YoYo/v_YoYo_g08_c01.avi 2\n")
    with pytest.raises(ValueError, match=r"trainlist02\.txt:2: YoYo/v_YoYo_g08_c01\.avi is labelled 2 "
                                         r"\('HandstandPushups' in classInd\.txt\), its folder is the class 3"):
        read_dataset("ucf101", root, split=2)
    _write(lists / "testlist02.txt", "Juggling/v_Juggling_g01_c01.avi\n")
    _write(lists / "trainlist02.txt", "YoYo/v_YoYo_g08_c01.avi 3\n")
    with pytest.raises(ValueError, match=r"testlist02\.txt:1: the class folder 'Juggling' is not in .*classInd"):
        read_dataset("ucf101", root, split=2)
    with pytest.raises(ValueError, match="--dataset-split 4: UCF101 and HMDB51 have the splits 1, 2 and 3"):
        read_dataset("ucf101", root, split=4)


def test_hmdb51_split_3(roots):
    sp = read_dataset("hmdb51", roots["hmdb51"], split=3)
    assert sp.class_names == ["brush_hair", "wave"] and sp.dataset_split == 3
    assert _ids(sp.train) == ["brush_1", "wave_1"] and [r.label for r in sp.train] == [0, 1]
    assert _ids(sp.val) == ["brush_2", "wave_2"] and [r.label for r in sp.val] == [0, 1]
    assert sp.missing == {"train": ["brush_4.avi"]} and sp.duplicates == {"train": ["wave_1.avi"]}
    one = read_dataset("hmdb51", roots["hmdb51"])
    assert _ids(one.train) == ["brush_2", "brush_3", "wave_2"] and _ids(one.val) == ["brush_1", "wave_1"]


def test_hmdb51_bad_flag_names_file_and_line(tmp_path):
    root = make_hmdb51(tmp_path)
    _write(root / "testTrainMulti_7030_splits" / "wave_test_split3.txt", "wave_1.avi 1\nwave_2.avi 3\n")
    with pytest.raises(ValueError, match=r"wave_test_split3\.txt:2: expected '<video>\.avi 0\|1\|2'"):
        read_dataset("hmdb51", root, split=3)


def test_kinetics700_csvs(roots, tmp_path):
    root = roots["kinetics700"]
    sp = read_dataset("kinetics700", root)
    assert sp.class_names == KINETICS_CLASSES
    assert _ids(sp.train) == ["aaaaaaaaaaa_000010_000020", "bbbbbbbbbbb_000000_000010", "ccccccccccc_000005_000015"]
    assert [r.label for r in sp.train] == [0, 1, 3]
    assert _ids(sp.val) == ["eeeeeeeeeee_000030_000040"] and sp.val[0].label == 0
    assert _ids(sp.test) == ["ggggggggggg_000000_000010"] and sp.test[0].label == -1
    assert sp.missing == {"train": ["ddddddddddd_000001_000011"], "val": ["fffffffffff_000002_000012"]}
    assert sp.duplicates == {"train": ["aaaaaaaaaaa_000010_000020"]}
    # a label map fixes the order; names match raw or in the official folder form
    labels = _write(tmp_path / "labels.txt", "skiing crosscountry\npetting_animal_not_cat\nabseiling\n"
                                              "skiing (not slalom or crosscountry)\n", crlf=False, bom=False)
    mapped = read_dataset("kinetics700", root, label_map=labels)
    assert [r.label for r in mapped.train] == [2, 1, 0]
    _write(labels, "abseiling\nskiing crosscountry\n", crlf=False, bom=False)
    with pytest.raises(ValueError, match=r"train\.csv:3: the class 'petting animal \(not cat\)' is not in "
                                         r".*labels\.txt"):
        read_dataset("kinetics700", root, label_map=labels)


def test_kinetics_validation_class_not_in_training(tmp_path):
    root = make_kinetics(tmp_path)
    _write(root / "annotations" / "validate.csv", "label,youtube_id,time_start,time_end,split\n"
                                                  "abseiling,eeeeeeeeeee,30,40,validate\n"
                                                  "yoga,hhhhhhhhhhh,0,10,validate\n")
    with pytest.raises(ValueError, match=r"validate\.csv:3: the class 'yoga' is not in the classes of train\.csv"):
        read_dataset("kinetics700", root)


def test_options_a_dataset_does_not_have(roots):
    with pytest.raises(ValueError, match="Something-Something v2 has one split"):
        read_dataset("somethingv2", roots["somethingv2"], split=2)
    with pytest.raises(ValueError, match="UCF101 is read from videos, not frame folders"):
        read_dataset("ucf101", roots["ucf101"], frame_template="{:05d}.jpg")
    with pytest.raises(ValueError, match="a label map is for kinetics"):
        read_dataset("hmdb51", roots["hmdb51"], label_map="x.txt")
    with pytest.raises(ValueError, match="not one of somethingv1"):
        read_dataset("kinetics", roots["kinetics700"])
    with pytest.raises(FileNotFoundError, match="no UCF101 split files"):
        read_dataset("ucf101", roots["hmdb51"])
    with pytest.raises(ValueError, match="--dataset hmdb51: give --data"):
        splits.resolve_split(dataset="hmdb51")
    with pytest.raises(ValueError, match="drop --train-list"):
        splits.resolve_split(dataset="hmdb51", data=roots["hmdb51"], train_list="x.txt")


# ---- what the commands do with them --------------------------------------------------------------------

@pytest.mark.parametrize("argv,want_flip,n_train,n_val", [
    (["--dataset", "somethingv2"], False, 3, 2), (["--dataset", "somethingv1"], False, 3, 1),
    (["--dataset", "jester"], False, 3, 1), (["--dataset", "ucf101", "--dataset-split", "2"], True, 3, 2),
    (["--dataset", "hmdb51", "--dataset-split", "3"], True, 2, 2), (["--dataset", "kinetics700"], True, 3, 1)])
def test_train_command_reads_them_and_keeps_the_flip_rule(roots, argv, want_flip, n_train, n_val, tmp_path):
    """What ``python -m tsm_ds.train --dataset NAME --data ROOT`` builds before the engine starts: the split,
    the flip decision, the datasets; one training item and one validation item decode."""
    from tsm_ds.cli.train import parse_config, select_data

    cfg = parse_config(argv + ["--data", str(roots[argv[1]]), "--output-dir", str(tmp_path)], environ={})[0]
    split, flip = select_data(cfg, logging.getLogger("test"))
    assert split.kind == "dataset" and flip is want_flip
    train_set, val_set = splits.build_datasets(split, num_segments=2, img_size=32, flip=flip)
    assert (len(train_set), len(val_set)) == (n_train, n_val)
    assert train_set.transform.flip is want_flip
    for ds in (train_set, val_set):
        item = ds[len(ds) - 1]
        assert item["bad"] == 0 and item["label"] == ds.records[-1].label
    # config.json records the dataset; eval resolves the same split again from it
    rec = {"config": {"data": {"data": str(roots[argv[1]])}}, "split": split.as_dict()}
    assert rec["split"]["dataset"] == argv[1] and rec["split"]["missing"]["train"] == len(split.missing["train"])
    again = splits.split_from_record(json.loads(json.dumps(rec)))
    assert [r.path for r in again.val] == [r.path for r in split.val] and again.flip is split.flip


def test_prepare_keeps_the_split(roots, tmp_path):
    """``tsm-ds prepare --dataset``: packs of every side, the split lists and dataset.json; ``--data OUT``
    resolves to the same ids and flip rule, and names the ids that were missing in the source."""
    from tsm_ds.cli import prepare as prepare_cli

    for name, extra in (("ucf101", ["--dataset-split", "2"]), ("somethingv1", [])):
        out = tmp_path / name
        assert prepare_cli.main(["--dataset", name, *extra, str(roots[name]), str(out), "--short-side", "32",
                                 "--workers", "1"]) == 0
        src = read_dataset(name, roots[name], split=2 if name == "ucf101" else None)
        doc = json.loads((out / PREPARED_FILE).read_text())
        assert doc["dataset"] == name and doc["flip"] is src.flip and doc["missing"] == src.missing
        lines = (out / "val.txt").read_text().splitlines()
        assert [ln.split()[0] for ln in lines] == [os.path.relpath(r.path, roots[name]).rsplit(".", 1)[0] + ".jpack"
                                                   for r in src.val]
        sp = splits.resolve_split(data=out)   # without the annotation files, without --dataset
        assert sp.kind == "dataset" and sp.dataset == name and sp.flip is src.flip
        assert [Path(r.path).stem for r in sp.train] == _ids(src.train)
        assert [r.label for r in sp.val] == [r.label for r in src.val] and sp.class_names == src.class_names
        assert [Path(r.path).stem for r in sp.test] == _ids(src.test) and sp.missing == src.missing
        assert all(r.path.endswith(".jpack") for r in sp.train + sp.val)
        _, val_set = splits.build_datasets(sp, num_segments=2, img_size=32)
        assert val_set[0]["bad"] == 0
    with pytest.raises(ValueError, match="a prepared somethingv1 folder, not jester"):
        read_dataset("jester", tmp_path / "somethingv1")
    with pytest.raises(ValueError, match="prepared from split 2, not 1"):
        read_dataset("ucf101", tmp_path / "ucf101", split=1)


def test_prepare_shards_keep_the_split(roots, tmp_path):
    """``--shards`` with ``--dataset``: the shards' samples.json records the split, so ``--data OUT/shards``
    trains and evaluates the same ids as the annotation files name."""
    from tsm_ds.cli import prepare as prepare_cli

    out = tmp_path / "out"
    assert prepare_cli.main(["--dataset", "hmdb51", "--dataset-split", "3", str(roots["hmdb51"]), str(out),
                             "--short-side", "32", "--workers", "1", "--shards", "1"]) == 0
    src = read_dataset("hmdb51", roots["hmdb51"], split=3)
    sp = splits.resolve_split(data=out / "shards")
    assert sp.kind == "dataset" and sp.dataset == "hmdb51" and sp.dataset_split == 3 and sp.flip is True
    assert [r.path.rsplit("/", 1)[1] for r in sp.val] == ["brush_2.jpack", "wave_2.jpack"]
    assert [r.label for r in sp.train] == [r.label for r in src.train] and sp.missing == {"train": ["brush_4.avi"]}
    assert splits.resolve_split(data=out / "shards", dataset="hmdb51").val[1].path == sp.val[1].path
    with pytest.raises(ValueError, match="shards of split 3, not 1"):
        splits.resolve_split(data=out / "shards", dataset="hmdb51", dataset_split=1)
    _, val_set = splits.build_datasets(sp, num_segments=2, img_size=32)
    assert val_set[1]["bad"] == 0 and val_set[1]["label"] == 1


def test_train_stops_on_a_bad_label_with_file_and_line(tmp_path, capsys, caplog):
    """The train command: exit status 2 and the file and line, no traceback (before any engine starts)."""
    from tsm_ds import train

    root = make_somethingv2(tmp_path / "ssv2")
    doc = json.loads((root / "something-something-v2-train.json").read_text(encoding="utf-8-sig"))
    doc[0]["template"] = "Juggling [something]"
    _write(root / "something-something-v2-train.json", json.dumps(doc, indent=1))
    status = train.main(["--dataset", "somethingv2", "--data", str(root), "--output-dir", str(tmp_path / "runs"),
                         "--deepspeed_config", "cpu_fp32"])
    out = capsys.readouterr().out + caplog.text
    assert status == 2
    assert "something-something-v2-train.json:2: id 11: the class 'Juggling something'" in out
    assert "Traceback" not in out


def test_prepare_stops_on_a_bad_label_with_file_and_line(tmp_path, capsys):
    from tsm_ds.cli import prepare as prepare_cli

    root = make_20bn_frames(tmp_path / "j", "jester-v1", "20bn-jester-v1", JESTER_CLASSES)
    _write(root / "jester-v1-train.csv", "1;Swiping Left\n2;Waving\n")
    assert prepare_cli.main(["--dataset", "jester", str(root), str(tmp_path / "out")]) == 2
    assert "jester-v1-train.csv:2: id 2: the class 'Waving' is not in" in capsys.readouterr().err
    assert prepare_cli.main(["--dataset-split", "2", str(root), str(tmp_path / "out")]) == 2


@pytest.mark.slow
def test_train_somethingv2_then_eval_scores_val_minus_missing(roots, tmp_path):
    """One short run of ``python -m tsm_ds.train --dataset somethingv2`` on the fixture, within the default
    data-loss budget although a quarter of the listed training videos is missing; ``tsm-ds eval --dataset``
    scores the validation ids that are on disk and names the missing one; the same from the folder
    ``tsm-ds prepare --dataset`` wrote (~15 s)."""
    from tsm_ds.cli import eval as eval_cli
    from tsm_ds.cli import prepare as prepare_cli

    root = roots["somethingv2"]
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    cmd = [sys.executable, "-m", "tsm_ds.train", "--dataset", "somethingv2", "--data", str(root), "--arch", "resnet18",
           "--num-segments", "2", "--img-size", "32", "--batch-size", "2", "--micro-batch-size", "2", "--max-steps",
           "1", "--epochs", "1", "--num-workers", "0", "--no-progress", "--deepspeed_config",
           "ds_configs/cpu_fp32.json", "--output-dir", str(tmp_path), "--run-name", "ssv2"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "horizontal flip is turned off" in out and "1 of 4 listed train videos are not on disk" in out
    # the default data-loss budget (1 %) holds: the missing videos never reached the loader
    assert "data lost: none" in out
    rec = json.loads((tmp_path / "ssv2" / "config.json").read_text())
    assert rec["config"]["data"]["dataset"] == "somethingv2" and rec["split"]["val_clips"] == 2
    assert rec["run"]["flip"] is False and rec["split"]["missing"] == {"train": 1, "val": 1, "test": 1}
    result = json.loads((tmp_path / "ssv2" / "result.json").read_text())
    assert result["steps"] == 1 and result["val_clips"] == 2

    ckpt = str(tmp_path / "ssv2" / "best_model.pt")
    assert eval_cli.main(["--checkpoint", ckpt, "--dataset", "somethingv2", "--data", str(root),
                          "--out", str(tmp_path / "ev"), "--no-plot"]) == 0
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert m["videos"] == 2 and m["meta"]["missing_videos"] == ["23"]
    assert prepare_cli.main(["--dataset", "somethingv2", str(root), str(tmp_path / "packs"), "--short-side", "32",
                             "--workers", "1"]) == 0
    assert eval_cli.main(["--checkpoint", ckpt, "--data", str(tmp_path / "packs"), "--out", str(tmp_path / "ev2"),
                          "--no-plot"]) == 0
    m2 = json.loads((tmp_path / "ev2" / "metrics.json").read_text())
    assert m2["videos"] == 2 and m2["meta"]["missing_videos"] == ["23"] and m2["top1"] == m["top1"]


@pytest.mark.slow
def test_train_command_trains_one_step_on_every_other_dataset(roots, tmp_path):
    """``python -m tsm_ds.train --dataset NAME --data ROOT`` trains (one optimizer step, validation, result.json)
    on the fixtures of somethingv1, jester, ucf101 split 2, hmdb51 split 3 and kinetics700: one process runs
    the five trainings in turn (~30 s)."""
    runs = {"somethingv1": [], "jester": [], "ucf101": ["--dataset-split", "2"], "hmdb51": ["--dataset-split", "3"],
            "kinetics700": []}
    argvs = [["--dataset", name, *extra, "--data", str(roots[name]), "--arch", "resnet18", "--num-segments", "2",
              "--img-size", "32", "--batch-size", "2", "--micro-batch-size", "2", "--max-steps", "1", "--epochs", "1",
              "--num-workers", "0", "--no-progress", "--deepspeed_config", "ds_configs/cpu_fp32.json",
              "--output-dir", str(tmp_path), "--run-name", name] for name, extra in runs.items()]
    code = ("import json, sys; from tsm_ds.cli.train import main; "
            "sys.exit(max(main(a) for a in json.loads(sys.argv[1])))")
    p = subprocess.run([sys.executable, "-c", code, json.dumps(argvs)], cwd=REPO,
                       env={**os.environ, "DS_ACCELERATOR": "cpu"}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for name in runs:
        result = json.loads((tmp_path / name / "result.json").read_text())
        rec = json.loads((tmp_path / name / "config.json").read_text())
        assert result["status"] == "completed" and result["steps"] == 1 and result["val_clips"] >= 1, name
        assert rec["config"]["data"]["dataset"] == name
        assert rec["run"]["flip"] is (name not in ("somethingv1", "jester")), name
