"""Test views against the official TSM test pipeline (issue 18, item 3).

Reference: mit-han-lab/temporal-shift-module ``test_models.py`` at commit
23eada75c6e55cdd0b91f2c99f310918260885a1 (``--test_crops`` 1/3/5/10 branches, ``--full_res``:
``input_size = net.scale_size if args.full_res else net.input_size``) and ``ops/transforms.py`` at
commit 83c77b72e38cf27bc0cc3e7b3b0795d7d9b39957 (``GroupScale``, ``GroupCenterCrop``,
``GroupFullResSample``, ``GroupOverSample``, ``GroupMultiScaleCrop.fill_fix_offset``). The box
arithmetic and the PIL pipeline below are transcribed from those files, independently of
``tsm_ds.data.transforms``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tsm_ds.cli import eval as eval_cli
from tsm_ds.cli import predict as predict_cli
from tsm_ds.data import transforms as X
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.sampling import clip_indices
from tsm_ds.data.video import count_frames, decode_frames
from tsm_ds.inference import views

S, SCALE = 224, 256  # net.input_size, net.scale_size (224 * 256 // 224)
SIZES = [(320, 240), (340, 256), (240, 320), (560, 240), (1920, 1080), (112, 80)]
COMBOS = [(n, fr) for n in (1, 3, 5, 10) for fr in (False, True)]
MEAN = torch.tensor(X.IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(X.IMAGENET_STD).view(1, 3, 1, 1)


# ---- the official code, transcribed ------------------------------------------------------------
def official_scaled_size(w, h, size=SCALE):
    """GroupScale -> torchvision Resize(int): short side = size, long = int(size * long / short)."""
    return (size, int(size * h / w)) if w <= h else (int(size * w / h), size)


def official_fix_offset(image_w, image_h, crop_w, crop_h):
    """GroupMultiScaleCrop.fill_fix_offset(more_fix_crop=False)."""
    w_step, h_step = (image_w - crop_w) // 4, (image_h - crop_h) // 4
    return [(0, 0), (4 * w_step, 0), (0, 4 * h_step), (4 * w_step, 4 * h_step), (2 * w_step, 2 * h_step)]


def official_views(w, h, test_crops, full_res):
    """test_models.py's cropping for one frame: [(PIL crop box (l, t, r, b) in the scaled frame, flip)]."""
    input_size = SCALE if full_res else S
    iw, ih = official_scaled_size(w, h)
    if test_crops == 1:  # GroupCenterCrop -> torchvision CenterCrop
        left, t = int(round((iw - input_size) / 2.)), int(round((ih - input_size) / 2.))
        return [((left, t, left + input_size, t + input_size), False)]
    if test_crops == 3:  # GroupFullResSample(input_size, scale_size, flip=False)
        w_step, h_step = (iw - input_size) // 4, (ih - input_size) // 4
        offs = [(0 * w_step, 2 * h_step), (4 * w_step, 2 * h_step), (2 * w_step, 2 * h_step)]
        return [((x, y, x + input_size, y + input_size), False) for x, y in offs]
    out = []  # GroupOverSample(input_size, scale_size, flip=test_crops == 10): normal, then flipped
    for x, y in official_fix_offset(iw, ih, input_size, input_size):
        out.append(((x, y, x + input_size, y + input_size), False))
        if test_crops == 10:
            out.append(((x, y, x + input_size, y + input_size), True))
    return out


def official_pipeline(frames, test_crops, full_res):
    """PIL GroupScale (bilinear) + the crops (+ flips) on uint8 frames: int (V, T, C, C, 3)."""
    scaled = []
    for f in frames:
        im = Image.fromarray(f)
        scaled.append(im.resize(official_scaled_size(*im.size), Image.BILINEAR))
    out = []
    for box, flip in official_views(*Image.fromarray(frames[0]).size, test_crops, full_res):
        crops = [im.crop(box) for im in scaled]
        if flip:
            crops = [c.transpose(Image.FLIP_LEFT_RIGHT) for c in crops]
        out.append(np.stack([np.asarray(c) for c in crops]))
    return np.stack(out).astype(np.int32)


