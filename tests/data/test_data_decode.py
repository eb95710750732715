"""Decoding by value: tiny videos synthesised here carry their frame number in every frame
(tsm_ds.data.testvideo), so each decoded frame says which frame it is."""
from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

from tsm_ds.data import video as D
from tsm_ds.data.testvideo import number_frame, read_number, write_numbered_video
from tsm_ds.data.video import index as video_index

N = 120
RNG = np.random.default_rng(1234)
VFR_PTS = [int(t) for t in np.cumsum(np.r_[0, RNG.integers(20, 300, N - 1)])]  # ms, irregular

CASES = {
    "h264_bframes_short_gop.mp4": dict(codec="libx264", gop=6, bframes=2),
    "h264_bframes_long_gop.mkv": dict(codec="libx264", gop=100, bframes=3),
    "h264_vfr.mp4": dict(codec="libx264", gop=10, bframes=2, pts=VFR_PTS),
    "mpeg4_bframes.avi": dict(codec="mpeg4", gop=12, bframes=2),
    "mpeg4_no_b.avi": dict(codec="mpeg4", gop=12, bframes=0),
    "mjpeg_intra.avi": dict(codec="mjpeg", gop=1, bframes=0, pix_fmt="yuvj420p"),
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    return {name: write_numbered_video(root / name, N, **kw) for name, kw in CASES.items()}


def numbers(frames: np.ndarray) -> list[int]:
    return [read_number(f) for f in frames]


def test_number_pattern_roundtrip():
    for i in (0, 1, 255, 256, 9000, 65535):
        assert read_number(number_frame(i)) == i
        assert read_number(number_frame(i, 640, 360, texture=True)) == i


@pytest.mark.parametrize("name", list(CASES))
def test_reference_decoder_sees_every_frame_in_order(videos, name):
    # the synthesised files themselves are right: decoding all frames gives 0..N-1
    assert numbers(D.decode_all_frames(videos[name])) == list(range(N))
    assert D.count_frames(videos[name]) == N


@pytest.mark.parametrize("name", list(CASES))
def test_requested_indices_exact(videos, name):
    path = videos[name]
    rng = np.random.default_rng(7)
    requests = [[0], [N - 1], [5, 50, 119, 3, 60], [60, 60, 2, 2], list(range(0, N, 15)),
                sorted(rng.integers(0, N, 8).tolist()), rng.integers(0, N, 8).tolist()]
    for req in requests:
        out = D.decode_frames(path, req)
        assert out.dtype == np.uint8 and out.shape == (len(req), 64, 128, 3)
        assert numbers(out) == req, (name, req)


def test_out_of_range_indices_are_clipped(videos):
    out = D.decode_frames(videos["h264_bframes_short_gop.mp4"], [-3, N + 10])
    assert numbers(out) == [0, N - 1]


def test_seekable_detection(videos):
    # x264 in mp4/mkv carries real pts; AVI with B-frames only decode-order stamps
    assert D.get_index(videos["h264_bframes_short_gop.mp4"]).seekable
    assert D.get_index(videos["h264_vfr.mp4"]).seekable
    assert not D.get_index(videos["mpeg4_bframes.avi"]).seekable
    assert D.get_index(videos["mpeg4_no_b.avi"]).seekable


def test_short_gop_decodes_only_the_needed_gop(videos):
    # last frame of a 6-frame-GOP video: seek to keyframe 114, decode <= 6 frames + reorder delay
    st = D.DecodeStats()
    assert numbers(D.decode_frames(videos["h264_bframes_short_gop.mp4"], [N - 1], stats=st)) == [N - 1]
    assert st.seeks == 1 and st.decoded <= 6 + 3
    # 8 segment centres: never the whole video
    st = D.DecodeStats()
    D.decode_frames(videos["h264_bframes_short_gop.mp4"], [7, 22, 37, 52, 67, 82, 97, 112], stats=st)
    assert st.decoded < N // 2


def test_long_gop_decodes_forward_instead_of_seeking(videos):
    # frames 10 and 90 share keyframe 0: one forward pass, no seek, and it stops at frame 90
    st = D.DecodeStats()
    out = D.decode_frames(videos["h264_bframes_long_gop.mkv"], [10, 90], stats=st, skip_nonref=False)
    assert numbers(out) == [10, 90]
    assert st.seeks == 0 and 91 <= st.decoded <= 91 + 4
    # frame 110 lies past keyframe 100: after frame 10 the decoder seeks
    st = D.DecodeStats()
    out = D.decode_frames(videos["h264_bframes_long_gop.mkv"], [10, 110], stats=st, skip_nonref=False)
    assert numbers(out) == [10, 110]
    assert st.seeks == 1 and st.decoded <= 11 + 4 + 11 + 4


def test_skipping_non_reference_frames_is_exact_and_decodes_less(videos):
    path = videos["h264_bframes_long_gop.mkv"]  # x264, 3 B-frames: many are not references
    req = [10, 41, 42, 43, 90, 99]
    full, skip = D.DecodeStats(), D.DecodeStats()
    a = D.decode_frames(path, req, stats=full, skip_nonref=False)
    b = D.decode_frames(path, req, stats=skip)
    assert numbers(a) == numbers(b) == req and np.array_equal(a, b)
    assert skip.decoded < 0.75 * full.decoded


def test_vfr_index_is_presentation_order_not_time(videos):
    # with irregular gaps a time-based index would pick other frames
    path = videos["h264_vfr.mp4"]
    idx = [0, 1, 2, 30, 31, 77, 119]
    assert numbers(D.decode_frames(path, idx)) == idx


def test_sequential_fallback_for_reordering_avi(videos):
    st = D.DecodeStats()
    out = D.decode_frames(videos["mpeg4_bframes.avi"], [40, 10], stats=st)
    assert numbers(out) == [40, 10] and st.sequential and st.decoded <= 41 + 2


def test_index_cache_keyed_by_size_and_mtime(tmp_path):
    p = write_numbered_video(tmp_path / "v.mp4", 20, gop=5)
    assert D.count_frames(p) == 20
    write_numbered_video(tmp_path / "v.mp4", 33, gop=5)  # same path, new content
    assert D.count_frames(p) == 33


def test_disk_index_cache_roundtrip(tmp_path):
    p = write_numbered_video(tmp_path / "v.mkv", 25, gop=5)
    D.set_index_cache_dir(tmp_path / "cache")
    try:
        first = D.get_index(p)
        D.clear_index_cache()
        second = D.get_index(p)  # from disk now
        assert list((tmp_path / "cache").glob("*.npz"))
        assert second is not first and second.num_frames == 25
        assert np.array_equal(second.pkt_pts, first.pkt_pts) and second.seekable == first.seekable
        assert numbers(D.decode_frames(p, [3, 24])) == [3, 24]
    finally:
        D.set_index_cache_dir(None)
        D.clear_index_cache()


@pytest.mark.parametrize("rotation,k", [(90, 1), (-90, 3), (180, 2)])
def test_rotation_metadata_applied_like_ffmpeg_autorotate(tmp_path, rotation, k):
    import av

    p = write_numbered_video(tmp_path / f"rot{rotation}.mp4", 12, rotation=rotation, gop=4)
    with av.open(p) as c:
        raw = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert c.streams.video[0].codec_context.width == 128
    out = D.decode_frames(p, [0, 7])
    # display matrix rotation r (counter-clockwise degrees): ffmpeg shows the frame turned by r,
    # i.e. np.rot90(k = r / 90 mod 4): -90 -> a clockwise turn (transpose=clock)
    assert out.shape == ((2, 128, 64, 3) if k % 2 else (2, 64, 128, 3))
    assert np.array_equal(out[1], np.rot90(raw[7], k))
    assert read_number(np.rot90(out[1], -k)) == 7


def test_rotation_direction_on_a_known_image():
    img = np.zeros((2, 3, 3), np.uint8)
    img[0, 0] = 255  # top-left marker
    cw = D.rotate(img, -90)  # ffmpeg transpose=clock: top-left goes to top-right
    assert cw.shape == (3, 2, 3) and cw[0, 1, 0] == 255
    ccw = D.rotate(img, 90)  # top-left goes to bottom-left
    assert ccw[2, 0, 0] == 255


def test_video_stream_chosen_when_audio_comes_first(tmp_path):
    import av

    p = str(tmp_path / "audio_first.mp4")
    with av.open(p, "w") as c:
        a = c.add_stream("aac", rate=16000)
        v = c.add_stream("libx264", rate=25)
        v.width, v.height, v.pix_fmt = 128, 64, "yuv420p"
        for i in range(10):
            for pk in v.encode(av.VideoFrame.from_ndarray(number_frame(i), format="rgb24")):
                c.mux(pk)
        for pk in v.encode():
            c.mux(pk)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp",
                                           layout="mono")
        frame.sample_rate = 16000
        for pk in a.encode(frame):
            c.mux(pk)
        for pk in a.encode():
            c.mux(pk)
    with av.open(p) as c:
        assert c.streams[0].type == "audio"
    assert D.count_frames(p) == 10
    assert numbers(D.decode_frames(p, [9, 4])) == [9, 4]


