"""The packed format (``.jpack``): exact frames, one file per video, damage named and replaced."""
from __future__ import annotations

import io
import json
import os
import warnings

import numpy as np
import pytest
from PIL import Image

from tsm_ds.cli import prepare as prepare_cli
from tsm_ds.data import VideoClipDataset
from tsm_ds.data import video as D
from tsm_ds.data.records import read_class_folders, read_video_list
from tsm_ds.data.testvideo import number_frame, read_number, write_numbered_video
from tsm_ds.data.video import packed as P


def _frames(n, w=128, h=64):
    return [number_frame(i, w, h, texture=True) for i in range(n)]


def test_write_read_exact_jpeg_bytes_and_pixels(tmp_path):
    frames = _frames(12)
    path = tmp_path / "v.jpack"
    assert P.write_packed(path, frames, quality=90, meta={"source": "x.mp4"}) == 12
    with P.PackedVideo(path) as pv:
        assert (pv.num_frames, pv.width, pv.height) == (12, 128, 64)
        assert pv.meta == {"source": "x.mp4", "quality": 90}
        enc = pv.read_encoded([3, 4, 5, 11, 3])
        assert sorted(enc) == [3, 4, 5, 11]
        # the bytes are Pillow's JPEG of the frame, as prepare --mode frames writes it
        b = io.BytesIO()
        Image.fromarray(frames[4]).save(b, format="JPEG", quality=90)
        assert enc[4] == b.getvalue()
        out = pv.decode([11, 0, 5, 5, 40, -3])   # any order, repeats, clipped
    assert out.shape == (6, 64, 128, 3) and out.dtype == np.uint8
    assert [read_number(f) for f in out] == [11, 0, 5, 5, 11, 0]
    ref = np.asarray(Image.open(io.BytesIO(b.getvalue())).convert("RGB"))
    assert np.array_equal(D.read_packed_frames(path, [4])[0], ref)
    assert D.count_frames(path) == 12
    assert [read_number(f) for f in D.decode_all_frames(path)] == list(range(12))
    assert [(i, read_number(f)) for i, f in D.iter_frames(path, stride=5)] == [(0, 0), (5, 5), (10, 10)]
    # file layout: header, N + 1 offsets ending at the file size
    raw = path.read_bytes()
    assert raw[:8] == P.PACK_MAGIC
    offs = np.frombuffer(raw, "<u8", 13, 32)
    assert int(offs[-1]) == len(raw) and raw[int(offs[0]):int(offs[0]) + 2] == b"\xff\xd8"


def test_decode_frames_reads_packs_with_exact_indices(tmp_path):
    """0 wrong frames: the numbered frames come back at the asked indices, through the same
    reader every command uses."""
    P.write_packed(tmp_path / "v.jpack", _frames(40))
    idx = [39, 0, 17, 18, 19, 2, 2]
    assert [read_number(f) for f in D.decode_frames(tmp_path / "v.jpack", idx)] == idx


@pytest.mark.parametrize("damage, words", [
    ("truncate", "truncated"),
    ("append", "extended"),
    ("magic", "not a packed video"),
    ("frame", "frame 3 is not a whole JPEG"),
    ("empty", "not a packed video"),
])
def test_damaged_packs_are_named(tmp_path, damage, words):
    path = tmp_path / "v.jpack"
    P.write_packed(path, _frames(6))
    raw = bytearray(path.read_bytes())
    offs = np.frombuffer(bytes(raw), "<u8", 7, 32)
    if damage == "truncate":
        raw = raw[:len(raw) - 100]
    elif damage == "append":
        raw += b"junk"
    elif damage == "magic":
        raw[:8] = b"NOTAPACK"
    elif damage == "frame":
        raw[int(offs[3]):int(offs[3]) + 2] = b"\x00\x00"
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    with pytest.raises(D.VideoDecodeError) as e:
        D.read_packed_frames(path, [0, 3, 5])
    assert words in str(e.value) and str(path) in str(e.value)


