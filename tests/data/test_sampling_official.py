"""Every frame-sampling rule against the official TSM code, by value (issue 18, item 2).

The ``official_*`` functions below are transcriptions of mit-han-lab/temporal-shift-module
``ops/dataset.py`` at commit d6da93d7a1dbff5a0dc54da8b1ae9dae28127329 (``TSNDataSet.
_sample_indices``, ``_get_val_indices``, ``_get_test_indices``), with ``record.num_frames`` ->
``num_frames``, ``self.*`` -> arguments, and the global ``randint`` / ``np.random.randint``
replaced by an injected ``randint`` with the same signature (``randint(low, high=None,
size=None)``, as ``numpy.random.Generator.integers``). They return the official 1-based image
numbers; ours are 0-based, so ``ours == official - 1`` everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest

from tsm_ds.data import sampling as S

SEGMENTS = range(1, 33)
FRAMES = range(1, 3001)
# random rules: their arithmetic on the draws is integer-only (no rounding that depends on the
# size of num_frames), so every short-video and window-wrap case (num_frames <= 256 covers
# num_frames < T, = T, < 64, sample_pos 1 and 2) plus every 7th length up to 3000 suffices
RANDOM_FRAMES = list(range(1, 257)) + list(range(257, 3001, 7))


# ---- official expressions (ops/dataset.py @ d6da93d7a1dbff5a0dc54da8b1ae9dae28127329) ----

def official_sample_indices(num_frames, num_segments, dense_sample, randint, new_length=1):
    """TSNDataSet._sample_indices (training)."""
    if dense_sample:  # i3d dense sample
        sample_pos = max(1, 1 + num_frames - 64)
        t_stride = 64 // num_segments
        start_idx = 0 if sample_pos == 1 else randint(0, sample_pos - 1)
        offsets = [(idx * t_stride + start_idx) % num_frames for idx in range(num_segments)]
        return np.array(offsets) + 1
    else:  # normal sample
        average_duration = (num_frames - new_length + 1) // num_segments
        if average_duration > 0:
            offsets = np.multiply(list(range(num_segments)), average_duration) + randint(
                average_duration, size=num_segments)
        elif num_frames > num_segments:
            offsets = np.sort(randint(num_frames - new_length + 1, size=num_segments))
        else:
            offsets = np.zeros((num_segments,))
        return offsets + 1


def official_val_indices(num_frames, num_segments, new_length=1):
    """TSNDataSet._get_val_indices, dense_sample=False (the dense branch is the training one)."""
    if num_frames > num_segments + new_length - 1:
        tick = (num_frames - new_length + 1) / float(num_segments)
        offsets = np.array([int(tick / 2.0 + tick * x) for x in range(num_segments)])
    else:
        offsets = np.zeros((num_segments,))
    return offsets + 1


def official_test_indices(num_frames, num_segments, dense_sample=False, twice_sample=False,
                          new_length=1):
    """TSNDataSet._get_test_indices (dense: 10 clips; twice: 2 clips; else 1 clip), flat."""
    if dense_sample:
        sample_pos = max(1, 1 + num_frames - 64)
        t_stride = 64 // num_segments
        start_list = np.linspace(0, sample_pos - 1, num=10, dtype=int)
        offsets = []
        for start_idx in start_list.tolist():
            offsets += [(idx * t_stride + start_idx) % num_frames for idx in range(num_segments)]
        return np.array(offsets) + 1
    elif twice_sample:
        tick = (num_frames - new_length + 1) / float(num_segments)
        offsets = np.array([int(tick / 2.0 + tick * x) for x in range(num_segments)] +
                           [int(tick * x) for x in range(num_segments)])
        return offsets + 1
    else:
        tick = (num_frames - new_length + 1) / float(num_segments)
        offsets = np.array([int(tick / 2.0 + tick * x) for x in range(num_segments)])
        return offsets + 1


def _mismatches(ours, official):
    """(T, N) pairs of the grid where ``ours(N, T).ravel() + 1 != official(N, T)``.

    Compares one (3000, K * T) block per T (one numpy comparison instead of 3000)."""
    bad = []
    for t in SEGMENTS:
        a = np.array([ours(n, t).ravel() for n in FRAMES]) + 1
        b = np.array([official(n, t) for n in FRAMES])
        assert a.shape == b.shape
        bad += [(t, FRAMES[i]) for i in np.nonzero((a != b).any(axis=1))[0].tolist()]
    return bad


def _official_dense_test_fast(num_frames, num_segments):
    """official_test_indices(dense_sample=True): the same linspace call (cached per num_frames),
    the list comprehension as exact integer broadcasting."""
    start_list = _official_dense_starts(num_frames)
    return ((start_list[:, None] + np.arange(num_segments) * (64 // num_segments))
            % num_frames).ravel() + 1


_DENSE_STARTS: dict[int, np.ndarray] = {}


def _official_dense_starts(num_frames):
    if num_frames not in _DENSE_STARTS:
        sample_pos = max(1, 1 + num_frames - 64)
        _DENSE_STARTS[num_frames] = np.linspace(0, sample_pos - 1, num=10, dtype=int)
    return _DENSE_STARTS[num_frames]


# ---- exhaustive: num_segments 1..32 x num_frames 1..3000 ----

def test_val_equals_official_everywhere():
    assert _mismatches(S.tsn_val_indices, official_val_indices) == []


def test_uniform_test_equals_official_everywhere():
    assert _mismatches(S.tsn_test_indices, official_test_indices) == []


def test_twice_sample_equals_official_everywhere():
    ours = lambda n, t: S.tsn_test_indices(n, t, twice_sample=True)  # noqa: E731
    official = lambda n, t: official_test_indices(n, t, twice_sample=True)  # noqa: E731
    assert _mismatches(ours, official) == []


def test_fast_dense_transcription_equals_the_plain_one():
    for n in list(range(1, 130)) + list(range(130, 3001, 89)):
        for t in SEGMENTS:
            assert _official_dense_test_fast(n, t).tolist() == \
                official_test_indices(n, t, dense_sample=True).tolist(), (n, t)


def test_dense_test_equals_official_everywhere():
    ours = lambda n, t: S.dense_test_indices(n, t, num_clips=10, window=64)  # noqa: E731
    assert _mismatches(ours, _official_dense_test_fast) == []


def test_clip_indices_test_and_val_are_the_official_rules():
    for n, t in [(6, 7), (100, 8), (5, 8), (3000, 31)]:
        assert (S.clip_indices(n, t, mode="test") + 1).ravel().tolist() == \
            official_test_indices(n, t).tolist()
        assert (S.clip_indices(n, t, mode="val") + 1).ravel().tolist() == \
            official_val_indices(n, t).astype(np.int64).tolist()


def _replay(seed, ours, official):
    """(T, N) mismatches of a random rule over SEGMENTS x RANDOM_FRAMES when both sides draw
    from equal, separately seeded Generators (one stream per T, consumed in the same order),
    and whether the streams ended in step (the next draw agrees)."""
    in_step = True
    bad = []
    for t in SEGMENTS:
        ours_rng, official_rng = np.random.default_rng([seed, t]), np.random.default_rng([seed, t])
        a = np.array([ours(n, t, ours_rng) for n in RANDOM_FRAMES]) + 1
        b = np.array([official(n, t, official_rng.integers) for n in RANDOM_FRAMES])
        bad += [(t, RANDOM_FRAMES[i]) for i in np.nonzero((a != b).any(axis=1))[0].tolist()]
        in_step &= ours_rng.integers(1 << 30) == official_rng.integers(1 << 30)
    return bad, in_step


def test_tsn_train_equals_official_given_the_same_draws():
    bad, in_step = _replay(18, S.tsn_train_indices,
                           lambda n, t, randint: official_sample_indices(n, t, False, randint))
    assert bad == [] and in_step


def test_dense_train_equals_official_given_the_same_draws():
    bad, in_step = _replay(19, lambda n, t, rng: S.dense_indices(n, t, train=True, rng=rng),
                           lambda n, t, randint: official_sample_indices(n, t, True, randint))
    assert bad == [] and in_step


@pytest.mark.parametrize("n,t", [(100, 8), (97, 7), (3000, 32), (31, 32), (1, 1), (12, 3)])
def test_train_from_explicit_draws_is_the_official_expression(n, t):
    avg = n // t
    for draws in (np.zeros(t, dtype=np.int64), np.full(t, avg - 1), np.arange(t) % max(avg, 1)):
        # stands in for the official randint(average_duration, size=T)
        replay = lambda high, size=None: np.array(draws)  # noqa: E731
        expect = official_sample_indices(n, t, False, replay).astype(np.int64).tolist()
        assert (S.tsn_train_from_draws(n, t, draws) + 1).tolist() == expect


def test_train_from_draws_rejects_draws_outside_the_segment():
    with pytest.raises(ValueError):
        S.tsn_train_from_draws(100, 8, np.full(8, 12))  # avg = 12: draws must be < 12
    with pytest.raises(ValueError):
        S.tsn_train_from_draws(100, 8, np.zeros(7, dtype=np.int64))
    assert S.tsn_train_from_draws(5, 8, None).tolist() == [0] * 8  # avg == 0: nothing drawn


def test_dense_window_from_explicit_start():
    # official: (idx * (64 // 8) + 40) % 100 for idx in range(8)
    assert S.dense_window_indices(100, 8, 40).tolist() == [40, 48, 56, 64, 72, 80, 88, 96]
    assert S.dense_window_indices(20, 8, 0).tolist() == [0, 8, 16, 4, 12, 0, 8, 16]
    with pytest.raises(ValueError):
        S.dense_window_indices(100, 8, -1)


# ---- hard-coded: official values where main before issue 18 differed by one frame ----
# (main computed int(tick * (x + 0.5)), which rounds differently from int(tick / 2.0 + tick * x))

UNIFORM_OFFICIAL_0_BASED = {
    (6, 7): [0, 1, 2, 2, 3, 4, 5],
    (12, 7): [0, 2, 4, 5, 7, 9, 11],
    (6, 9): [0, 1, 1, 2, 3, 3, 4, 4, 5],
    (28, 10): [1, 4, 7, 9, 12, 15, 18, 20, 23, 26],
    (10, 11): [0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9],
    (8, 12): [0, 1, 1, 2, 3, 3, 4, 4, 5, 6, 6, 7],
    (4, 14): [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3],
    (10, 15): [0, 1, 1, 2, 3, 3, 4, 4, 5, 6, 6, 7, 8, 9, 9],
    (16, 24): [0, 1, 1, 2, 3, 3, 4, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 11, 12, 13, 13, 14, 15, 15],
    (2, 29): [0] * 15 + [1] * 14,
}


@pytest.mark.parametrize("n,t", sorted(UNIFORM_OFFICIAL_0_BASED))
def test_uniform_test_hard_coded_official_values(n, t):
    expect = UNIFORM_OFFICIAL_0_BASED[(n, t)]
    assert (official_test_indices(n, t) - 1).tolist() == expect  # the table is the official rule
    assert S.tsn_test_indices(n, t).tolist() == [expect]
    # twice_sample's first clip is the same centres rule
    assert S.tsn_test_indices(n, t, twice_sample=True)[0].tolist() == expect


def test_twice_sample_hard_coded():
    # tick = 6 / 7: centres int(3/7 + 6/7 x), starts int(6/7 x)
    assert S.tsn_test_indices(6, 7, twice_sample=True).tolist() == [
        [0, 1, 2, 2, 3, 4, 5], [0, 0, 1, 2, 3, 4, 5]]
