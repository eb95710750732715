"""Frame-index sampling: exact values from the official formulas (ops/dataset.py), worked by hand."""
from __future__ import annotations

import numpy as np
import pytest

from tsm_ds.data import sampling as S


def test_val_segment_centres():
    # tick = 12.5: int(6.25 + 12.5 x)
    assert S.tsn_val_indices(100, 8).tolist() == [6, 18, 31, 43, 56, 68, 81, 93]
    # tick = 1.125: int(0.5625 + 1.125 x)
    assert S.tsn_val_indices(9, 8).tolist() == [0, 1, 2, 3, 5, 6, 7, 8]


def test_val_short_video_is_all_first_frame_as_official():
    assert S.tsn_val_indices(5, 8).tolist() == [0] * 8
    assert S.tsn_val_indices(8, 8).tolist() == [0] * 8  # official: needs num_frames > T


def test_test_uniform_repeats_frames_of_short_videos():
    # tick = 0.625: int(0.3125 + 0.625 x)
    assert S.tsn_test_indices(5, 8).tolist() == [[0, 0, 1, 2, 2, 3, 4, 4]]
    assert S.tsn_test_indices(100, 8).tolist() == [S.tsn_val_indices(100, 8).tolist()]


def test_test_multi_clip_and_twice_sample():
    two = S.tsn_test_indices(100, 8, num_clips=2).tolist()
    assert two == [[3, 15, 28, 40, 53, 65, 78, 90], [9, 21, 34, 46, 59, 71, 84, 96]]
    twice = S.tsn_test_indices(100, 8, twice_sample=True).tolist()
    assert twice == [[6, 18, 31, 43, 56, 68, 81, 93], [0, 12, 25, 37, 50, 62, 75, 87]]


def test_train_one_random_frame_per_segment():
    rng = np.random.default_rng(0)
    draws = np.stack([S.tsn_train_indices(100, 8, rng) for _ in range(400)])
    avg = 100 // 8  # 12
    for x in range(8):
        # every frame of segment x, and only those, is drawn
        assert set(draws[:, x].tolist()) == set(range(x * avg, (x + 1) * avg))
    assert S.tsn_train_indices(8, 8, rng).tolist() == list(range(8))
    assert S.tsn_train_indices(5, 8, rng).tolist() == [0] * 8  # official short-video rule


def test_train_deterministic_under_seed():
    a = S.tsn_train_indices(300, 8, np.random.default_rng([1, 2, 3]))
    b = S.tsn_train_indices(300, 8, np.random.default_rng([1, 2, 3]))
    c = S.tsn_train_indices(300, 8, np.random.default_rng([1, 2, 4]))
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def test_dense_val_window_in_the_middle():
    # stride 64 // 8 = 8; sample_pos = 237 -> middle start 118
    assert S.dense_indices(300, 8, train=False).tolist() == list(range(118, 118 + 64, 8))


def test_dense_wraps_around_short_videos():
    assert S.dense_indices(20, 8, train=False).tolist() == [0, 8, 16, 4, 12, 0, 8, 16]
    rng = np.random.default_rng(0)
    assert S.dense_indices(20, 8, train=True, rng=rng).tolist() == [0, 8, 16, 4, 12, 0, 8, 16]


def test_dense_train_start_range():
    rng = np.random.default_rng(0)
    starts = {int(S.dense_indices(100, 8, train=True, rng=rng)[0]) for _ in range(500)}
    assert starts == set(range(0, 36))  # randint(0, sample_pos - 1), sample_pos = 37


def test_dense_test_ten_windows():
    v = S.dense_test_indices(300, 8, num_clips=10)
    assert v.shape == (10, 8)
    # starts = linspace(0, 236, 10).astype(int)
    assert v[:, 0].tolist() == [0, 26, 52, 78, 104, 131, 157, 183, 209, 236]
    assert v[9].tolist() == list(range(236, 300, 8))


def test_clip_indices_dispatch_and_errors():
    rng = np.random.default_rng(0)
    assert S.clip_indices(100, 8, mode="val").shape == (1, 8)
    assert S.clip_indices(100, 8, mode="train", rng=rng).shape == (1, 8)
    assert S.clip_indices(100, 8, mode="test", num_clips=3).shape == (3, 8)
    assert S.clip_indices(100, 8, mode="test", sampling="dense", num_clips=10).shape == (10, 8)
    with pytest.raises(ValueError):
        S.clip_indices(100, 8, mode="bogus")
    with pytest.raises(ValueError):
        S.clip_indices(100, 8, mode="val", sampling="bogus")
    with pytest.raises(ValueError):
        S.tsn_val_indices(0, 8)
    with pytest.raises(ValueError):
        S.clip_indices(100, 8, mode="train")  # no rng
