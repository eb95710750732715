"""tsm-ds eval end to end: multi-view scores equal a direct computation; 2 ranks under the deepspeed
launcher equal 1 process; DeepSpeed directories and official checkpoints load; bad input is named."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tsm_ds.cli import eval as eval_cli
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import read_video_list
from tsm_ds.data.transforms import normalize_batch
from tsm_ds.engine.checkpoint.manager import save_weights_export
from tsm_ds.inference.loading import load_for_inference
from tsm_ds.models import build_model
from tsm_ds.utils.node import free_port

T, SIZE = 4, 64
CLASSES = ("moving_left", "moving_right", "moving_up")
PROTOCOL = ["--num-clips", "2", "--num-crops", "3", "--img-size", str(SIZE), "--batch-size", "2"]


def _random_model(num_classes: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = build_model("resnet18", num_classes, num_segments=T, dropout=0.0)
    with torch.no_grad():  # non-trivial BN statistics and a spread-out head: distinct predictions
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
        m.new_fc.weight.mul_(20.0)
    return m.eval()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """5 synthetic validation videos (of 3 classes) and an exported checkpoint in the trainer's format."""
    from tsm_ds.data.synthetic import make_demo_dataset

    root = tmp_path_factory.mktemp("eval_demo")
    d = make_demo_dataset(root / "data", classes=CLASSES, train_per_class=1, val_per_class=3,
                          num_frames=16, size=64, speed=(1.0, 2.0), radius=(6.0, 8.0))
    model = _random_model(len(CLASSES))
    save_weights_export(root / "best_model.pt", model, class_names=list(d["classes"]))
    # 5 videos: odd, so that 2 ranks need DistributedSampler padding
    lines = Path(d["val_list"]).read_text().splitlines()[:5]
    (root / "data" / "val5.txt").write_text("\n".join(lines) + "\n")
    return {"root": root, "val": str(root / "data" / "val5.txt"), "ckpt": root / "best_model.pt",
            "model": model, "classes": list(d["classes"])}


@pytest.fixture(scope="module")
def single(demo):
    """One single-process evaluation (2 clips x 3 crops) shared by the tests that compare with it."""
    out = demo["root"] / "single"
    scores, metrics = _run_eval(["--checkpoint", str(demo["ckpt"]), "--list", demo["val"]] + PROTOCOL, out)
    return {"out": out, "scores": scores, "metrics": metrics}


def _direct_scores(model, records, **ds_kwargs) -> np.ndarray:
    """Per-video mean of the model's logits over the dataset's views, without tsm_ds.engine."""
    ds = VideoClipDataset(records, num_segments=T, img_size=SIZE, **ds_kwargs)
    with torch.no_grad():
        return np.stack([model(normalize_batch(ds[i]["clip"].reshape(-1, T, 3, *ds[i]["clip"].shape[-2:]),
                                               *ds.normalization)).mean(0).numpy()
                         for i in range(len(ds))])


def _run_eval(args, out):
    rc = eval_cli.main(args + ["--out", str(out)])
    assert rc == 0
    return np.load(out / "scores.npz"), json.loads((out / "metrics.json").read_text())


def test_multiview_eval_equals_direct_computation(demo, single, tmp_path):
    scores, metrics = single["scores"], single["metrics"]
    records = read_video_list(demo["val"])
    ref = _direct_scores(demo["model"], records, mode="test", num_clips=2, num_crops=3, twice_sample=True)
    assert ref.shape == (5, 3)
    assert scores["indices"].tolist() == list(range(5))
    assert scores["labels"].tolist() == [r.label for r in records]
    np.testing.assert_allclose(scores["scores"], ref, atol=1e-4, rtol=1e-5)
    pred = ref.argmax(1)
    labels = np.array([r.label for r in records])
    assert metrics["top1"] == pytest.approx(100.0 * (pred == labels).mean())
    assert metrics["top5"] == 100.0  # 3 classes: top-5 covers all
    assert metrics["meta"]["protocol"].startswith("2 clips (twice sample) x 3 crops")
    assert np.array(metrics["confusion_matrix"]).sum() == 5
    rows = list(csv.DictReader((single["out"] / "predictions.csv").open()))
    assert [r["pred_name"] for r in rows] == [demo["classes"][p] for p in pred]
    assert [Path(r["path"]).name for r in rows] == [Path(r.path).name for r in records]

    # --average prob: mean of per-view softmax
    probs, _ = _run_eval(["--checkpoint", str(demo["ckpt"]), "--list", demo["val"], "--average", "prob",
                          "--num-clips", "1", "--num-crops", "1", "--img-size", str(SIZE)], tmp_path / "p")
    ref1 = _direct_scores(demo["model"], records, mode="test")
    np.testing.assert_allclose(probs["scores"], torch.softmax(torch.from_numpy(ref1), 1).numpy(), atol=1e-5)


