"""tsm-ds bench data: the loader tables and the format table (tsm_ds.bench.data, .data_formats) on tiny
inputs; structure and real values only, never speed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tsm_ds.bench import data_formats as F
from tsm_ds.cli import bench_data as cli


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """2 classes x 1 small textured H.264 clip (class-folder tree)."""
    from tsm_ds.data.testvideo import write_numbered_video

    root = tmp_path_factory.mktemp("bench_clips")
    for c in ("a", "b"):
        (root / c).mkdir()
        write_numbered_video(root / c / f"{c}0.mp4", 40, width=160, height=128, gop=12, texture=True)
    return root


def test_generated_frames_carry_their_number_at_any_scale():
    canvas = F._canvas(320, 180, 5)
    for i in (0, 3, 4):
        img = F.kinetics_like_frame(i, canvas, 320, 180)
        assert img.shape == (180, 320, 3) and img.dtype == np.uint8
        assert F.read_grid_number(img, 180) == i
        assert F.read_grid_number(img[::2, ::2], 180) == i       # a prepared (smaller) frame
    with pytest.raises(ValueError, match="unknown format"):
        F.prepare_format([], ".", ".", "nope")


def test_bench_data_quick_format_table(tmp_path, clips, capsys):
    out = tmp_path / "out"
    assert cli.main(["--quick", "--data", str(clips), "--out-dir", str(out), "--minutes", "0.02",
                     "--loaders", "tsm_ds", "--seconds", "1"]) == 0
    printed = capsys.readouterr().out
    payload = json.loads((out / "data.json").read_text())
    rows = [r for r in payload["rows"] if r.get("table") == "formats"]
    loaders = [r for r in payload["rows"] if r.get("table") != "formats"]
    assert {r["loader"] for r in loaders} >= {"tsm_ds"}                  # the loader tables stay
    formats = [F.FORMAT_NAMES[f] for f in F.available_formats()]
    inputs = ["generated 640x360 1 s 30 fps GOP 250", "generated 1280x720 1 s 30 fps GOP 250", "real clips (2 of 2)"]
    assert [(r["input"], r["format"]) for r in rows] == [(i, f) for i in inputs for f in formats]
    for r in rows:
        assert r["clips_per_s_per_core"] > 0 and r["bytes_per_clip"] > 0 and r["bytes_per_frame"] > 0
        assert r["cores_a100"] == pytest.approx(300.0 / r["clips_per_s_per_core"])
        assert r["cores_h100"] == pytest.approx(600.0 / r["clips_per_s_per_core"])
        assert r["decode_ms"] > 0 and r["crop_resize_ms"] > 0 and r["normalise_ms"] > 0 and r["item_ms"] > 0
        assert r["failed"] == []
        if r["format"] == "JPEG folders":
            assert r["files_per_video"] == r["frames_per_video"] and r["convert_ms"] is None
            assert r["bytes_vs_frames"] == 1.0 and r["vs_frames"] == 1.0
        else:                                    # raw, re-encoded and packed: one file per video
            assert r["files_per_video"] == 1
        if r["format"] in ("raw video", "re-encoded video"):
            assert r["convert_ms"] > 0 and r["frames_decoded_per_clip"] >= 8
        if r["format"] == "raw video":
            assert r["vs_raw"] == 1.0
        if r["input"].startswith("generated"):
            assert r["same_frames"] == 1.0 and r["frames_per_video"] == 30
    gen = {r["format"]: r for r in rows if r["input"] == inputs[0]}
    assert gen["re-encoded video"]["vs_raw"] == pytest.approx(
        gen["re-encoded video"]["clips_per_s_per_core"] / gen["raw video"]["clips_per_s_per_core"])
    meta = payload["meta"]["formats"]
    assert set(meta["jpeg_bytes_per_frame"]) == set(inputs)
    assert meta["jpeg_bytes_per_frame_generated_vs_real"] > 0
    assert meta["gpu_train_clips_per_s"] == {"A100": 300.0, "H100/H200": 600.0}
    md = (out / "data.md").read_text()
    assert "## Training items per core by data format" in md and "## Clip decoding" in md
    assert "clips/s/core" in printed and "A100" in printed
    # a rerun reuses the generated clips and the prepared copies
    assert sorted(p.name for p in (out / "bench_videos").glob("kinetics_like_*")) == [
        "kinetics_like_1s_360p_gop250.mp4", "kinetics_like_1s_720p_gop250.mp4"]


def test_no_format_table_when_none_asked(tmp_path, clips):
    from tsm_ds.bench.data import run_data_bench

    rows, jp, mp = run_data_bench(tmp_path, data=clips, quick=True, minutes=0.02, loaders=("tsm_ds",),
                                  formats=(), log=lambda s: None)
    assert rows and not [r for r in rows if r.get("table") == "formats"]
    assert "by data format" not in mp.read_text()
