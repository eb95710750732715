"""Temporal shift: exact values against the definition, the fused path against the reference."""
import pytest
import torch

import tsm_ds.models.shift as shift_mod
from tsm_ds.models import temporal_pool, temporal_shift, temporal_shift_official, use_fused_shift
from tsm_ds.models.shift import ShiftConv2d, _moves, _ShiftConv2dFn

pytestmark = pytest.mark.usefixtures("one_thread")


def _clip(n=2, t=4, c=8, h=2, w=3, dtype=torch.float32):
    """x[n*T + t, c, h, w] = 1000*n + 100*t + c + 1 (distinct, nonzero, readable)."""
    v = torch.zeros(n, t, c, h, w, dtype=dtype)
    for i in range(n):
        for j in range(t):
            for k in range(c):
                v[i, j, k] = 1000 * i + 100 * j + k + 1
    return v.view(n * t, c, h, w)


def test_bidirectional_shift_exact_values():
    x = _clip()
    out = temporal_shift(x, num_segments=4, shift_div=4).view(2, 4, 8, 2, 3)
    # fold = 2: channels 0,1 from t+1; channels 2,3 from t-1; 4..7 unchanged
    for n in range(2):
        for t in range(4):
            for c in range(8):
                got = out[n, t, c, 0, 0].item()
                if c < 2:
                    want = 0 if t == 3 else 1000 * n + 100 * (t + 1) + c + 1
                elif c < 4:
                    want = 0 if t == 0 else 1000 * n + 100 * (t - 1) + c + 1
                else:
                    want = 1000 * n + 100 * t + c + 1
                assert got == want, (n, t, c)
    assert torch.all(out[..., :, :] == out[..., :1, :1])  # constant over H, W as built


def test_online_shift_exact_values():
    x = _clip()
    out = temporal_shift(x, 4, shift_div=4, online=True).view(2, 4, 8, 2, 3)
    assert torch.equal(out[:, 0, :2], torch.zeros(2, 2, 2, 3))            # no past at t=0
    assert out[1, 2, 1, 1, 2].item() == 1000 + 100 * 1 + 1 + 1            # from t-1
    assert torch.equal(out[:, :, 2:], x.view(2, 4, 8, 2, 3)[:, :, 2:])    # rest unchanged


def test_clips_do_not_leak_into_each_other():
    x = _clip(n=2, t=3, c=8)
    out = temporal_shift(x, 3, shift_div=8).view(2, 3, 8, 2, 3)
    assert out[0, 2, 0, 0, 0].item() == 0   # last frame of clip 0 does not see clip 1's frame 0
    assert out[1, 0, 1, 0, 0].item() == 0   # first frame of clip 1 does not see clip 0


@pytest.mark.parametrize("online", [False, True])
def test_reference_equals_official_formulation(online):
    x = torch.randn(3 * 8, 24, 4, 4)
    assert torch.equal(temporal_shift(x, 8, 8, online), temporal_shift_official(x, 8, 8, online))


def test_shift_errors():
    with pytest.raises(ValueError, match="multiple of num_segments"):
        temporal_shift(torch.zeros(7, 8, 2, 2), 4)
    with pytest.raises(ValueError, match=r"\(N\*T, C, H, W\)"):
        temporal_shift(torch.zeros(2, 4, 8, 2, 2), 4)


def test_shift_gradient_flows():
    x = torch.randn(8, 16, 3, 3, requires_grad=True)
    g = torch.randn(8, 16, 3, 3)
    (temporal_shift(x, 4, 8) * g).sum().backward()
    # d out[t, c<2] / d x[t+1, c<2] = 1: the gradient is the upstream one shifted back in time
    g5, gx = g.view(2, 4, 16, 3, 3), x.grad.view(2, 4, 16, 3, 3)
    assert torch.equal(gx[:, 1:, :2], g5[:, :-1, :2]) and torch.all(gx[:, 0, :2] == 0)
    assert torch.equal(gx[:, :-1, 2:4], g5[:, 1:, 2:4]) and torch.all(gx[:, -1, 2:4] == 0)
    assert torch.equal(gx[:, :, 4:], g5[:, :, 4:])


@pytest.mark.parametrize("per_frame_min", [0, 10**9])
@pytest.mark.parametrize("online", [False, True])
@pytest.mark.parametrize("kernel,stride", [(1, 1), (3, 2)])
def test_fused_shift_conv_gradcheck(online, kernel, stride, per_frame_min, monkeypatch):
    monkeypatch.setattr(shift_mod, "_PER_FRAME_MIN_ELEMENTS", per_frame_min)
    torch.manual_seed(0)
    x = torch.randn(2 * 3, 8, 4, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 8, kernel, kernel, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    moves = _moves(8, 4, online)
    fn = lambda x, w, b: _ShiftConv2dFn.apply(x, w, b, 2, 3, moves, (stride, stride),  # noqa: E731
                                              (kernel // 2,) * 2, (1, 1), 1)
    assert torch.autograd.gradcheck(fn, (x, w, b), fast_mode=True)
    assert torch.autograd.gradcheck(fn, (x, w, b))


@pytest.mark.parametrize("per_frame_min", [0, 10**9])   # both in-place strategies
@pytest.mark.parametrize("online", [False, True])
def test_fused_equals_reference_and_leaves_input_intact(online, per_frame_min, monkeypatch):
    monkeypatch.setattr(shift_mod, "_PER_FRAME_MIN_ELEMENTS", per_frame_min)
    torch.manual_seed(0)
    conv = ShiftConv2d(16, 8, 3, padding=1, bias=False, num_segments=4, shift_div=8, online=online)
    x0 = torch.randn(2 * 4, 16, 6, 6)
    grads = {}
    for fused in (True, False):
        assert use_fused_shift(conv, fused) == 1
        x = x0.clone().requires_grad_()
        h = x * 1.0      # a non-leaf input, as inside a network
        y = conv(h)
        assert torch.equal(h, x0)          # restored bit for bit after the forward
        (y * torch.arange(y.numel()).view_as(y).sin()).sum().backward()
        grads[fused] = (y.detach(), x.grad.clone(), conv.weight.grad.clone())
        conv.weight.grad = None
    for a, b in zip(grads[True], grads[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_temporal_pool_values():
    x = _clip(n=1, t=4, c=2)
    out = temporal_pool(x, 4)   # max over frames (t-1, t, t+1) at t = 0, 2
    assert out.shape == (2, 2, 2, 3)
    assert out[0, 0, 0, 0].item() == 100 * 1 + 1 and out[1, 1, 0, 0].item() == 100 * 3 + 2


def test_no_fused_shift_is_the_models_own_setting_not_the_process():
    """--no-fused-shift reaches the run's model (all 8 shifted convolutions of TSM-ResNet-18 take the
    reference path) and nothing else: a model built afterwards in the same process keeps the fused
    path (no process-wide switch)."""
    import logging

    from tsm_ds.cli.train import _model
    from tsm_ds.config import tree_with
    from tsm_ds.models import ShiftConv2d, build_model

    cfg = tree_with({"model.arch": "resnet18", "model.fused_shift": False})
    model = _model(cfg, {}, logging.getLogger("test"), num_classes=3)
    convs = [m for m in model.modules() if isinstance(m, ShiftConv2d)]
    assert len(convs) == 8 and not any(m.fused for m in convs)
    other = build_model("resnet18", 3)
    assert all(m.fused for m in other.modules() if isinstance(m, ShiftConv2d))
