"""tsm-ds export: torch.export (.pt2) and ONNX files reproduce the PyTorch model (small ResNet-18 TSM)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tsm_ds.cli import export as export_cli
from tsm_ds.inference import export as ex
from tsm_ds.models import build_model

T, SIZE, K = 4, 64, 5


def _model(shift: str) -> torch.nn.Module:
    torch.manual_seed(0)
    m = build_model("resnet18", K, num_segments=T, shift=shift, dropout=0.0).eval()
    # non-trivial BN statistics, so that a wrongly folded BatchNorm would show
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m


def _save_checkpoint(tmp_path, model, names):
    path = tmp_path / "model.pt"
    torch.save({"state_dict": model.state_dict(), "model_config": model.config, "class_names": names}, path)
    return path


def test_export_clip_model_cli_pt2_and_onnx(tmp_path, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    model = _model("bidirectional")
    names = [f"c{i}" for i in range(K)]
    ck = _save_checkpoint(tmp_path, model, names)
    out = tmp_path / "exp"
    rc = export_cli.main(["--checkpoint", str(ck), "--out", str(out), "--img-size", str(SIZE)])
    assert rc == 0, capsys.readouterr()
    report = json.loads((out / "export.json").read_text())
    assert report["inputs"] == {"clip": [2, T, 3, SIZE, SIZE]} and report["outputs"] == {"logits": [2, K]}
    assert report["meta"]["class_names"] == names
    # the checked batch (3) differs from the example's (2): the batch dimension really is dynamic
    assert report["check_batch_size"] == 3
    assert report["check"]["pt2"]["ok"] and report["check"]["pt2"]["max_abs_diff"] <= 1e-4

    # independently of the command's own check: run both files on a new input, batch 5
    x = torch.randn(5, T, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = model(x)
        got_pt2 = torch.export.load(out / "model.pt2").module()(x)
    torch.testing.assert_close(got_pt2, ref, atol=1e-4, rtol=1e-4)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["clip"]
    got_onnx = sess.run(["logits"], {"clip": x.numpy()})[0]
    np.testing.assert_allclose(got_onnx, ref.numpy(), atol=1e-4, rtol=1e-4)
    assert report["check"]["onnx"]["ok"]
    import onnx
    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert json.loads(meta["class_names"]) == names
    printed = capsys.readouterr().out
    assert "pt2:" in printed and "onnx:" in printed and "OK" in printed and "MISMATCH" not in printed


def test_export_online_step_with_explicit_caches(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    model = _model("online")
    report = ex.export_model(model, tmp_path, num_segments=T, img_size=SIZE, online=True)
    n_cache = len(model.shift_modules())
    assert n_cache > 0
    assert list(report["inputs"]) == ["frame"] + [f"cache_in_{i}" for i in range(n_cache)]
    assert list(report["outputs"]) == ["logits"] + [f"cache_out_{i}" for i in range(n_cache)]
    # cache i holds the first C_in // 8 channels of shift module i's input
    for i, mod in enumerate(model.shift_modules()):
        assert report["inputs"][f"cache_in_{i}"][1] == mod.in_channels // 8
        assert report["outputs"][f"cache_out_{i}"] == report["inputs"][f"cache_in_{i}"]
    assert report["ok"], report["check"]

    # stream 5 frames through the exported step, feeding the caches back: per-frame logits and
    # caches must equal the PyTorch model's step.
    gen = torch.Generator().manual_seed(3)
    clip = torch.randn(2, 5, 3, SIZE, SIZE, generator=gen)
    step_pt2 = torch.export.load(tmp_path / "model.pt2").module()
    caches, _ = ex.initial_caches(model, clip[:, 0])
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]
    ref_cache, pt2_caches, onnx_caches = None, caches, [c.numpy() for c in caches]
    with torch.no_grad():
        for t in range(5):
            ref_logits, ref_cache = model.step(clip[:, t], ref_cache)
            out = step_pt2(clip[:, t], *pt2_caches)
            logits, pt2_caches = out[0], list(out[1:])
            torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
            res = sess.run(None, dict(zip(in_names, [clip[:, t].numpy(), *onnx_caches])))
            np.testing.assert_allclose(res[0], ref_logits.numpy(), atol=1e-4, rtol=1e-4)
            onnx_caches = res[1:]
            for a, b in zip(onnx_caches, ref_cache):
                np.testing.assert_allclose(a, b.numpy(), atol=1e-4, rtol=1e-4)


def test_export_refuses_online_for_bidirectional_and_unknown_format(tmp_path):
    with pytest.raises(RuntimeError, match="online"):
        ex.export_model(_model("bidirectional"), tmp_path, num_segments=T, img_size=SIZE, online=True,
                        formats=["pt2"])
    with pytest.raises(ValueError, match="formats"):
        ex.export_model(_model("bidirectional"), tmp_path, num_segments=T, img_size=SIZE, formats=["torchscript"])


def test_compare_tolerance_scales_with_each_output():
    ref = (torch.tensor([100.0, 0.0]), torch.tensor([1.0, -2.0]))
    # output 0: |diff| 5e-4 <= 1e-4 + 1e-5 * 100 = 1.1e-3 (although 5e-4 > atol at the zero element)
    ok = ex.compare(ref, (np.array([100.0, 5e-4]), np.array([1.0, -2.0])), atol=1e-4, rtol=1e-5)
    assert ok["ok"] and ok["max_abs_diff"] == pytest.approx(5e-4) and ok["max_rel_diff"] == pytest.approx(5e-6)
    # output 1: |diff| 1e-3 > 1e-4 + 1e-5 * 2
    bad = ex.compare(ref, (np.array([100.0, 0.0]), np.array([1.0, -2.001])), atol=1e-4, rtol=1e-5)
    assert not bad["ok"] and bad["max_abs_diff"] == pytest.approx(1e-3, rel=1e-4)
    with pytest.raises(ValueError, match="outputs"):
        ex.compare(ref, (np.zeros(2),), atol=1e-4, rtol=1e-5)
