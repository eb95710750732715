"""Official files that used to be refused: the online demo's MobileNetV2 checkpoint, names with any
suffix, renamed files read with the TSN options given as flags, and mismatch messages that name
the real cause. Fake official files are made in tmp_path (random weights)."""
import re
import warnings

import pytest
import torch
import torch.nn as nn

from tsm_ds.cli._common import model_overrides
from tsm_ds.config import Config, parse
from tsm_ds.config.commands import EVAL
from tsm_ds.engine.checkpoint.reader import read_checkpoint
from tsm_ds.inference.loading import checkpoint_overrides, load_for_inference
from tsm_ds.models import build_model, load_official_checkpoint, parse_official_name
from tsm_ds.models.official import official_key
from tsm_ds.models.weights import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- online_demo/mobilenet_v2_tsm.py, written out independently of tsm_ds (key names, shapes,
# ---- shift: the first c // 8 channels come from the previous frame's buffer) ----

def _cbr(inp, oup, k, s):
    return nn.Sequential(nn.Conv2d(inp, oup, k, s, k // 2, bias=False), nn.BatchNorm2d(oup),
                         nn.ReLU6(inplace=True))


class DemoBlock(nn.Module):
    def __init__(self, inp, oup, stride, t, shift):
        super().__init__()
        hid = inp * t
        self.res, self.shift = stride == 1 and inp == oup, shift
        layers = [] if t == 1 else [nn.Conv2d(inp, hid, 1, 1, 0, bias=False), nn.BatchNorm2d(hid),
                                    nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid),
                   nn.ReLU6(inplace=True), nn.Conv2d(hid, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x, buf=None):
        if not self.shift:
            return (x + self.conv(x) if self.res else self.conv(x)), None
        c = x.size(1)
        x1, x2 = x[:, :c // 8], x[:, c // 8:]
        buf = torch.zeros_like(x1) if buf is None else buf     # the demo starts from zero buffers
        return x + self.conv(torch.cat((buf, x2), dim=1)), x1


class DemoMobileNetV2(nn.Module):
    SHIFT_IDX = [2, 4, 5, 7, 8, 9, 11, 12, 14, 15]      # online demo: global_idx of shifted blocks

    def __init__(self, n_class=27):
        super().__init__()
        feats, cin, idx = [_cbr(3, 32, 3, 2)], 32, 0
        for t, c, n, s in [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                           [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]:
            for i in range(n):
                feats.append(DemoBlock(cin, c, s if i == 0 else 1, t, idx in self.SHIFT_IDX))
                cin, idx = c, idx + 1
        feats.append(_cbr(cin, 1280, 1, 1))
        self.features = nn.ModuleList(feats)
        self.classifier = nn.Linear(1280, n_class)

    def forward(self, x, bufs):
        out, bi = [], 0
        for f in self.features:
            if isinstance(f, DemoBlock):
                x, s = f(x, bufs[bi] if bufs and f.shift else None)
                if f.shift:
                    out.append(s)
                    bi += 1
            else:
                x = f(x)
        return self.classifier(x.mean(3).mean(2)), out


def _random_demo(seed=0):
    torch.manual_seed(seed)
    net = DemoMobileNetV2()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.8, 1.2)
                m.bias.uniform_(-0.1, 0.1)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
        nn.init.normal_(net.classifier.weight, 0, 0.1)
        nn.init.normal_(net.classifier.bias, 0, 0.1)
    return net.eval()


def test_online_demo_checkpoint_loads_and_streams_like_the_demo(tmp_path):
    demo = _random_demo()
    sd = demo.state_dict()
    assert "features.3.conv.0.weight" in sd and sd["features.3.conv.0.weight"].shape == (144, 24, 1, 1)
    assert "classifier.weight" in sd and not any(".net." in k for k in sd)
    path = tmp_path / "mobilenetv2_jester_online.pth.tar"
    torch.save(sd, path)

    model = load_official_checkpoint(path)
    assert (model.config["arch"], model.config["num_classes"], model.config["shift"]) == \
        ("mobilenet_v2", 27, "online")
    regular = build_model("mobilenet_v2", 27, shift="online", num_segments=4).eval()
    regular.load_state_dict(model.state_dict())

    torch.manual_seed(1)
    frames = torch.randn(4, 1, 3, 32, 32)
    cache, bufs = None, None
    with torch.no_grad():
        clip = regular.frame_logits(frames.transpose(0, 1))[0]        # (T, 27)
        for t in range(4):
            want, bufs = demo(frames[t], bufs)
            got, cache = model.step(frames[t], cache)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(clip[t:t + 1], want, rtol=1e-3, atol=1e-4)   # batched convs
    assert want.std() > 1e-2      # not degenerate
    contents = read_checkpoint(path)
    assert contents.source == "official" and contents.model_config["shift"] == "online"
    torch.testing.assert_close(contents.state_dict["new_fc.weight"], sd["classifier.weight"], rtol=0, atol=0)


def test_renamed_online_demo_file_needs_only_the_arch(tmp_path):
    path = tmp_path / "jester.pth"
    torch.save(_random_demo(2).state_dict(), path)
    loaded = load_for_inference(path, arch="mobilenet_v2", shift="online")
    assert loaded.source == "official" and loaded.config["num_classes"] == 27
    assert loaded.config["shift"] == "online"


@pytest.mark.parametrize("name,unused", [
    ("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50_lr0.01.pth", ["lr0.01"]),
    ("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50-v2.pth", ["v2"]),
    ("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth.tar", []),
    ("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50_dense.pth", []),
    ("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50_dense10_cos_lr0.02-v3.pt",
     ["cos", "lr0.02", "v3"]),
    ("TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8.pth", []),
])
def test_names_with_any_suffix_parse(name, unused):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = parse_official_name(name)
    assert p["build"] == {"arch": "resnet50", "num_classes": 400, "num_segments": 8,
                          "shift": "bidirectional", "shift_div": 8, "shift_place": "blockres",
                          "temporal_pool": False}
    assert p["dense"] is ("dense" in name)
    msgs = [str(x.message) for x in w]
    if unused:
        assert msgs == [f"{name}: name parts {unused} are not model options and were not used "
                        "(e.g. a learning-rate schedule or a suffix)"]
    else:
        assert msgs == []


def test_main_py_ckpt_names_read_their_directory(tmp_path):
    d = tmp_path / "TSM_something_RGB_resnet18_shift4_block_tpool_avg_segment4_e45"
    p = parse_official_name(d / "ckpt.best.pth.tar")
    assert p["build"] == {"arch": "resnet18", "num_classes": 174, "num_segments": 4, "shift": "bidirectional",
                          "shift_div": 4, "shift_place": "block", "temporal_pool": True}
    with pytest.raises(ValueError, match=re.escape("'ckpt.best.pth.tar' is not an official TSM checkpoint name")):
        parse_official_name(tmp_path / "run" / "ckpt.best.pth.tar")
    assert parse_official_name("mobilenetv2_jester_online.pth.tar")["build"]["shift"] == "online"


# ---- files whose name says nothing: the TSN options as flags / overrides ----

def _official_file(model, path, wrapped=True):
    sd = {official_key(k, model): v for k, v in model.state_dict().items()}
    torch.save({"epoch": 3, "arch": model.config["arch"], "state_dict": sd, "best_prec1": 50.0} if wrapped
               else sd, path)


def _randomised(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        nn.init.normal_(model.new_fc.weight, 0, 0.5)
    return model.eval()


def test_renamed_file_with_tsn_flags(tmp_path):
    ref = _randomised(build_model("resnet18", 10, num_segments=4, shift_div=4, shift_place="block",
                                  temporal_pool=True), 3)
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / "ckpt.best.pth.tar"
    _official_file(ref, path)
    with pytest.raises(ValueError, match=re.escape("'ckpt.best.pth.tar' is not an official TSM checkpoint name")):
        read_checkpoint(path)
    # the checkpoint commands' model options (generated from the configuration tree)
    argv = ["--checkpoint", str(path), "--out", "unused", "--arch", "resnet18", "--num-segments", "4", "--shift",
            "bidirectional", "--shift-div", "4", "--shift-place", "block", "--temporal-pool", "--dropout", "0.3"]
    over = model_overrides(parse(EVAL, Config, argv)[0])
    assert over == {"arch": "resnet18", "num_segments": 4, "shift": "bidirectional", "shift_div": 4,
                    "shift_place": "block", "temporal_pool": True, "dropout": 0.3}
    contents = read_checkpoint(path, official_overrides=over)
    assert contents.source == "official" and contents.model_config["num_classes"] == 10   # from the head
    loaded = load_for_inference(path, **over)
    x = torch.randn(1, 4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), ref(x), rtol=0, atol=0)
    argv = ["--checkpoint", "c", "--out", "o", "--shift", "none", "--no-temporal-pool"]
    assert model_overrides(parse(EVAL, Config, argv)[0]) == {"shift": None, "temporal_pool": False}
    assert checkpoint_overrides({"shift": "none", "num_classes": 174, "arch": None}) == {"shift": None,
                                                                                          "num_classes": 174}


# ---- mismatch messages name the cause ----

def _expect_cause(path, cause, **overrides):
    with pytest.raises(CheckpointError) as e:
        load_official_checkpoint(path, **overrides)
    lines = str(e.value).splitlines()
    assert lines[0] == f"checkpoint {path} does not fit the model:"
    assert lines[1] == f"  cause: {cause}"


def test_mismatch_messages_name_the_cause(tmp_path):
    tsm = tmp_path / "TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment8_e50.pth"
    _official_file(build_model("resnet18", 400), tsm)
    _expect_cause(tsm, "the checkpoint has a temporal shift (8 ...net.weight keys, shift_place='blockres', e.g. "
                       "layer1.0) but the model has none (a TSN): build it with shift='bidirectional' or 'online' "
                       "(--shift), shift_place='blockres'", shift=None)
    _expect_cause(tsm, "the shift placement differs: the checkpoint shifts at shift_place='blockres', the model at "
                       "'block' (--shift-place blockres)", shift_place="block")
    _expect_cause(tsm, "the head sizes differ: the checkpoint has 400 classes, the model 174 (num_classes=400, "
                       "--num-classes 400; --tune-from replaces the head)", num_classes=174)
    tsn = tmp_path / "TSM_kinetics_RGB_resnet18_avg_segment8_e50.pth"
    _official_file(build_model("resnet18", 400, shift=None), tsn)
    _expect_cause(tsn, "the model has a temporal shift (shift_place='blockres') but the checkpoint has none (no "
                       "...net.weight keys: a TSN): build it with shift=None (--shift none)", shift="bidirectional")
    every2 = tmp_path / "TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment8_e51.pth"
    sd = torch.load(tsm, weights_only=True)["state_dict"]
    sd = {re.sub(r"(layer\d\.1\.conv1)\.net\.", r"\1.", k): v for k, v in sd.items()}
    torch.save({"state_dict": sd}, every2)
    _expect_cause(every2, "the shifted blocks differ: the checkpoint shifts every 2nd block (official n_round=2, "
                          "the rule for ResNets with >= 23 blocks in layer3), the model every block (official "
                          "n_round=1) (first difference: layer1.1)")
    tpool = tmp_path / "TSM_kinetics_RGB_resnet18_shift8_block_tpool_avg_segment8_e50.pth"
    _official_file(build_model("resnet18", 400, shift_place="block", temporal_pool=True), tpool)
    _expect_cause(tpool, "the checkpoint has temporal pooling (layer2.net.* keys) but the model has none "
                         "(temporal_pool=True, --temporal-pool)", temporal_pool=False)
    _expect_cause(tsm, "the backbones differ: blocks per stage {'layer1': 2, 'layer2': 2, 'layer3': 2, 'layer4': 2} "
                       "in the checkpoint, {'layer1': 3, 'layer2': 4, 'layer3': 6, 'layer4': 3} in the model: "
                       "another arch (arch=, --arch)", arch="resnet34")


def test_tune_from_a_renamed_official_file_uses_the_run_options(tmp_path):
    """``--tune-from ckpt.best.pth.tar`` (a name that says nothing): read with the model options of
    the run; a file whose name says what it is is read as it says (no options needed)."""
    from tsm_ds.engine.checkpoint.manager import load_finetune_weights

    ref = _randomised(build_model("resnet18", 10, num_segments=4), 5)
    _official_file(ref, tmp_path / "ckpt.best.pth.tar")
    target = build_model("resnet18", 10, num_segments=4)
    with pytest.raises(ValueError, match="is not an official TSM checkpoint name"):
        load_finetune_weights(target, tmp_path / "ckpt.best.pth.tar")
    rep = load_finetune_weights(target, tmp_path / "ckpt.best.pth.tar", official_overrides={
        "arch": "resnet18", "num_segments": 4, "shift": "bidirectional", "shift_div": 8,
        "shift_place": "blockres", "temporal_pool": False, "dropout": 0.5})
    assert rep["source"] == "official TSM checkpoint" and rep["skipped"] == []
    for k, v in ref.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k
    named = tmp_path / "TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment4_e1.pth"
    ref400 = _randomised(build_model("resnet18", 400, num_segments=4), 6)
    _official_file(ref400, named)
    tuned = build_model("resnet18", 7, num_segments=4)
    rep = load_finetune_weights(tuned, named, official_overrides={"arch": "resnet18", "shift": None})
    assert rep["skipped"] == ["new_fc.weight", "new_fc.bias"]          # the head: 400 -> 7 classes
    assert torch.equal(tuned.state_dict()["base_model.layer1.0.conv1.weight"],
                       ref400.state_dict()["base_model.layer1.0.conv1.weight"])   # read as its name says