# ---- bad input ------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(D.VideoOpenError, match="not found"):
        D.count_frames(tmp_path / "nope.mp4")


def test_garbage_and_empty_files(tmp_path):
    (tmp_path / "text.mp4").write_text("this is not a video\n" * 50)
    (tmp_path / "empty.avi").write_bytes(b"")
    for name in ("text.mp4", "empty.avi"):
        with pytest.raises(D.VideoError) as e:
            D.decode_frames(tmp_path / name, [0])
        assert name in str(e.value)


def test_truncated_file_keeps_decoded_frames_and_fills_the_tail(tmp_path, videos):
    import av

    src = videos["mpeg4_no_b.avi"]
    with av.open(src) as c:
        pos = [pk.pos for pk in c.demux(video=0) if pk.size]
    p = tmp_path / "cut.avi"
    p.write_bytes(open(src, "rb").read()[: pos[60] + 4])  # cut inside frame 60's packet
    n = D.count_frames(p)
    assert 60 <= n <= 61
    ref = numbers(D.decode_all_frames(p))
    assert ref == list(range(len(ref))) and 55 <= len(ref) <= 61
    last = len(ref) - 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = D.decode_frames(p, [0, last, n - 1])
    assert numbers(out) == [0, last, last]
    assert any(str(p) in str(x.message) for x in w) == (n - 1 > last)


