"""The demo dataset generator (tsm_ds.data.synthetic): deterministic, balanced, and with no label
information in a single frame."""
from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from tsm_ds.data.synthetic import CLASS_PAIRS, make_demo_dataset, render_clip, sample_clip

SMALL = dict(train_per_class=3, val_per_class=2, num_frames=8, size=48, speed=(1.0, 2.0),
             radius=(3.0, 5.0))


def _decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _read_list(path: str) -> list[tuple[str, int]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        rel, label = line.split()
        rows.append((rel, int(label)))
    return rows


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """Two datasets with seed 0 (one made with 2 worker processes), one with seed 1."""
    base = tmp_path_factory.mktemp("demo")
    return {
        "a": make_demo_dataset(base / "a", seed=0, **SMALL),
        "b": make_demo_dataset(base / "b", seed=0, workers=2, **SMALL),
        "c": make_demo_dataset(base / "c", seed=1, **SMALL),
    }


def test_same_seed_same_decoded_bytes_other_seed_differs(small):
    a, b, c = small["a"], small["b"], small["c"]
    assert Path(a["train_list"]).read_text() == Path(b["train_list"]).read_text()
    rows = _read_list(a["train_list"]) + _read_list(a["val_list"])
    assert len(rows) == 4 * (3 + 2)
    differ = 0
    for rel, _ in rows:
        fa = _decode(Path(a["root"]) / rel)
        fb = _decode(Path(b["root"]) / rel)
        fc = _decode(Path(c["root"]) / rel)
        assert fa.shape == (8, 48, 48, 3) and fa.dtype == np.uint8
        assert fa.tobytes() == fb.tobytes(), rel
        differ += fa.tobytes() != fc.tobytes()
    assert differ == len(rows)
    meta_a = json.loads(Path(a["meta"]).read_text())
    meta_b = json.loads(Path(b["meta"]).read_text())
    assert meta_a == meta_b


def test_labels_balanced_and_listed_in_class_order(small):
    a = small["a"]
    assert a["classes"] == ["moving_left", "moving_right", "moving_up", "moving_down"]
    assert (Path(a["root"]) / "classes.txt").read_text().split() == a["classes"]
    for key, per_class in (("train_list", 3), ("val_list", 2)):
        rows = _read_list(a[key])
        counts = np.bincount([label for _, label in rows], minlength=4)
        assert counts.tolist() == [per_class] * 4
        for rel, label in rows:  # the folder names the class the label says
            assert rel.split("/")[1] == a["classes"][label]
            assert (Path(a["root"]) / rel).is_file()


def test_twins_decode_to_the_same_frames_in_reverse_order(small):
    """moving_left clip j is moving_right clip j played backwards: only the order differs."""
    root = Path(small["a"]["root"])
    for j in range(3):
        right = _decode(root / f"train/moving_right/moving_right_{j:04d}.mp4").astype(np.int16)
        left = _decode(root / f"train/moving_left/moving_left_{j:04d}.mp4").astype(np.int16)
        # same frames up to the codec: H.264 at CRF 18 differs by ~1 level on average
        assert np.abs(left - right[::-1]).mean() < 2.0
        # ... and the order matters: played forwards, the object is elsewhere in most frames
        moved = np.abs(left - right).max(axis=(0, 3))
        assert (moved > 60).sum() >= 9  # at least one 3x3-px object's worth of changed pixels


def test_render_reverse_is_exact_time_reversal():
    for pair in CLASS_PAIRS:
        spec = sample_clip(pair, np.random.default_rng(7), size=48, num_frames=6, radius=(3.0, 5.0))
        fwd = render_clip(spec)
        assert fwd.shape == (6, 48, 48, 3)
        np.testing.assert_array_equal(render_clip(spec, reverse=True), fwd[::-1])
        assert not np.array_equal(fwd[0], fwd[-1]), pair  # something changes over time


def _pooled_positions(pair: str, reverse: bool, n: int, seed: int, frame: int | None = None):
    """Object centres (x, y) of n clips: all frames pooled (frame=None), or one frame index."""
    out = []
    for j in range(n):
        spec = sample_clip(pair, np.random.default_rng((seed, j)))
        centre = np.asarray(spec["centre"])[::-1] if reverse else np.asarray(spec["centre"])
        out.append(centre if frame is None else centre[frame:frame + 1])
    return np.stack(out)  # (n, frames, 2)


def _hist_distance(a: np.ndarray, b: np.ndarray, bins: np.ndarray) -> float:
    """Total-variation distance between the 2D position histograms of two position sets."""
    ha = np.histogram2d(a[..., 0].ravel(), a[..., 1].ravel(), bins=[bins, bins])[0]
    hb = np.histogram2d(b[..., 0].ravel(), b[..., 1].ravel(), bins=[bins, bins])[0]
    return 0.5 * np.abs(ha / ha.sum() - hb / hb.sum()).sum()


def _permutation_threshold(a: np.ndarray, b: np.ndarray, bins: np.ndarray, reps: int = 100) -> float:
    """The largest distance seen when clips are assigned to the two groups at random: what two
    samples of this size from ONE law typically show (clips, not frames, are exchangeable)."""
    rng = np.random.default_rng(0)
    both = np.concatenate([a, b])
    dists = []
    for _ in range(reps):
        perm = rng.permutation(len(both))
        dists.append(_hist_distance(both[perm[:len(a)]], both[perm[len(a):]], bins))
    return max(dists)


def test_single_frame_position_carries_no_class_information():
    """Pooled over frames (a single frame with no index, as TSN sees it), the object's position
    has one law for all four moving classes. Tolerance: the largest histogram distance among 100
    random relabellings of the same clips. Power: the same test flags the start position (frame 0),
    which does depend on the direction, by a wide margin."""
    n, bins = 300, np.linspace(0, 64, 9)
    right = _pooled_positions("horizontal", False, n, 1)
    left = _pooled_positions("horizontal", True, n, 2)
    down = _pooled_positions("vertical", False, n, 3)
    up = _pooled_positions("vertical", True, n, 4)
    for a, b in ((left, right), (up, down), (left, up), (right, down)):
        assert _hist_distance(a, b, bins) <= _permutation_threshold(a, b, bins)
    # the test can fail: first frames give away the direction (that was the pilot's leak)
    right0 = _pooled_positions("horizontal", False, n, 1, frame=0)
    left0 = _pooled_positions("horizontal", True, n, 2, frame=0)
    d0, t0 = _hist_distance(left0, right0, bins), _permutation_threshold(left0, right0, bins)
    assert d0 > 1.5 * t0
    # and a still coordinate drawn uniformly over the frame (a tempting simplification) is caught
    naive = right.copy()
    rng = np.random.default_rng(5)
    naive[..., 1] = rng.uniform(4.0, 60.0, (n, 1))
    assert _hist_distance(naive, down, bins) > _permutation_threshold(naive, down, bins)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="moving_sideways"):
        make_demo_dataset(tmp_path / "x", classes=["moving_left", "moving_sideways"])
    with pytest.raises(ValueError, match="do not fit"):
        make_demo_dataset(tmp_path / "x", size=32, speed=(3.0, 4.0))
    with pytest.raises(ValueError, match="encoder 'nope'"):
        make_demo_dataset(tmp_path / "x", codec="nope")


