"""I3D-ResNet-50 in the two reference layouts (issue 18): cost, temporal sizes per stage, configs,
and the refusal of checkpoints of the old (own) layout."""
import pytest
import torch
import torch.nn as nn

from tsm_ds.models import build_model, complexity
from tsm_ds.models.i3d import ARCH_LAYOUTS, LAYOUTS
from tsm_ds.models.registry import check_checkpoint_config

pytestmark = pytest.mark.usefixtures("one_thread")

STAGES = ("conv1", "maxpool", "layer1", "pool2", "layer2", "layer3", "layer4")


def _stage_shapes(model: nn.Module, x: torch.Tensor) -> dict[str, tuple[int, int]]:
    """(T, H) of each stage's output for clip ``x`` (N, T, 3, H, W)."""
    out: dict[str, tuple[int, int]] = {}
    hooks = [getattr(model, name).register_forward_hook(
        lambda _m, _i, y, name=name: out.__setitem__(name, (y.shape[2], y.shape[3])))
        for name in STAGES]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return out


@pytest.mark.parametrize("arch, gmacs", [("i3d_resnet50", 33.1), ("i3d_resnet50_release", 113.6)])
def test_macs_and_params_of_the_reference_layouts(arch, gmacs):
    with torch.device("meta"):
        m = build_model(arch, 400, num_segments=32, shift=None)
    c = complexity(m, num_segments=32, img_size=224)
    assert round(c["macs"] / 1e9, 1) == gmacs
    assert c["params"] == 28_043_472                    # 28.04 M in every layout
    assert c["flops"] == 2 * c["macs"]


@pytest.mark.parametrize("arch, temporal", [
    # mmaction2 i3d_r50 (conv1_stride_t=2, pool1_stride_t=2, with_pool2): 32 -> 16 -> 8 -> 4
    ("i3d_resnet50", (16, 8, 8, 4, 4, 4, 4)),
    # released video-nonlocal-net (no temporal stride in conv1 / pool1, pool2): 32 -> 16
    ("i3d_resnet50_release", (32, 32, 32, 16, 16, 16, 16)),
])
def test_temporal_and_spatial_sizes_per_stage(arch, temporal):
    with torch.device("meta"):
        m = build_model(arch, 400, num_segments=32, shift=None)
        shapes = _stage_shapes(m, torch.empty(1, 32, 3, 224, 224))
    assert tuple(shapes[s][0] for s in STAGES) == temporal
    assert tuple(shapes[s][1] for s in STAGES) == (112, 56, 56, 56, 28, 14, 7)


@pytest.mark.parametrize("arch", ["i3d_resnet50", "i3d_resnet50_release"])
def test_short_and_odd_clips_run_on_real_tensors(arch):
    torch.manual_seed(0)
    m = build_model(arch, 3, num_segments=3, shift=None).eval()
    shapes = _stage_shapes(m, torch.randn(2, 3, 3, 32, 32))
    # pool2 rounds up: an odd or unit T is kept, not dropped to zero
    expected = {"i3d_resnet50": (2, 1, 1, 1, 1, 1, 1), "i3d_resnet50_release": (3, 3, 3, 2, 2, 2, 2)}
    assert tuple(shapes[s][0] for s in STAGES) == expected[arch]
    with torch.no_grad():
        out = m(torch.randn(2, 3, 3, 32, 32))
    assert out.shape == (2, 3) and torch.isfinite(out).all()


def test_layouts_share_parameters_but_not_outputs():
    torch.manual_seed(0)
    a = build_model("i3d_resnet50", 4, num_segments=8, dropout=0.0, shift=None).eval()
    b = build_model("i3d_resnet50_release", 4, num_segments=8, dropout=0.0, shift=None).eval()
    b.load_state_dict(a.state_dict())                   # same names and shapes
    nn.init.normal_(a.new_fc.weight, 0, 0.1)
    b.new_fc.load_state_dict(a.new_fc.state_dict())
    x = torch.randn(1, 8, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(a(x), b(x))


def test_config_records_layout_and_round_trips():
    for arch, layout in ARCH_LAYOUTS.items():
        m = build_model(arch, 5, num_segments=32, shift=None)
        assert m.config["arch"] == arch and m.config["i3d_layout"] == layout == m.layout
        assert build_model(**m.config).config == m.config
        check_checkpoint_config(m.config)               # a current config passes
    assert set(ARCH_LAYOUTS.values()) == set(LAYOUTS)
    with pytest.raises(ValueError, match="does not fit arch"):
        build_model("i3d_resnet50", 5, shift=None, i3d_layout="nonlocal_release")
    with pytest.raises(ValueError, match="does not fit arch"):
        build_model("resnet50", 5, i3d_layout="mmaction2")


def test_old_layout_checkpoint_config_is_refused():
    old = build_model("i3d_resnet50", 5, shift=None).config
    del old["i3d_layout"]
    with pytest.raises(ValueError, match="old tsm_ds I3D layout.*i3d_resnet50_release"):
        check_checkpoint_config(old)
    with pytest.raises(ValueError, match="is layout 'nonlocal_release'"):
        check_checkpoint_config({"arch": "i3d_resnet50_release", "i3d_layout": "mmaction2"})
    check_checkpoint_config(build_model("resnet50", 5).config)   # 2D archs have no layout key


def test_load_for_inference_refuses_old_i3d_and_loads_new(tmp_path):
    from tsm_ds.engine.checkpoint.manager import save_weights_export
    from tsm_ds.inference.loading import load_for_inference

    torch.manual_seed(0)
    m = build_model("i3d_resnet50_release", 3, num_segments=8, shift=None)
    save_weights_export(tmp_path / "new.pt", m, class_names=["a", "b", "c"])
    loaded = load_for_inference(tmp_path / "new.pt")
    assert loaded.config["i3d_layout"] == "nonlocal_release" and loaded.model.layout == "nonlocal_release"
    torch.testing.assert_close(loaded.model.layer4[2].conv3.weight, m.layer4[2].conv3.weight)
    # a pre-issue-18 export: same weight shapes (they would load silently), no layout key
    obj = torch.load(tmp_path / "new.pt", weights_only=True)
    obj["model_config"] = {**obj["model_config"], "arch": "i3d_resnet50"}
    del obj["model_config"]["i3d_layout"]
    torch.save(obj, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="no 'i3d_layout'"):
        load_for_inference(tmp_path / "old.pt")
