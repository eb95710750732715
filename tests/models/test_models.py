"""Recognizers: shapes, shift placement, streaming online TSM, parameter groups, complexity."""
import pytest
import torch
import torch.nn as nn

from tsm_ds.models import ShiftConv2d, TemporalPool, TemporalShift, build_model, complexity, parameter_groups

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("arch", ["resnet18", "resnet34", "resnet50", "resnet101", "mobilenet_v2",
                                  "i3d_resnet50", "i3d_resnet50_release"])
def test_output_shape_every_arch(arch):
    shift = None if arch.startswith("i3d") else "bidirectional"
    model = build_model(arch, 5, num_segments=4, shift=shift).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 4, 3, 32, 32))
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    assert build_model(**model.config).config == model.config


def _count(model, cls):
    return sum(isinstance(m, cls) for m in model.modules())


def test_shift_placement_rules():
    # blockres: conv1 of every block; ResNet-101 (layer3 has 23 blocks): every second block
    assert _count(build_model("resnet50", 3), ShiftConv2d) == 3 + 4 + 6 + 3
    assert _count(build_model("resnet101", 3), ShiftConv2d) == 2 + 2 + 12 + 2
    m = build_model("resnet18", 3, shift_place="block")
    assert _count(m, TemporalShift) == 8 and _count(m, ShiftConv2d) == 0
    # MobileNetV2: blocks with a residual connection and an expansion conv (official rule): 10
    mb = build_model("mobilenet_v2", 3)
    shifted = [i for i, f in enumerate(mb.base_model.features)
               if any(isinstance(x, ShiftConv2d) for x in f.modules())]
    assert shifted == [3, 5, 6, 8, 9, 10, 12, 13, 15, 16]
    assert _count(build_model("resnet50", 3, shift=None), ShiftConv2d) == 0


def test_temporal_pool_halves_time_in_later_stages():
    m = build_model("resnet18", 3, num_segments=4, temporal_pool=True).eval()
    assert isinstance(m.base_model.layer2, TemporalPool)
    assert m.base_model.layer1[0].conv1.num_segments == 4
    assert m.base_model.layer2.net[0].conv1.num_segments == 2
    assert m.frame_logits(torch.randn(1, 4, 3, 32, 32)).shape == (1, 2, 3)


def test_clip_is_average_of_frame_logits_and_frames_are_mixed():
    m = build_model("resnet18", 4, num_segments=4, dropout=0.0).eval()
    nn.init.normal_(m.new_fc.weight, 0, 0.1)
    x = torch.randn(2, 4, 3, 32, 32)
    with torch.no_grad():
        frames = m.frame_logits(x)
        torch.testing.assert_close(m(x), frames.mean(1))
        # TSM: changing frame 3 changes frame 2's logits (it reads t+1); TSN: it does not
        y = x.clone()
        y[:, 3] += 1.0
        assert not torch.allclose(m.frame_logits(y)[:, 2], frames[:, 2])
        tsn = build_model("resnet18", 4, num_segments=4, shift=None).eval()
        torch.testing.assert_close(tsn.frame_logits(y)[:, 2], tsn.frame_logits(x)[:, 2])


def test_bad_clip_shapes_are_refused():
    # any T runs (tests/models/test_any_t.py); what cannot run is refused by name
    with pytest.raises(ValueError, match="even number of frames per clip, got T=3"):
        build_model("resnet18", 3, num_segments=4, temporal_pool=True)(torch.randn(1, 3, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\(N, T, 3, H, W\)"):
        build_model("resnet18", 3, num_segments=4)(torch.randn(4, 3, 32, 32))
    with pytest.raises(ValueError, match="unknown arch"):
        build_model("vgg16", 3)


def test_gradients_reach_the_stem_through_shifts():
    m = build_model("resnet18", 3, num_segments=4)
    m(torch.randn(1, 4, 3, 32, 32)).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v2"])
def test_online_streaming_equals_clip_forward(arch):
    m = build_model(arch, 6, num_segments=5, shift="online").eval()
    x = torch.randn(2, 5, 3, 32, 32)
    with torch.no_grad():   # BN statistics of real activations (random init collapses otherwise)
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.momentum = 1.0
        m.train()(x)
        m.eval()
        nn.init.normal_(m.new_fc.weight, 0, 0.1)
        clip = m.frame_logits(x)
        cache = None
        for t in range(5):
            logits, cache = m.step(x[:, t], cache)
            torch.testing.assert_close(logits, clip[:, t], rtol=1e-4, atol=1e-5)
        assert len(cache) == len(m.shift_modules())
        # the past matters: a different first frame changes the last frame's logits
        y = x.clone()
        y[:, 0] = 0
        assert not torch.allclose(m.frame_logits(y)[:, 4], clip[:, 4])


def test_online_model_trains_on_clips_and_step_needs_online():
    m = build_model("resnet18", 3, num_segments=4, shift="online")
    m(torch.randn(1, 4, 3, 32, 32)).sum().backward()
    assert m.base_model.layer1[0].conv1.weight.grad is not None
    with pytest.raises(RuntimeError, match="shift='online'"):
        build_model("resnet18", 3, num_segments=4).step(torch.randn(1, 3, 32, 32))


def test_parameter_groups_official_recipe():
    m = build_model("resnet18", 7)
    groups = {g["name"]: g for g in parameter_groups(m, weight_decay=1e-4)}
    assert set(groups) == {"weight", "bn", "fc_weight", "fc_bias"}    # resnet convs have no bias
    assert groups["fc_weight"]["params"] == [m.new_fc.weight] and groups["fc_weight"]["lr_mult"] == 5
    assert groups["fc_bias"]["params"] == [m.new_fc.bias] and groups["fc_bias"]["lr_mult"] == 10
    assert groups["fc_bias"]["weight_decay"] == 0 and groups["bn"]["weight_decay"] == 0
    assert groups["weight"]["weight_decay"] == 1e-4
    bn_params = [p for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)
                 for p in mod.parameters()]
    assert {id(p) for p in groups["bn"]["params"]} == {id(p) for p in bn_params}
    n = sum(p.numel() for g in groups.values() for p in g["params"])
    assert n == sum(p.numel() for p in m.parameters())


def test_partial_bn_freezes_all_but_first():
    m = build_model("resnet18", 3, num_segments=2, partial_bn=True)
    bns = [mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)]
    assert bns[0].training and bns[0].weight.requires_grad
    assert all(not b.training and not b.weight.requires_grad for b in bns[1:])
    groups = {g["name"]: g for g in parameter_groups(m)}
    assert len(groups["bn"]["params"]) == 2


def test_complexity_table_i3d_rows():
    from tsm_ds.models.complexity import TABLE_MODELS

    i3d = [(label, kw["arch"], t) for label, kw, t in TABLE_MODELS if kw["arch"].startswith("i3d")]
    assert i3d == [("I3D-ResNet50 (non-local paper / mmaction2) 32f", "i3d_resnet50", 32),
                   ("I3D-ResNet50 (released non-local code) 32f", "i3d_resnet50_release", 32)]


def test_complexity_tsm_resnet50_paper_numbers():
    with torch.device("meta"):
        m = build_model("resnet50", 400)
    c = complexity(m, num_segments=8, img_size=224)
    assert round(c["params"] / 1e6, 1) == 24.3          # TSM paper, Table 1
    assert 32.5e9 < c["macs"] < 33.5e9                   # "33G" multiply-adds per 8x224x224 clip
    assert c["flops"] == 2 * c["macs"]