def test_stream_shorter_than_packets_warns_once_and_repeats_last_frame(tmp_path, monkeypatch):
    p = write_numbered_video(tmp_path / "v.mkv", 20, gop=5)
    idx = D.get_index(p)
    # pretend the demuxer saw 3 more packets than the decoder delivers (as DivX placeholders do)
    monkeypatch.setattr(idx, "num_frames", 23)
    monkeypatch.setattr(idx, "frame_pts", np.r_[idx.frame_pts, idx.frame_pts[-1] + np.arange(1, 4)])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        st = D.DecodeStats()
        out = D.decode_frames(p, [2, 19, 21, 22], stats=st)
        D.decode_frames(p, [22])
    assert numbers(out) == [2, 19, 19, 19] and st.missing == 2
    msgs = [str(x.message) for x in w if "could not be decoded" in str(x.message)]
    assert len(msgs) == 1 and str(p) in msgs[0]


def test_jpeg_frame_folder(tmp_path):
    from PIL import Image

    d = tmp_path / "clip"
    d.mkdir()
    for i in range(12):
        Image.fromarray(number_frame(i)).save(d / f"img_{i + 1:05d}.jpg", quality=95)
    assert D.count_frames(d) == 12
    assert numbers(D.decode_frames(d, [0, 11, 5, 5])) == [0, 11, 5, 5]
    assert numbers(D.decode_frames(d, [0, 30], num_frames=12)) == [0, 11]


def test_time_base_other_than_ms(tmp_path):
    pts = [i * 3 for i in range(15)]
    p = write_numbered_video(tmp_path / "tb.mkv", 15, gop=4, pts=pts, time_base=Fraction(1, 90))
    assert numbers(D.decode_frames(p, [14, 0, 7])) == [14, 0, 7]


def test_iter_frames_streams_in_one_pass(videos):
    got = [(i, read_number(f)) for i, f in D.iter_frames(videos["h264_bframes_long_gop.mkv"],
                                                         stride=7, start=3, stop=40)]
    assert got == [(i, i) for i in range(3, 40, 7)]
    rot = list(D.iter_frames(videos["mpeg4_bframes.avi"], stride=50))
    assert [i for i, _ in rot] == [0, 50, 100] and [read_number(f) for _, f in rot] == [0, 50, 100]