def test_dataset_replaces_a_damaged_pack_and_names_it(tmp_path):
    good, bad = tmp_path / "good.jpack", tmp_path / "bad.jpack"
    P.write_packed(good, _frames(16))
    P.write_packed(bad, _frames(16))
    bad.write_bytes(bad.read_bytes()[:-500])           # a copy cut short
    recs = [D_rec(bad, 0), D_rec(good, 1)]
    ds = VideoClipDataset(recs, mode="val", num_segments=4, img_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        item = ds[0]
    # replaced by the only good record, whose label the item carries
    assert item["bad"] >= 1 and item["label"] == 1 and item["index"] == 0
    named = json.loads(item["bad_files"])
    assert named[0][0] == str(bad) and "truncated" in named[0][1]
    assert item["clip"].shape == (4, 3, 64, 64) and not item["clip"].dtype.is_floating_point
    assert ds[1]["bad"] == 0 and ds[1]["clip"].equal(item["clip"])


def D_rec(path, label):
    from tsm_ds.data.records import VideoRecord

    return VideoRecord(str(path), label)


def test_dct_scale_only_where_frames_exceed_the_need(tmp_path):
    assert [P.dct_scale_for(640, 360, s) for s in (None, 0, 331, 256, 180, 170, 90, 40, 10)] == \
        [1, 1, 1, 1, 2, 2, 4, 8, 8]
    P.write_packed(tmp_path / "v.jpack", _frames(3, 256, 128))
    full = D.decode_frames(tmp_path / "v.jpack", [1])
    half = D.decode_frames(tmp_path / "v.jpack", [1], short_side=64)
    assert full.shape == (1, 128, 256, 3) and half.shape == (1, 64, 128, 3)
    assert read_number(np.repeat(np.repeat(half[0], 2, 0), 2, 1)) == 1
    # the same picture: the half-scale decode is close to a 2x2 average of the full one
    avg = full[0].reshape(64, 2, 128, 2, 3).mean((1, 3))
    assert np.abs(avg - half[0]).mean() < 6


def test_prepare_packed_is_the_default_mode_resumes_and_rewrites_damage(tree, tmp_path, capsys):
    src = tree
    out = tmp_path / "out"
    assert prepare_cli.main([str(src), str(out), "--short-side", "0", "--workers", "1"]) == 1
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["mode"] == "packed"
    assert {r["src"].split("/")[-1]: r["status"] for r in report["files"]} == {
        "one.mp4": "done", "two.avi": "done", "broken.mp4": "failed"}
    recs = read_video_list(out / "all.txt")
    assert [(os.path.relpath(r.path, out), r.label) for r in recs] == [("a/one.jpack", 0),
                                                                      ("b/two.jpack", 1)]
    assert sorted(os.listdir(out / "a")) == ["one.jpack"]   # one file per video
    assert [read_number(f) for f in D.decode_all_frames(recs[0].path)] == list(range(20))
    assert [read_number(f) for f in D.decode_all_frames(recs[1].path)] == list(range(13))
    # the class tree of packs reads like a tree of videos
    tree_recs, names = read_class_folders(out)
    assert names == ["a", "b"] and [r.path for r in tree_recs] == [r.path for r in recs]
    # rerun: done packs skipped; a damaged one (cut short) written again
    two = out / "b" / "two.jpack"
    two.write_bytes(two.read_bytes()[:-10])
    prepare_cli.main([str(src), str(out), "--short-side", "0", "--workers", "1"])
    report = json.loads((out / "prepare_report.json").read_text())
    assert {r["src"].split("/")[-1]: r["status"] for r in report["files"]} == {
        "one.mp4": "skipped (exists)", "two.avi": "done", "broken.mp4": "failed"}
    assert D.count_frames(two) == 13


def test_frame_folders_decode_at_the_dct_scale_packs_use(tmp_path):
    from tsm_ds.data.prepare import extract_frames

    src = tmp_path / "v.mp4"
    write_numbered_video(src, 6, width=256, height=128, gop=6)
    extract_frames(str(src), str(tmp_path / "f"), short_side=0)
    full = D.decode_frames(tmp_path / "f", [1, 4], num_frames=6)
    half = D.decode_frames(tmp_path / "f", [1, 4], num_frames=6, short_side=64)
    assert full.shape == (2, 128, 256, 3) and half.shape == (2, 64, 128, 3)
    assert [read_number(np.repeat(np.repeat(f, 2, 0), 2, 1)) for f in half] == [1, 4]


def test_prepare_quality_sets_the_packs_jpeg_quality(tmp_path, capsys):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    write_numbered_video(src / "one.mp4", 8, texture=True, gop=8)
    sizes = {}
    for q in (50, 90):
        out = tmp_path / f"q{q}"
        assert prepare_cli.main([str(tmp_path / "src"), str(out), "--quality", str(q), "--short-side", "0",
                                 "--workers", "1"]) == 0
        with P.PackedVideo(out / "a" / "one.jpack") as pv:
            assert pv.meta["quality"] == q
            assert [read_number(f) for f in pv.decode(range(8))] == list(range(8))
        sizes[q] = (out / "a" / "one.jpack").stat().st_size
    assert sizes[50] < sizes[90]
    assert prepare_cli.main([str(tmp_path / "src"), str(tmp_path / "bad"), "--quality", "0"]) == 2
    assert "--quality 0" in capsys.readouterr().err


@pytest.mark.parametrize("mode, kwargs", [("train", {}), ("val", {}), ("test", {"num_clips": 2, "num_crops": 3})])
def test_packs_give_the_items_jpeg_folders_give(tmp_path, mode, kwargs):
    """The same JPEG bytes, the same draws: a pack's items equal its JPEG folder's, bit for bit
    (the pack path cuts the crops frame by frame, the folder path from the whole stacked clip)."""
    from tsm_ds.data.prepare import prepare_dataset
    from tsm_ds.data.records import VideoRecord

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for k, (w, h) in enumerate([(320, 240), (240, 320), (400, 224)]):
        write_numbered_video(src / f"v{k}.mp4", 30 + k, width=w, height=h, texture=True, gop=30)
    recs = [VideoRecord(str(p), 0) for p in sorted(src.iterdir())]
    for m in ("packed", "frames"):
        prepare_dataset(recs, str(tmp_path / "src"), str(tmp_path / m), mode=m, workers=1, progress=False,
                        short_side=128)
    packs = read_video_list(tmp_path / "packed" / "all.txt")
    folders = read_video_list(tmp_path / "frames" / "all.txt")
    a = VideoClipDataset(packs, mode=mode, num_segments=4, img_size=96, seed=1, **kwargs)
    b = VideoClipDataset(folders, mode=mode, num_segments=4, img_size=96, seed=1, **kwargs)
    for epoch in (0, 3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for i in range(len(packs)):
            assert a[i]["clip"].equal(b[i]["clip"]), (mode, epoch, i)


def test_rerun_with_other_options_rewrites_packs_and_bad_src_is_a_message(tmp_path, capsys):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    write_numbered_video(src / "one.mp4", 6, gop=6)
    out = tmp_path / "out"
    args = [str(tmp_path / "src"), str(out), "--short-side", "0", "--workers", "1"]
    assert prepare_cli.main(args) == 0
    assert prepare_cli.main(args + ["--quality", "60"]) == 0   # another quality: written again
    report = json.loads((out / "prepare_report.json").read_text())
    assert [r["status"] for r in report["files"]] == ["done"]
    with P.PackedVideo(out / "a" / "one.jpack") as pv:
        assert pv.meta["quality"] == 60
    assert prepare_cli.main(args + ["--quality", "60"]) == 0   # the same options: kept
    assert [r["status"] for r in json.loads((out / "prepare_report.json").read_text())["files"]] == [
        "skipped (exists)"]
    capsys.readouterr()
    assert prepare_cli.main([str(tmp_path / "nowhere"), str(out)]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert prepare_cli.main([str(src), str(out)]) == 2           # a class folder, not a tree of them
    assert "no class folders" in capsys.readouterr().err


def test_check_videos_full_reads_packs_with_the_pack_reader(tmp_path):
    from tsm_ds.data.check import check_file

    path = tmp_path / "v.jpack"
    P.write_packed(path, _frames(9))
    row = check_file(str(path), full=True)
    assert (row["status"], row["num_frames"], row["decodable"]) == ("ok", 9, 9)
    raw = bytearray(path.read_bytes())
    offs = np.frombuffer(bytes(raw), "<u8", 10, 32)
    # frame 4 (not one of the quick check's segment centres): markers kept, no image inside
    raw[int(offs[4]) + 2:int(offs[5]) - 2] = bytes(int(offs[5]) - int(offs[4]) - 4)
    path.write_bytes(bytes(raw))
    assert check_file(str(path))["status"] == "ok"
    row = check_file(str(path), full=True)
    assert row["status"] == "partial" and row["decodable"] == 4 and "frame 4" in row["reason"]


def test_evaluation_leaves_out_items_of_unreadable_files(tmp_path):
    """An unreadable pack's item holds another video's clip and label: scoring it would count that
    video twice, once under the bad file's name. Evaluation leaves it out and names it."""
    import torch
    from torch.utils.data import DataLoader

    from tsm_ds.data.records import VideoRecord
    from tsm_ds.engine.loop.evaluate import gather_predictions

    recs = []
    for v in range(4):
        path = tmp_path / f"v{v}.jpack"
        P.write_packed(path, _frames(8))
        recs.append(VideoRecord(str(path), v))
    (tmp_path / "v2.jpack").write_bytes(b"not a pack")
    ds = VideoClipDataset(recs, mode="val", num_segments=2, img_size=32)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        idx, scores, labels = gather_predictions(model, DataLoader(ds, batch_size=2))
    assert idx.tolist() == [0, 1, 3] and labels.tolist() == [0, 1, 3] and scores.shape == (3, 4)
    assert any("left out" in str(x.message) and "v2.jpack" in str(x.message) for x in w)


def test_a_source_that_decodes_part_way_is_packed_and_reported(shared_data, tmp_path, capsys):
    import shutil

    (tmp_path / "src" / "a").mkdir(parents=True)
    shutil.copy(shared_data / "edge_cases" / "decord_corrupted.mp4", tmp_path / "src" / "a")
    assert prepare_cli.main([str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "1"]) == 0
    (row,) = json.loads((tmp_path / "out" / "prepare_report.json").read_text())["files"]
    # the manifest: 50 frames declared, 28 decode, then InvalidDataError
    assert row["status"] == "done" and row["num_frames"] == 28
    assert row["reason"].startswith("partial source") and "decode error" in row["reason"]
    assert "partial" in capsys.readouterr().out


@pytest.mark.parametrize("args, words", [
    (["--mode", "video", "--quality", "50"], "--quality applies to --mode packed / frames only"),
    (["--keyint", "16"], "--keyint applies to --mode video only, not --mode packed"),
    (["--mode", "frames", "--crf", "20", "--tune", "none"], "--crf, --tune applies to --mode video only"),
])
def test_prepare_refuses_options_of_another_mode(tmp_path, capsys, args, words):
    assert prepare_cli.main([str(tmp_path), str(tmp_path / "out"), *args]) == 2
    assert words in capsys.readouterr().err
