"""Real files from ../shared/data: every frame we return is the frame a full in-order decode gives
at that position, and every edge case either decodes so or is reported as unreadable."""
from __future__ import annotations

import csv
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from tsm_ds.data import video as D
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord, split_by_source_group
from tsm_ds.data.sampling import tsn_val_indices

# files that must be reported (not decoded), with the reason's class
EXPECTED_UNREADABLE = {"edge_cases/torchcodec_nasa_13013_audio_only.mp3": D.NoVideoStreamError}
# files whose stream delivers fewer frames than packets (the tail is replaced by the last frame)
SHORT_STREAM = {"edge_cases/decord_corrupted.mp4", "edge_cases/hmdb51_cartwheel_nonutf8_metadata.avi",
                "edge_cases/opencv_box_audio_stream_first.mp4",
                "videos/waving/RATRACE_wave_f_nm_np1_fr_goo_37.avi",
                "videos/waving/SchoolRulesHowTheyHelpUs_wave_f_nm_np1_ba_med_0.avi",
                "videos/waving/TrumanShow_wave_f_nm_np1_fr_med_26.avi"}


def manifest(shared_data: Path) -> list[dict]:
    with open(shared_data / "manifest.csv", newline="") as f:
        return list(csv.DictReader(f))


def reference_frames(path: str, wanted: set[int]) -> tuple[dict[int, np.ndarray], int]:
    """Decode every frame in order (PyAV, one thread), keeping only ``wanted``; returns
    (frames, number of frames decoded before the end or the first error)."""
    import av

    out, n = {}, 0
    with av.open(path, metadata_errors="ignore") as c:
        s = next(v for v in c.streams.video)
        s.codec_context.thread_count = 1
        try:
            for frame in c.decode(s):
                if n in wanted:
                    out[n] = D.rotate(frame.to_ndarray(format="rgb24"), frame.rotation)
                n += 1
        except av.FFmpegError:
            pass
    return out, n


def media_files(shared_data: Path, sets: tuple[str, ...]) -> list[str]:
    return [r["path"] for r in manifest(shared_data) if r["set"] in sets]


def media_rows(shared_data: Path, sets: tuple[str, ...]) -> list[dict]:
    return [r for r in manifest(shared_data) if r["set"] in sets]


def _check_exact(shared_data: Path, row: dict) -> None:
    rel = row["path"]
    path = str(shared_data / rel)
    if rel in EXPECTED_UNREADABLE:
        with pytest.raises(EXPECTED_UNREADABLE[rel]) as e:
            D.decode_frames(path, [0])
        assert path in str(e.value)
        return
    n = D.count_frames(path)
    decodable = int(row["frames_decoded_pyav"])  # the manifest's full-decode count
    assert n >= decodable and (n == decodable) == (rel not in SHORT_STREAM)
    rng = np.random.default_rng(zlib.crc32(rel.encode()))
    requests = [tsn_val_indices(decodable, 8).tolist(), rng.integers(0, decodable, 6).tolist(),
                [decodable - 1, 0]]
    ref, seen = reference_frames(path, {i for r in requests for i in r})
    assert seen == decodable
    for req in requests:
        out = D.decode_frames(path, req)
        for j, i in enumerate(req):
            assert np.array_equal(out[j], ref[i]), f"{rel}: frame {i} differs from in-order decoding"


def test_edge_cases_decode_exactly_or_are_reported(shared_data):
    rows = media_rows(shared_data, ("edge_cases",))
    assert len(rows) == 28
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:
            _check_exact(shared_data, row)


def test_training_clips_decode_exactly(shared_data):
    rows = media_rows(shared_data, ("videos",))
    assert len(rows) == 17
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:
            _check_exact(shared_data, row)


def test_every_single_frame_request_matches_in_order_decoding(shared_data):
    """One frame at a time (a seek per request, non-reference packets skipped where the decoder
    allows it): every frame of the short edge cases, 40 spread over the longer ones. Caught AV1
    (libdav1d), whose NONREF skipping returned wrong frames for 8 of 128 single-frame requests."""
    rows = [r for r in media_rows(shared_data, ("edge_cases",)) if r["path"] not in EXPECTED_UNREADABLE]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:
            path, decodable = str(shared_data / row["path"]), int(row["frames_decoded_pyav"])
            wanted = list(range(decodable)) if decodable <= 200 else \
                np.linspace(0, decodable - 1, 40).round().astype(int).tolist()
            ref, _ = reference_frames(path, set(wanted))
            wrong = [i for i in wanted if not np.array_equal(D.decode_frames(path, [i])[0], ref[i])]
            assert wrong == [], f"{row['path']}: single-frame requests {wrong} differ from in-order decoding"


def test_rotation_files_turned_as_a_player_shows_them(shared_data):
    # coded 568x320; display matrices -90 / +90 turn them upright to 320x568
    for name, shape in [("decord_rotate_0.mov", (320, 568)), ("decord_rotate_90.mov", (568, 320)),
                        ("decord_rotate_180.mov", (320, 568)), ("decord_rotate_270.mov", (568, 320))]:
        out = D.decode_frames(shared_data / "edge_cases" / name, [0, 2])
        assert out.shape[1:3] == shape, name


def test_edge_cases_through_the_dataset(shared_data):
    rows = media_files(shared_data, ("edge_cases",))
    recs = [VideoRecord(str(shared_data / r), i) for i, r in enumerate(rows)]
    ds = VideoClipDataset(recs, num_segments=8, mode="val", img_size=64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        items = [ds[i] for i in range(len(ds))]
    reported = {rows[i] for i, it in enumerate(items) if it["bad"]}
    assert reported == set(EXPECTED_UNREADABLE)
    for it in items:
        assert it["clip"].shape == (8, 3, 64, 64) and bool(np.isfinite(it["clip"].numpy()).all())
    msgs = [str(x.message) for x in w]
    assert any("audio_only.mp3" in m and "no video stream" in m for m in msgs)


def test_train_loader_over_the_real_split(shared_data):
    train, val, classes = split_by_source_group(shared_data)
    ds = VideoClipDataset(train[:3], num_segments=4, mode="train", img_size=64, seed=0)
    for i in range(3):
        it = ds[i]
        assert it["bad"] == 0 and it["clip"].shape == (4, 3, 64, 64) and it["label"] == train[i].label