def unnorm(clip):
    """uint8 (the transforms' output) or normalised float (..., T, 3, H, W) -> int grey levels (..., T, H, W, 3)."""
    if clip.dtype == torch.uint8:
        return clip.movedim(-3, -1).numpy().astype(np.int32)
    x = (clip * STD + MEAN) * 255.0
    return x.round().movedim(-3, -1).numpy().astype(np.int32)


# ---- box arithmetic ----------------------------------------------------------------------------
@pytest.mark.parametrize("num_crops,full_res", COMBOS)
def test_boxes_equal_official(num_crops, full_res):
    for w, h in SIZES:
        t = X.ClipTransform("test", S, num_crops=num_crops, full_res=full_res)
        (sw, sh), got = t.scaled_boxes(w, h)
        assert (sw, sh) == official_scaled_size(w, h)
        want = official_views(w, h, num_crops, full_res)
        assert [((x, y, x + bw, y + bh), fl) for (x, y, bw, bh), fl in got] == want, (w, h)
        # "box" mode maps the same boxes to the source frame (factor source / scaled side)
        f = min(w, h) / SCALE
        side = SCALE if full_res else S
        src = t.boxes(w, h)
        assert len(src) == num_crops and all(out == side for _, out, _ in src)
        for ((x, y, bw, bh), _, fl), ((left, tp, r, b), wfl) in zip(src, want):
            assert (x, y, bw, bh, fl) == pytest.approx((left * f, tp * f, (r - left) * f, (b - tp) * f, wfl))


def test_box_values_by_hand():
    # 320x240 -> 341x256. 224 crops: w_step (341-224)//4 = 29, h_step (256-224)//4 = 8
    t = X.ClipTransform("test", S, num_crops=5, full_res=False)
    assert [b for b, _ in t.scaled_boxes(320, 240)[1]] == [
        (0, 0, 224, 224), (116, 0, 224, 224), (0, 32, 224, 224), (116, 32, 224, 224), (58, 16, 224, 224)]
    t3 = X.ClipTransform("test", S, num_crops=3, full_res=False)
    assert [b for b, _ in t3.scaled_boxes(320, 240)[1]] == [(0, 16, 224, 224), (116, 16, 224, 224),
                                                            (58, 16, 224, 224)]
    # full res: 256 crops, w_step (341-256)//4 = 21, h_step 0
    t1 = X.ClipTransform("test", S, num_crops=1, full_res=True)
    assert t1.scaled_boxes(320, 240)[1] == [((42, 0, 256, 256), False)]  # round(85 / 2) = 42 (half to even)
    t10 = X.ClipTransform("test", S, num_crops=10, full_res=True)
    assert t10.scaled_boxes(320, 240)[1] == [((x, 0, 256, 256), fl) for x in (0, 84, 0, 84, 42)
                                             for fl in (False, True)]


# ---- number of views ---------------------------------------------------------------------------
@pytest.mark.parametrize("num_crops,full_res", COMBOS)
def test_view_counts_and_shapes(num_crops, full_res):
    frames = np.random.default_rng(num_crops).integers(0, 256, (2, 240, 320, 3), dtype=np.uint8)
    side = SCALE if full_res else S
    for resize in X.RESIZE_MODES:
        t = X.ClipTransform("test", S, num_crops=num_crops, full_res=full_res, resize=resize)
        assert t.num_views == num_crops and t.crop_size == side
        out = t(frames)
        want = (2, 3, side, side) if num_crops == 1 else (num_crops, 2, 3, side, side)
        assert out.shape == want and out.dtype == torch.uint8
    for clips in (1, 2, 10):
        p = views.view_protocol(clips, num_crops, full_res=full_res)
        assert p.num_views == clips * num_crops and p.full_res is full_res
        assert p.dataset_kwargs()["full_res"] is full_res and p.dataset_kwargs()["num_crops"] == num_crops


