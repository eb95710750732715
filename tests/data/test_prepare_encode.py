"""``prepare_video``'s encode (issue 27: options cheap to decode; issue 29: reproducible bytes) and
the RGB conversion the loader does per kept frame (one reused swscale context per thread)."""
from __future__ import annotations

import warnings

import av
import numpy as np
import pytest

from tsm_ds.data import video as D
from tsm_ds.data.prepare import prepare_video, x264_options
from tsm_ds.data.testvideo import read_number, write_numbered_video
from tsm_ds.data.video.convert import to_rgb

N = 60


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    return write_numbered_video(root / "src.mkv", N, width=256, height=128, gop=30, bframes=3,
                                texture=True)


def _x264_settings(path) -> str:
    """The options string x264 writes into the stream (SEI user data)."""
    data = open(path, "rb").read()
    start = data.index(b"options: ")
    return data[start:data.index(b"\x00", start)].decode("ascii", "replace")


def test_x264_options_pin_threads_and_keyint():
    o = x264_options(crf=23, preset="veryfast", keyint=16, x264_params="ref=1")
    assert o["crf"] == "23" and o["preset"] == "veryfast"
    assert o["x264-params"].split(":")[:4] == ["threads=1", "keyint=16", "min-keyint=16", "scenecut=0"]
    assert o["x264-params"].endswith("ref=1") and o["tune"] == "fastdecode"
    assert x264_options()["x264-params"] == "threads=1:b-pyramid=none"
    assert "tune" not in x264_options(tune="none")
    assert "threads" not in x264_options(threads=0).get("x264-params", "")
    with pytest.raises(ValueError):
        x264_options(threads=-1)


def test_prepare_video_is_reproducible_and_uses_the_fast_decode_options(source, tmp_path):
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    assert prepare_video(source, str(a), short_side=0, keyint=16) == N
    assert prepare_video(source, str(b), short_side=0, keyint=16) == N
    assert a.read_bytes() == b.read_bytes()   # x264 threads pinned: the same bytes every run
    s = _x264_settings(a)
    for opt in ("cabac=0", "deblock=0:", "weightb=0", "weightp=0", "b_pyramid=0", "threads=1 ",
                "keyint=16 ", "crf=23.0"):
        assert opt in s, (opt, s)


def test_prepared_frames_are_exact(source, tmp_path):
    """Every frame requested alone and in training-like clips is the frame asked for, and the
    pixels of the in-order decode (0 wrong frames)."""
    out = tmp_path / "p.mp4"
    prepare_video(source, str(out), short_side=0, keyint=16)
    assert D.count_frames(out) == N
    assert D.get_index(str(out)).key_pos.tolist() == [0, 16, 32, 48]
    ref = D.decode_all_frames(out)
    assert [read_number(f) for f in ref] == list(range(N))
    wrong = [i for i in range(N) if not np.array_equal(D.decode_frames(out, [i])[0], ref[i])]
    assert wrong == []
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx = np.sort(rng.choice(N, 8, replace=False)).tolist()
        got = D.decode_frames(out, idx)
        assert [read_number(f) for f in got] == idx
        assert np.array_equal(got, ref[idx])


def test_real_clip_prepared_twice_same_bytes_and_exact_frames(shared_data, tmp_path):
    src = shared_data / "videos" / "tai_chi" / "ta_chi_part1.mp4"
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n = prepare_video(str(src), str(a), short_side=256, keyint=16)
        prepare_video(str(src), str(b), short_side=256, keyint=16)
    assert a.read_bytes() == b.read_bytes()
    ref = D.decode_all_frames(a)
    assert len(ref) == n == D.count_frames(a)
    wanted = range(0, n, 3)
    wrong = [i for i in wanted if not np.array_equal(D.decode_frames(a, [i])[0], ref[i])]
    assert wrong == []


def _frames(path):
    c = av.open(str(path))
    try:
        return list(c.decode(video=0))
    finally:
        c.close()


def test_to_rgb_matches_pyav_to_ndarray_across_sizes_and_formats(tmp_path):
    """One reused swscale context per thread: frames of other sizes / pixel formats in turn, and
    the scaled path, give the pixels of ``frame.to_ndarray``."""
    small = _frames(write_numbered_video(tmp_path / "s.mp4", 6, width=128, height=64, texture=True))
    big = _frames(write_numbered_video(tmp_path / "b.mp4", 6, width=320, height=176, texture=True))
    jpeg = _frames(write_numbered_video(tmp_path / "j.avi", 6, codec="mjpeg", gop=1, bframes=0,
                                        pix_fmt="yuvj420p", texture=True))
    for fs in zip(small, big, jpeg):
        for f in fs:
            assert np.array_equal(to_rgb(f), f.to_ndarray(format="rgb24"))
            w, h = f.width // 2, f.height // 2
            assert np.array_equal(to_rgb(f, (w, h)), f.to_ndarray(format="rgb24", width=w, height=h,
                                                                  interpolation="BILINEAR"))
