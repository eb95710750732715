"""tsm-ds predict on the real clips of ../shared/data/extra_clips with an untrained small model:
valid class names for every clip, the right probabilities, unreadable files named, online streaming."""
from __future__ import annotations

import json

import numpy as np
import torch

from tsm_ds.cli import predict as predict_cli
from tsm_ds.data import video
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.transforms import normalize_batch
from tsm_ds.engine.checkpoint.manager import save_weights_export
from tsm_ds.inference import predict
from tsm_ds.models import build_model

T, SIZE = 4, 64


def _model(num_classes: int, shift: str = "bidirectional") -> torch.nn.Module:
    torch.manual_seed(0)
    m = build_model("resnet18", num_classes, num_segments=T, shift=shift, dropout=0.0)
    with torch.no_grad():
        m.new_fc.weight.mul_(50.0)  # spread the scores so that the ranking is not a tie
    return m.eval()


def _clips(shared_data):
    clips = sorted(p for p in (shared_data / "extra_clips").rglob("*") if p.is_file())
    assert len(clips) >= 10
    return clips


def test_predict_names_every_real_clip_and_reports_unreadable(shared_data, tmp_path, capsys):
    clips = _clips(shared_data)
    names = sorted({p.parent.name for p in clips})
    model = _model(len(names))
    save_weights_export(tmp_path / "m.pt", model, class_names=names)
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"this is not a video" * 100)
    missing = tmp_path / "missing.mp4"
    audio = shared_data / "edge_cases" / "torchcodec_nasa_13013_audio_only.mp3"
    videos = [str(p) for p in clips] + [str(broken), str(missing), str(audio)]
    rc = predict_cli.main(videos + ["--checkpoint", str(tmp_path / "m.pt"), "--top-k", "3",
                                "--img-size", str(SIZE), "--json", str(tmp_path / "pred.json")])
    out, err = capsys.readouterr()
    assert rc == 1  # some videos could not be read; the others were predicted
    res = json.loads((tmp_path / "pred.json").read_text())["predictions"]
    for clip in clips:
        top = res[str(clip)]["top"]
        assert len(top) == 3 and all(name in names for name, _ in top), (clip, top)
        probs = [p for _, p in top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert f"1. {top[0][0]}" in out
    for bad, why in ((broken, "cannot open"), (missing, "no such file"), (audio, "no video stream")):
        assert why in res[str(bad)]["error"], res[str(bad)]
        assert str(bad) in err
    assert "3 of %d videos could not be read" % len(videos) in err

    # the printed probabilities are the softmax of the model's logits on the 1-crop test clip
    clip = clips[0]
    ds1 = VideoClipDataset([VideoRecord(str(clip), 0)], num_segments=T, img_size=SIZE, mode="test")
    item = ds1[0]
    assert item["clip"].dtype == torch.uint8
    with torch.no_grad():
        ref = torch.softmax(model(normalize_batch(item["clip"][None], *ds1.normalization))[0], 0)
    vals, idx = ref.topk(3)
    assert [n for n, _ in res[str(clip)]["top"]] == [names[i] for i in idx]
    np.testing.assert_allclose([p for _, p in res[str(clip)]["top"]], vals.numpy(), atol=1e-5)


def test_predict_kinetics_label_map_and_multiview(shared_data, tmp_path, capsys):
    labels = shared_data / "kinetics400_labels.txt"
    k400 = labels.read_text().splitlines()
    model = _model(400)
    torch.save({"state_dict": model.state_dict(), "model_config": model.config, "class_names": None},
               tmp_path / "k.pt")
    clip = shared_data / "extra_clips" / "archery" / "paddlevideo_example_ucf101_archery.avi"
    rc = predict_cli.main([str(clip), "--checkpoint", str(tmp_path / "k.pt"), "--labels", str(labels),
                       "--img-size", str(SIZE), "--num-clips", "2", "--num-crops", "3", "--top-k", "5"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [ln.split(". ", 1)[1].rsplit(" ", 1)[0].strip() for ln in out.splitlines() if ln.startswith("  ")]
    assert len(lines) == 5 and all(n in k400 for n in lines)
    ds = VideoClipDataset([VideoRecord(str(clip), 0)], num_segments=T, img_size=SIZE, mode="test",
                          num_clips=2, num_crops=3, twice_sample=True)
    with torch.no_grad():
        # 6 views, logits averaged
        ref = torch.softmax(model(normalize_batch(ds[0]["clip"], *ds.normalization)).mean(0), 0)
    assert lines == [k400[i] for i in ref.topk(5).indices]


def test_predict_online_streams_frames_through_step(shared_data, tmp_path, capsys):
    clip = shared_data / "extra_clips" / "archery" / "paddlevideo_example_ucf101_archery.avi"
    names = [f"action_{i}" for i in range(6)]
    model = _model(len(names), shift="online")
    save_weights_export(tmp_path / "online.pt", model, class_names=names)
    rc = predict_cli.main([str(clip), "--checkpoint", str(tmp_path / "online.pt"), "--online", "--stride", "3",
                       "--max-frames", "8", "--window", "4", "--img-size", str(SIZE), "--json",
                       str(tmp_path / "o.json")])
    out = capsys.readouterr().out
    assert rc == 0
    running = [ln for ln in out.splitlines() if ln.strip().startswith("frame")]
    assert [int(ln.split()[1]) for ln in running] == [0, 3, 6, 9, 12, 15, 18, 21]
    assert all(ln.split()[2] in names for ln in running)
    # reference: the same 8 frames through model.step; prediction = softmax(mean of last 4 logits)
    frames = video.decode_frames(clip, list(range(0, 24, 3)))
    cache, logits = None, []
    with torch.no_grad():
        for f in frames:
            lg, cache = model.step(predict.frame_transform(f, SIZE)[None], cache)
            logits.append(lg[0])
    ref = torch.softmax(torch.stack(logits[-4:]).mean(0), 0)
    top = json.loads((tmp_path / "o.json").read_text())["predictions"][str(clip)]["top"]
    assert [n for n, _ in top] == [names[i] for i in ref.topk(5).indices]
    np.testing.assert_allclose([p for _, p in top], ref.topk(5).values.numpy(), atol=1e-5)

    # a bidirectional checkpoint cannot stream: clear refusal
    save_weights_export(tmp_path / "bi.pt", _model(len(names)), class_names=names)
    rc = predict_cli.main([str(clip), "--checkpoint", str(tmp_path / "bi.pt"), "--online"])
    assert rc == 2 and "shift='online'" in capsys.readouterr().err
