"""Weights: official checkpoint import (built here with the official module layout), file-name
parsing, ImageNet initialisation, I3D inflation, and the errors of bad files."""
import warnings

import pytest
import torch
import torch.nn as nn
import torchvision

from tsm_ds.models import build_model, load_official_checkpoint, parse_official_name
from tsm_ds.models.weights import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the official module layout (temporal-shift-module: ops/temporal_shift.py, ops/models.py,
# ---- archs/mobilenet_v2.py), written out independently of tsm_ds ----

class OfficialTemporalShift(nn.Module):
    def __init__(self, net, n_segment, n_div=8):
        super().__init__()
        self.net, self.n_segment, self.fold_div = net, n_segment, n_div

    def forward(self, x):
        nt, c, h, w = x.size()
        x = x.view(nt // self.n_segment, self.n_segment, c, h, w)
        fold = c // self.fold_div
        out = torch.zeros_like(x)
        out[:, :-1, :fold] = x[:, 1:, :fold]
        out[:, 1:, fold: 2 * fold] = x[:, :-1, fold: 2 * fold]
        out[:, :, 2 * fold:] = x[:, :, 2 * fold:]
        return self.net(out.view(nt, c, h, w))


def _conv_bn(inp, oup, k, s):
    return nn.Sequential(nn.Conv2d(inp, oup, k, s, k // 2, bias=False), nn.BatchNorm2d(oup),
                         nn.ReLU6(inplace=True))


class OfficialInvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(inp * expand_ratio)
        self.use_res_connect = stride == 1 and inp == oup
        layers = [] if expand_ratio == 1 else [nn.Conv2d(inp, hidden, 1, 1, 0, bias=False),
                                               nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class OfficialMobileNetV2(nn.Module):
    def __init__(self, n_class=1000):
        super().__init__()
        features, cin = [_conv_bn(3, 32, 3, 2)], 32
        for t, c, n, s in [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                           [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]:
            for i in range(n):
                features.append(OfficialInvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Linear(1280, n_class)

    def forward(self, x):
        return self.classifier(self.features(x).mean(3).mean(2))


class OfficialTSN(nn.Module):
    """ops/models.py TSN with dropout > 0: base_model's classifier becomes Dropout, new_fc added."""

    def __init__(self, arch, num_class, num_segments, shift):
        super().__init__()
        self.num_segments = num_segments
        if arch == "mobilenetv2":
            self.base_model, last = OfficialMobileNetV2(), "classifier"
            if shift:
                for m in self.base_model.modules():
                    if isinstance(m, OfficialInvertedResidual) and len(m.conv) == 8 \
                            and m.use_res_connect:
                        m.conv[0] = OfficialTemporalShift(m.conv[0], num_segments)
        else:
            self.base_model, last = getattr(torchvision.models, arch)(), "fc"
            if shift:
                for stage in (self.base_model.layer1, self.base_model.layer2,
                              self.base_model.layer3, self.base_model.layer4):
                    for b in stage:
                        b.conv1 = OfficialTemporalShift(b.conv1, num_segments)
        dim = getattr(self.base_model, last).in_features
        setattr(self.base_model, last, nn.Dropout(0.5))
        self.new_fc = nn.Linear(dim, num_class)

    def forward(self, x):
        out = self.new_fc(self.base_model(x.view((-1, 3) + x.size()[-2:])))
        return out.view((-1, self.num_segments) + out.size()[1:]).mean(1)


def _realistic(model, x):
    """Random weights everywhere and BN statistics of real activations (momentum 1 pass)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = 1.0
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
        nn.init.normal_(model.new_fc.weight, 0, 0.1)
        nn.init.normal_(model.new_fc.bias, 0, 0.1)
        model.train()(x)
    return model.eval()


def _save_official(model, path):
    sd = {"module." + k: v for k, v in model.state_dict().items()}
    torch.save({"epoch": 50, "arch": "x", "state_dict": sd, "best_prec1": 71.2}, path)


@pytest.mark.parametrize("name,arch,shift,frames", [
    ("TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment8_e50.pth", "resnet18", True, 8),
    ("TSM_kinetics_RGB_mobilenetv2_shift8_blockres_avg_segment8_e100_dense.pth", "mobilenetv2",
     True, 8),
    ("TSM_kinetics_RGB_resnet18_avg_segment5_e50.pth", "resnet18", False, 5),
])
def test_official_checkpoint_reproduces_logits(tmp_path, name, arch, shift, frames):
    torch.manual_seed(0)
    x = torch.randn(2, frames, 3, 32, 32)
    ref = _realistic(OfficialTSN(arch, 400, frames, shift), x)
    assert "module.new_fc.weight" in {"module." + k for k in ref.state_dict()}
    if shift and arch == "resnet18":
        assert "base_model.layer1.0.conv1.net.weight" in ref.state_dict()
    path = tmp_path / name
    _save_official(ref, path)
    model = load_official_checkpoint(path)
    assert model.config["num_classes"] == 400 and model.config["num_segments"] == frames
    assert model.config["shift"] == ("bidirectional" if shift else None)
    with torch.no_grad():
        want, got = ref(x), model(x)
    assert want.std() > 1e-3     # the reference is not degenerate
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_official_name_variants():
    p = parse_official_name("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth")
    assert p["build"] == {"arch": "resnet50", "num_classes": 400, "num_segments": 8,
                          "shift": "bidirectional", "shift_div": 8, "shift_place": "blockres",
                          "temporal_pool": False}
    assert p["dense"] is False and p["epochs"] == 50
    p = parse_official_name("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e100_dense.pth")
    assert p["dense"] is True and p["epochs"] == 100
    p = parse_official_name("TSM_something_RGB_resnet50_shift8_blockres_avg_segment8_e45.pth")
    assert p["build"]["num_classes"] == 174 and p["dataset"] == "something"
    p = parse_official_name(
        "/x/TSM_kinetics_RGB_mobilenetv2_shift8_blockres_avg_segment8_e100_dense.pth")
    assert p["build"]["arch"] == "mobilenet_v2" and p["dense"]
    p = parse_official_name("TSM_kinetics_RGB_resnet50_avg_segment5_e50.pth")
    assert p["build"]["shift"] is None and p["build"]["num_segments"] == 5
    p = parse_official_name("TSM_kinetics_RGB_resnet50_shift4_block_tpool_avg_segment8_e50.pth")
    assert (p["build"]["shift_div"], p["build"]["shift_place"], p["build"]["temporal_pool"]) == \
        (4, "block", True)
    with pytest.raises(ValueError, match="non-local"):
        parse_official_name("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e100_dense_nl.pth")
    with pytest.raises(ValueError, match="Flow"):
        parse_official_name("TSM_something_Flow_resnet50_shift8_blockres_avg_segment8_e45.pth")
    with pytest.raises(ValueError, match="not an official TSM checkpoint name"):
        parse_official_name("my_model.pth")
    with pytest.raises(ValueError, match="not supported"):
        parse_official_name("TSM_kinetics_RGB_BNInception_shift8_blockres_avg_segment8_e50.pth")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        parse_official_name("TSM_kinetics_RGB_resnet50_avg_segment8_e50_cos.pth")
    assert any("cos" in str(x.message) for x in w)


def test_corrupt_checkpoint_error(tmp_path):
    path = tmp_path / "TSM_kinetics_RGB_resnet18_avg_segment8_e50.pth"
    path.write_bytes(b"\x80\x02 this is not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt") as e:
        load_official_checkpoint(path)
    assert str(path) in str(e.value)
    with pytest.raises(FileNotFoundError):
        load_official_checkpoint(tmp_path / "TSM_kinetics_RGB_resnet18_avg_segment8_e51.pth")


def test_pickled_objects_are_refused(tmp_path):
    path = tmp_path / "TSM_kinetics_RGB_resnet18_avg_segment8_e50.pth"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "obj": nn.ReLU()}, path)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_official_checkpoint(path)


def test_mismatched_checkpoint_lists_keys(tmp_path):
    ref = OfficialTSN("resnet18", 400, 8, True)
    sd = {"module." + k: v for k, v in ref.state_dict().items()}
    del sd["module.base_model.layer2.0.conv1.net.weight"]
    sd["module.base_model.extra.weight"] = torch.zeros(2)
    sd["module.new_fc.bias"] = torch.zeros(7)
    path = tmp_path / "TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment8_e50.pth"
    torch.save({"state_dict": sd}, path)
    with pytest.raises(CheckpointError) as e:
        load_official_checkpoint(path)
    msg = str(e.value)
    assert "base_model.layer2.0.conv1.weight" in msg          # missing (our name)
    assert "module.base_model.extra.weight" in msg            # unexpected
    assert "new_fc.bias: (7,) vs (400,)" in msg               # shape


def test_imagenet_init_from_local_file(tmp_path):
    torch.manual_seed(1)
    tv = torchvision.models.resnet18()
    path = tmp_path / "resnet18-imagenet.pth"
    torch.save(tv.state_dict(), path)
    m = build_model("resnet18", 3, num_segments=2, pretrained=str(path))
    torch.testing.assert_close(m.base_model.layer1[0].conv1.weight, tv.layer1[0].conv1.weight,
                               rtol=0, atol=0)
    torch.testing.assert_close(m.base_model.bn1.running_var, tv.bn1.running_var, rtol=0, atol=0)
    with pytest.raises(CheckpointError, match="missing"):
        build_model("resnet34", 3, num_segments=2, pretrained=str(path))


def test_i3d_inflation_from_resnet50(tmp_path):
    torch.manual_seed(2)
    tv = torchvision.models.resnet50()
    path = tmp_path / "resnet50-imagenet.pth"
    torch.save(tv.state_dict(), path)
    m = build_model("i3d_resnet50", 3, num_segments=8, shift=None, pretrained=str(path))
    w3, w2 = m.layer1[0].conv1.weight, tv.layer1[0].conv1.weight    # inflated 3x1x1
    assert w3.shape[2] == 3
    torch.testing.assert_close(w3.sum(2), w2)
    torch.testing.assert_close(w3[:, :, 0], w2 / 3)
    assert m.layer2[1].conv1.weight.shape[2] == 1   # pattern 1,0,1,0: not inflated
    torch.testing.assert_close(m.layer2[1].conv1.weight[:, :, 0], tv.layer2[1].conv1.weight)
    torch.testing.assert_close(m.conv1.weight.sum(2), tv.conv1.weight)  # 5x7x7 stem