def test_legacy_three_crops():
    # full_res=None keeps the pre-issue-18 meaning: 3 crops are full resolution, others are not
    assert X.ClipTransform("test", S, num_crops=3).crop_size == SCALE
    assert X.ClipTransform("test", S, num_crops=5).crop_size == S
    assert X.ClipTransform("val", S, full_res=True).crop_size == S  # val: always the centre S crop
    assert views.view_protocol(1, 3).full_res is True
    assert views.view_protocol(1, 3, full_res=False).full_res is False
    assert views.legacy_note(3, None) is not None
    assert views.legacy_note(3, False) is None and views.legacy_note(5, None) is None
    p = views.view_protocol(10, 3, full_res=False, resize="official")
    assert (p.num_crops, p.full_res, p.resize, p.num_views) == (3, False, "official", 30)
    assert "5 crops (corners + centre, full-res) = 5 views, resize=official" in views.view_protocol(
        1, 5, full_res=True, resize="official").describe()
    with pytest.raises(ValueError, match="resize"):
        views.view_protocol(1, 1, resize="pil")
    with pytest.raises(ValueError, match="num_crops=4"):
        views.view_protocol(1, 4)
    with pytest.raises(ValueError, match="resize"):
        X.ClipTransform("test", S, resize="nearest")


def test_cli_flags_parse():
    from tsm_ds.config import Config, parse
    from tsm_ds.config.commands import EVAL, PREDICT

    a = parse(EVAL, Config, ["--checkpoint", "c", "--out", "o", "--num-crops", "5", "--full-res", "--resize",
                             "official"])[0].views
    assert (a.num_crops, a.full_res, a.resize) == (5, True, "official")
    a = parse(EVAL, Config, ["--checkpoint", "c", "--out", "o", "--num-crops", "3"])[0].views
    assert (a.num_crops, a.full_res, a.resize) == (3, None, "box")
    b = parse(PREDICT, Config, ["v.mp4", "--checkpoint", "c", "--num-crops", "3", "--no-full-res"])[0]
    assert (b.views.num_crops, b.views.full_res, b.predict.videos) == (3, False, ["v.mp4"])
    with pytest.raises(SystemExit):
        eval_cli.build_parser().parse_args(["--checkpoint", "c", "--out", "o", "--num-crops", "4"])


# ---- pixels on real clips ----------------------------------------------------------------------
CLIPS = ["videos/juggling_soccer_ball/v_SoccerJuggling_g23_c01_part1.avi",  # 320x240: scaled up
         "videos/waving/TrumanShow_wave_f_nm_np1_fr_med_26.avi",              # 432x240: scaled up, wide
         "videos/walking/opencv_vtest_first250f.avi"]                          # 768x576: scaled down