def test_iter_decoded_is_the_sequential_loop(videos, tmp_path):
    # every frame in presentation order, counted; raw frames, converted by the caller
    st = D.DecodeStats()
    frames = [D.to_rgb(f) for f in D.iter_decoded(videos["mpeg4_bframes.avi"], stats=st)]
    assert numbers(frames) == list(range(N)) and st.decoded == N and st.error is None
    # a file cut part-way: the loop stops quietly, the stats say why, the frames before are kept
    import av

    src = videos["mpeg4_no_b.avi"]
    with av.open(src) as c:
        pos = [pk.pos for pk in c.demux(video=0) if pk.size]
    cut = tmp_path / "cut.avi"
    cut.write_bytes(open(src, "rb").read()[: pos[30] + 4])
    kept = numbers(D.to_rgb(f) for f in D.iter_decoded(cut))
    assert kept[:30] == list(range(30)) and len(kept) in (30, 31)  # frame 30: concealed if any
    with pytest.raises(D.VideoOpenError):
        next(D.iter_decoded(tmp_path / "nope.mp4"))


def test_iter_frames_fills_a_short_stream_as_decode_frames_does(tmp_path):
    p = write_numbered_video(tmp_path / "v.mkv", 20, gop=5)
    # the caller's frame count exceeds the decodable frames by 3 (as DivX placeholder packets do)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = list(D.iter_frames(p, stride=2, num_frames=23))
        list(D.iter_frames(p, stride=2, num_frames=23))
    assert [i for i, _ in got] == list(range(0, 23, 2))
    assert numbers(f for _, f in got) == list(range(0, 20, 2)) + [19, 19]
    msgs = [str(x.message) for x in w if "could not be decoded" in str(x.message)]
    assert len(msgs) == 1 and str(p) in msgs[0] and "last decoded frame 19" in msgs[0]
    # num_frames also ends the pass: nothing at or past it
    assert [i for i, _ in D.iter_frames(p, num_frames=7, stride=3)] == [0, 3, 6]


def test_iter_frames_reads_frame_folders(tmp_path):
    from PIL import Image

    d = tmp_path / "clip"
    d.mkdir()
    for i in range(7):
        Image.fromarray(number_frame(i)).save(d / f"img_{i + 1:05d}.jpg", quality=95)
    got = list(D.iter_frames(d, stride=3, start=1))
    assert [i for i, _ in got] == [1, 4] and numbers(f for _, f in got) == [1, 4]


def test_short_side_scales_down_during_conversion(videos):
    path = videos["h264_bframes_short_gop.mp4"]
    small = D.decode_frames(path, [3, 100], short_side=32)
    assert small.shape == (2, 32, 64, 3)
    # the number cells (16 px, now 8 px) are still there: upscale back and read them
    big = np.repeat(np.repeat(small, 2, axis=1), 2, axis=2)
    assert numbers(big) == [3, 100]
    assert D.decode_frames(path, [3], short_side=500).shape == (1, 64, 128, 3)  # never up


def test_index_cache_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(video_index, "INDEX_CACHE_SIZE", 2)
    D.clear_index_cache()
    paths = [write_numbered_video(tmp_path / f"c{i}.mkv", 5 + i, gop=5) for i in range(3)]
    assert [D.count_frames(p) for p in paths] == [5, 6, 7]
    assert len(video_index._index_cache) == 2
    assert D.count_frames(paths[0]) == 5  # rebuilt after eviction
    D.set_index_cache_size(1)               # the argument behind TSM_DS_INDEX_CACHE_SIZE (train: --index-cache-size)
    assert video_index.INDEX_CACHE_SIZE == 1 and len(video_index._index_cache) == 1
    with pytest.raises(ValueError, match=">= 1 entry"):
        D.set_index_cache_size(0)
    D.clear_index_cache()


def test_containers_closed_no_fd_leak(videos, tmp_path):
    import os

    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 4096)
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        pytest.skip("needs /proc/self/fd")
    D.decode_frames(videos["h264_vfr.mp4"], [1])  # warm caches and lazy imports
    before = len(os.listdir(fd_dir))
    for _ in range(20):
        D.decode_frames(videos["h264_vfr.mp4"], [1, 100, 50])
        D.decode_frames(videos["mpeg4_bframes.avi"], [3])
        list(D.iter_frames(videos["mjpeg_intra.avi"], stop=3))
        with pytest.raises(D.VideoError):
            D.decode_frames(bad, [0])
    assert len(os.listdir(fd_dir)) == before
