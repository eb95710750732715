"""Weights saved from a ``torch.compile``d model (``_orig_mod.`` in the keys) load in every reader:
``tsm-ds predict`` / ``export`` (``load_from_args``), ``eval`` and ``--tune-from`` (one reader); a
wrapper prefix the reader does not strip is named as the cause of the mismatch."""
from __future__ import annotations

import pytest
import torch

from tsm_ds.cli import predict as predict_cli
from tsm_ds.data.testvideo import write_numbered_video
from tsm_ds.engine.checkpoint.manager import load_finetune_weights, plain_state_dict, save_weights_export
from tsm_ds.inference.loading import load_for_inference
from tsm_ds.models import build_model
from tsm_ds.models.weights import CheckpointError

T, SIZE, NAMES = 2, 32, ["a", "b", "c"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("orig_mod")
    torch.manual_seed(0)
    model = build_model("resnet18", len(NAMES), num_segments=T, dropout=0.0).eval()
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    save_weights_export(root / "best_model.pt", model, class_names=NAMES, extra={"img_size": SIZE})
    payload = torch.load(root / "best_model.pt", weights_only=True)

    def variant(name, rename):
        torch.save({**payload, "state_dict": {rename(k): v for k, v in ref.items()}}, root / name)

    variant("compiled.pt", lambda k: "_orig_mod." + k)                                  # torch.compile(model)
    variant("compiled_backbone.pt", lambda k: k.replace("base_model.", "base_model._orig_mod."))   # a submodule
    variant("lightning.pt", lambda k: "model." + k)                                     # a wrapper we do not strip
    return root, model, ref


@pytest.mark.parametrize("name", ["compiled.pt", "compiled_backbone.pt"])
def test_every_reader_accepts_orig_mod_keys(saved, name):
    root, model, ref = saved
    loaded = load_for_inference(root / name)                     # eval, and predict / export below
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in ref.items())
    fresh = build_model("resnet18", len(NAMES), num_segments=T, dropout=0.0)
    rep = load_finetune_weights(fresh, root / name)               # --tune-from
    assert rep["loaded"] == len(ref) and torch.equal(fresh.new_fc.weight, ref["new_fc.weight"])
    wrapper = torch.nn.Module()            # what torch.compile's wrapper looks like to state_dict (no dynamo import)
    wrapper._orig_mod = model
    assert list(wrapper.state_dict())[0].startswith("_orig_mod.")
    assert list(plain_state_dict(wrapper)) == list(ref)               # exports carry clean keys


def test_predict_cli_reads_a_compiled_checkpoint_and_names_a_wrapper_prefix(saved, tmp_path, capsys):
    root, _, _ = saved
    clip = tmp_path / "clip.mp4"
    write_numbered_video(clip, 12)
    assert predict_cli.main([str(clip), "--checkpoint", str(root / "compiled_backbone.pt"), "--top-k", "2"]) == 0
    assert any(n in capsys.readouterr().out for n in NAMES)
    assert predict_cli.main([str(clip), "--checkpoint", str(root / "lightning.pt")]) == 2
    err = capsys.readouterr().err
    assert "cause: the file's keys start with an extra 'model.'" in err and "a wrapper module's name" in err
    with pytest.raises(CheckpointError, match="extra 'model.'"):
        load_for_inference(root / "lightning.pt")
    with pytest.raises(RuntimeError, match="cause: the file's keys start with an extra 'model.'"):
        load_finetune_weights(build_model("resnet18", len(NAMES), num_segments=T), root / "lightning.pt")