@pytest.mark.slow
def test_two_ranks_under_deepspeed_launcher_equal_one_process(demo, single, tmp_path):
    launcher = Path(sys.executable).parent / "deepspeed"
    if not launcher.exists():
        pytest.skip(f"no deepspeed launcher next to {sys.executable}")
    args = ["--checkpoint", str(demo["ckpt"]), "--list", demo["val"]] + PROTOCOL
    m1 = single["metrics"]
    single = single["scores"]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, str(launcher), "--num_gpus", "2", "--master_port", str(free_port()),
                           "--module", "tsm_ds.cli.eval"] + args + ["--out", str(tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world size 2" in proc.stdout
    multi = np.load(tmp_path / "two" / "scores.npz")
    m2 = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert m2["meta"]["world_size"] == 2 and m1["meta"]["world_size"] == 1
    # 5 videos on 2 ranks: DistributedSampler pads to 6; each video is counted exactly once
    assert multi["indices"].tolist() == single["indices"].tolist() == list(range(5))
    assert multi["labels"].tolist() == single["labels"].tolist()
    np.testing.assert_allclose(multi["scores"], single["scores"], atol=1e-5, rtol=0)
    assert m2["confusion_matrix"] == m1["confusion_matrix"] and m2["top1"] == m1["top1"]
    assert (tmp_path / "two" / "confusion.png").is_file()


def test_deepspeed_checkpoint_directory(demo, tmp_path):
    """DeepSpeed's save layout: <dir>/latest names the tag; <tag>/mp_rank_00_model_states.pt holds
    "module" plus the client state (model_config, class_names) merged at the top level."""
    run = tmp_path / "run"
    tag = run / "checkpoints" / "step00000007"
    tag.mkdir(parents=True)
    model = demo["model"]
    torch.save({"module": model.state_dict(), "ds_version": "0.19.8", "model_config": model.config,
                "class_names": demo["classes"], "global_steps": 7}, tag / "mp_rank_00_model_states.pt")
    (run / "checkpoints" / "latest").write_text("step00000007")
    loaded = load_for_inference(run)  # the run directory; also works with .../checkpoints
    assert loaded.source == "deepspeed" and loaded.class_names == demo["classes"]
    x = torch.randn(2, T, 3, SIZE, SIZE)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x))
    assert load_for_inference(tag).class_names == demo["classes"]


def test_bad_checkpoint_and_foreign_classes_are_named(demo, tmp_path, capsys):
    rc = eval_cli.main(["--checkpoint", str(tmp_path / "nope.pt"), "--list", demo["val"], "--out", str(tmp_path)])
    assert rc == 2 and "nope.pt" in capsys.readouterr().err
    other = _random_model(2)
    save_weights_export(tmp_path / "two_classes.pt", other, class_names=["moving_left", "spinning"])
    (tmp_path / "folders" / "moving_up").mkdir(parents=True)
    vid = Path(read_video_list(demo["val"])[2].path)
    (tmp_path / "folders" / "moving_up" / vid.name).symlink_to(vid)
    rc = eval_cli.main(["--checkpoint", str(tmp_path / "two_classes.pt"), "--data", str(tmp_path / "folders"),
                        "--out", str(tmp_path / "o"), "--img-size", str(SIZE)])
    err = capsys.readouterr().err
    assert rc == 2 and "moving_up" in err and "not among the checkpoint's 2 classes" in err


def test_official_checkpoint_on_kinetics_clips(shared_data, tmp_path):
    """An official TSM file (DataParallel keys, options in the name) evaluated on real clips whose
    Kinetics-400 index is known; class names from the label map."""
    from tsm_ds.models.official import official_key

    model = _random_model(400, seed=1)
    sd = {official_key(k, model): v for k, v in model.state_dict().items()}
    ck = tmp_path / f"TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment{T}_e50.pth"
    torch.save({"epoch": 50, "arch": "resnet18", "state_dict": sd, "best_prec1": torch.tensor(0.0)}, ck)
    clips = [("extra_clips/archery/paddlevideo_example_ucf101_archery.avi", 5),
             ("extra_clips/yoga/Tw2yXa6CzWE.mp4", 398)]
    lst = tmp_path / "k400.txt"
    lst.write_text("".join(f"{shared_data / p} {k}\n" for p, k in clips))
    labels = shared_data / "kinetics400_labels.txt"
    scores, metrics = _run_eval(["--checkpoint", str(ck), "--labels", str(labels), "--list", str(lst),
                                 "--img-size", str(SIZE)], tmp_path / "r")
    assert metrics["meta"]["checkpoint_kind"] == "official" and metrics["num_classes"] == 400
    rows = list(csv.DictReader((tmp_path / "r" / "predictions.csv").open()))
    assert [r["label_name"] for r in rows] == ["archery", "yoga"]
    ref = _direct_scores(model, read_video_list(lst), mode="test")
    np.testing.assert_allclose(scores["scores"], ref, atol=1e-4, rtol=1e-5)
    names = labels.read_text().splitlines()
    assert [r["pred_name"] for r in rows] == [names[i] for i in ref.argmax(1)]


def test_trained_image_size_travels_with_the_checkpoint(tmp_path):
    """The tools run a model at the size it was trained at unless --img-size says otherwise."""
    from tsm_ds.inference.loading import resolve_img_size

    model = _random_model(3)
    save_weights_export(tmp_path / "m112.pt", model, class_names=["a", "b", "c"], extra={"img_size": 112})
    save_weights_export(tmp_path / "old.pt", model, class_names=["a", "b", "c"])  # file without the key
    loaded = load_for_inference(tmp_path / "m112.pt")
    assert loaded.img_size == 112
    assert resolve_img_size(None, loaded) == 112
    assert resolve_img_size(64, loaded) == 64
    assert resolve_img_size(None, load_for_inference(tmp_path / "old.pt")) == 224