def test_reuses_a_complete_dataset_and_refuses_other_parameters(tmp_path):
    args = dict(train_per_class=1, val_per_class=1, num_frames=4, size=32, speed=(0.5, 1.0),
                radius=(2.0, 3.0), classes=["growing", "shrinking"])
    first = make_demo_dataset(tmp_path, **args)
    video = Path(first["root"]) / "train/growing/growing_0000.mp4"
    mtime = video.stat().st_mtime_ns
    again = make_demo_dataset(tmp_path, **args)
    assert again == first and video.stat().st_mtime_ns == mtime  # reused, not rewritten
    with pytest.raises(ValueError, match="meta.json.*other parameters"):
        make_demo_dataset(tmp_path, **{**args, "seed": 3})
    third = make_demo_dataset(tmp_path, **{**args, "seed": 3}, overwrite=True)
    assert _decode(Path(third["root"]) / "train/growing/growing_0000.mp4").shape == (4, 32, 32, 3)


def test_clutter_zero_is_a_flat_background_and_one_is_not():
    flat = sample_clip("horizontal", np.random.default_rng(3), size=48, num_frames=4,
                       radius=(3.0, 5.0), noise=(0.0, 0.0), clutter=0.0)
    frames = render_clip(flat)
    (cx, cy), r = flat["centre"][0], flat["radius"][0]
    yy, xx = np.mgrid[0:48, 0:48] + 0.5
    far = np.hypot(xx - cx, yy - cy) > r * 1.5 + 1  # pixels the object cannot touch
    expected = np.rint(np.asarray(flat["background"]["c0"]) * 255).astype(np.uint8)
    assert (frames[0][far] == expected).all()
    busy = render_clip(sample_clip("horizontal", np.random.default_rng(3), size=48, num_frames=4,
                                   radius=(3.0, 5.0), noise=(0.0, 0.0), clutter=1.0))
    assert len(np.unique(busy[0][far].reshape(-1, 3), axis=0)) > 100


def test_default_videos_give_validation_clips_with_motion():
    """The default videos have more frames than the demo's 8 segments, so validation clips take
    8 distinct frames (official segment centres 1, 3, ..., 15), not frame 0 eight times."""
    import inspect

    from tsm_ds.data.sampling import clip_indices

    n = inspect.signature(make_demo_dataset).parameters["num_frames"].default
    rng = np.random.default_rng(0)
    assert clip_indices(n, 8, mode="val", sampling="tsn", rng=rng).tolist() == [[1, 3, 5, 7, 9, 11, 13, 15]]
    # what 8-frame videos gave: one still frame, no motion to classify
    assert clip_indices(8, 8, mode="val", sampling="tsn", rng=rng).tolist() == [[0] * 8]


def test_object_differs_from_background_in_brightness_by_the_contrast():
    """Every clip's object (and distractor) is >= contrast brighter or darker than the mean of the
    background's colours, both polarities occur, and colours carry a tint (not only grey)."""
    signs, tinted = [], 0
    for j in range(200):
        rng = np.random.default_rng((7, j))
        spec = sample_clip("horizontal", rng, size=48, num_frames=8, speed=(1.0, 2.0),
                           radius=(3.0, 5.0), distractor_prob=0.5, contrast=0.4, tint=0.25)
        bg = spec["background"]
        luma = float(np.mean((np.asarray(bg["c0"]) + np.asarray(bg["c1"])) / 2))
        colours = [spec["colour"]] + ([spec["distractor"]["colour"]] if spec["distractor"] else [])
        for colour in colours:
            diff = float(np.mean(colour)) - luma
            assert abs(diff) >= 0.4 - 1e-12, (j, colour, luma)
            signs.append(diff > 0)
            tinted += float(np.ptp(colour)) > 0.05
    assert 0.2 < np.mean(signs) < 0.8
    assert tinted > len(signs) // 2
    with pytest.raises(ValueError, match="contrast"):
        sample_clip("horizontal", np.random.default_rng(0), contrast=0.5)
    with pytest.raises(ValueError, match="tint"):
        sample_clip("horizontal", np.random.default_rng(0), tint=-0.1)