@pytest.fixture(scope="module")
def real_frames(shared_data):
    out = []
    for rel in CLIPS:
        path = shared_data / rel
        n = count_frames(path)
        out.append(decode_frames(path, np.linspace(0, n // 2, 3).astype(int), num_frames=n))
    return out


@pytest.mark.parametrize("num_crops,full_res", COMBOS)
def test_official_resize_within_one_grey_level(real_frames, one_thread, num_crops, full_res):
    for frames in real_frames:
        ref = official_pipeline(frames, num_crops, full_res)
        t = X.ClipTransform("test", S, num_crops=num_crops, full_res=full_res, resize="official")
        got = unnorm(t(frames))
        got = got[None] if num_crops == 1 else got
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 1


def test_box_resize_differs_from_official_as_documented(real_frames, one_thread):
    # the default one-step resize is close on average but not pixel-exact (values in the README)
    diffs = []
    for frames in real_frames:
        ref = official_pipeline(frames, 1, False)[0]
        got = unnorm(X.ClipTransform("val", S)(frames))
        diffs.append(np.abs(got - ref))
    means = [d.mean() for d in diffs]
    assert all(0.05 < m < 3.0 for m in means), means
    assert max(d.max() for d in diffs) > 1  # not within 1: why --resize official exists


def test_dataset_official_resize_decodes_full_size(shared_data, one_thread):
    path = shared_data / CLIPS[2]
    n = count_frames(path)
    ds = VideoClipDataset([VideoRecord(path, 0, n)], num_segments=3, mode="test", img_size=S,
                          num_crops=5, full_res=True, resize="official")
    assert ds.decode_short_side is None and ds.num_views == 5
    clip = ds[0]["clip"]
    assert clip.shape == (5, 3, 3, SCALE, SCALE)
    idx = clip_indices(n, 3, mode="test", sampling="tsn", rng=np.random.default_rng(0))
    ref = official_pipeline(decode_frames(path, idx.reshape(-1), num_frames=n), 5, True)
    assert np.abs(unnorm(clip) - ref).max() <= 1
    with pytest.raises(ValueError, match="full_res"):
        VideoClipDataset([VideoRecord(path, 0, n)], mode="val", full_res=True)


# ---- the flags reach the data through tsm-ds eval / predict ------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """2 synthetic 64 px videos and an exported random resnet18 (T = 4) in the trainer's format."""
    from tsm_ds.data.synthetic import make_demo_dataset
    from tsm_ds.engine.checkpoint.manager import save_weights_export
    from tsm_ds.models import build_model

    root = tmp_path_factory.mktemp("views_official")
    d = make_demo_dataset(root / "data", classes=("moving_left", "moving_right"), train_per_class=1, val_per_class=1,
                          num_frames=12, size=64, speed=(1.0, 2.0), radius=(6.0, 8.0))
    torch.manual_seed(0)
    model = build_model("resnet18", 2, num_segments=4, dropout=0.0).eval()
    with torch.no_grad():
        model.new_fc.weight.mul_(20.0)
    save_weights_export(root / "m.pt", model, class_names=list(d["classes"]))
    return {"root": root, "val": d["val_list"], "ckpt": root / "m.pt", "model": model}


def _direct(model, records, **kw):
    ds = VideoClipDataset(records, num_segments=4, img_size=64, mode="test", **kw)
    with torch.no_grad():
        return np.stack([model(X.normalize_batch(ds[i]["clip"].reshape(-1, 4, 3, *ds[i]["clip"].shape[-2:]),
                                               *ds.normalization)).mean(0).numpy()
                         for i in range(len(ds))])


def test_eval_and_predict_cli_pass_view_flags(tiny_run, capsys, one_thread):
    import json

    from tsm_ds.data.records import read_video_list

    records = read_video_list(tiny_run["val"])
    out = tiny_run["root"] / "ev"
    flags = ["--num-crops", "5", "--full-res", "--resize", "official", "--img-size", "64"]
    assert eval_cli.main(["--checkpoint", str(tiny_run["ckpt"]), "--list", tiny_run["val"], "--out", str(out),
                          "--no-plot"] + flags) == 0
    scores = np.load(out / "scores.npz")["scores"]
    ref = _direct(tiny_run["model"], records, num_crops=5, full_res=True, resize="official")
    np.testing.assert_allclose(scores, ref, atol=1e-4, rtol=1e-5)
    other = _direct(tiny_run["model"], records, num_crops=5, full_res=False)
    assert np.abs(other - ref).max() > 1e-3  # the flags change the input
    meta = json.loads((out / "metrics.json").read_text())["meta"]
    assert meta["num_crops"] == 5
    assert meta["protocol"].endswith("5 crops (corners + centre, full-res) = 5 views, resize=official")
    assert "deprecated" not in capsys.readouterr().err

    js = tiny_run["root"] / "p.json"
    video = str(records[0].path)
    assert predict_cli.main([video, "--checkpoint", str(tiny_run["ckpt"]), "--num-crops", "3",
                             "--top-k", "2", "--json", str(js), "--img-size", "64"]) == 0
    assert "deprecated" in capsys.readouterr().err  # legacy --num-crops 3: full-res, with a note
    top = json.loads(js.read_text())["predictions"][video]["top"]
    legacy = torch.softmax(torch.from_numpy(_direct(tiny_run["model"], records[:1], num_crops=3, full_res=True)[0]), 0)
    assert top[0][1] == pytest.approx(float(legacy.max()), abs=1e-4)
