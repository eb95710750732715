"""Channels-last activations through the temporal shift and a TSM model (``--channels-last``).

- the fused in-place shift moves exactly the reference's values on channels-last tensors (both of
  its copy strategies), and ShiftConv2d's fused path equals its reference path bit for bit there;
- a TSM-ResNet-18 fed channels-last clips gives the default path's logits and gradients within
  float tolerance, and its activations stay channels-last to the last block (fused shift, the
  out-of-place fallback and the ``block`` placement alike);
- :func:`tsm_ds.engine.loop.model_prep.prepare_model` makes a channels_last model's parameters contiguous
  (DeepSpeed's broadcast needs it) and converts the inputs instead (the ``torch.compile`` unwrap is
  tested through the trainer: tests/engine/test_channels_last_compile.py).
"""
from __future__ import annotations

import pytest
import torch

from tsm_ds.engine.loop.model_prep import clip_to_channels_last, is_channels_last, prepare_model
from tsm_ds.models import build_model
from tsm_ds.models.shift import (
    _PER_FRAME_MIN_ELEMENTS,
    ShiftConv2d,
    _moves,
    _shift_inplace,
    temporal_shift,
    use_fused_shift,
)

CL = torch.channels_last


@pytest.mark.parametrize("online", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 16, 5, 5), (1, 3, 64, 128, 66)])   # region copy / per-frame copies
def test_inplace_shift_on_channels_last_moves_exactly_the_reference_values(shape, online):
    n, t, c, h, w = shape
    big = c // 8 * h * w * n >= _PER_FRAME_MIN_ELEMENTS
    assert big == (shape[-1] == 66)                      # both strategies are exercised
    x = torch.randn(n * t, c, h, w)
    y = x.contiguous(memory_format=CL)
    assert is_channels_last(y)
    _shift_inplace(y.view(n, t, c, h, w), _moves(c, 8, online), save=False)
    assert torch.equal(y, temporal_shift(x, t, 8, online)) and is_channels_last(y)


def _conv_step(conv, x, grad, fused: bool):
    use_fused_shift(conv, fused)
    xi = x.clone().requires_grad_(True)   # clone keeps the layout
    conv.zero_grad()
    y = conv(xi)
    y.backward(grad)
    return y.detach(), xi.grad, conv.weight.grad.clone()


@pytest.mark.parametrize("size", [7, 28])
def test_shift_conv_fused_equals_reference_bit_for_bit_on_channels_last(size):
    torch.manual_seed(0)
    conv = ShiftConv2d(64, 16, 3, padding=1, bias=False, num_segments=4)
    x = torch.randn(8, 64, size, size).contiguous(memory_format=CL)
    grad = torch.randn(8, 16, size, size)
    fused, ref = _conv_step(conv, x, grad, True), _conv_step(conv, x, grad, False)
    for a, b in zip(fused, ref):
        assert torch.equal(a, b)
    assert is_channels_last(fused[0]) and is_channels_last(ref[0])   # the fallback keeps the layout
    assert is_channels_last(fused[1])
    assert torch.equal(x, x.clone())                                   # the input was restored
    default = _conv_step(conv, x.contiguous(), grad, True)
    for a, b in zip(fused, default):   # float32 sums in another order: relative to the tensor's scale
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def _model_grads(model, clip):
    model.zero_grad()
    seen = {}
    h = model.base_model.layer4.register_forward_hook(lambda m, i, o: seen.update(cl=is_channels_last(o)))
    out = model(clip)
    (out * torch.arange(1, out.shape[1] + 1)).sum().backward()
    h.remove()
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}, seen["cl"]


@pytest.mark.parametrize("place", ["blockres", "block"])   # fused ShiftConv2d; out-of-place TemporalShift
def test_tsm_model_channels_last_matches_default_within_tolerance(place, one_thread):
    torch.manual_seed(0)
    model = build_model("resnet18", 5, num_segments=4, shift_place=place, dropout=0.0).train()
    clip = torch.randn(1, 4, 3, 48, 48)   # layer4 at 2x2: channels-last is told apart from contiguous
    ref_out, ref_g, ref_cl = _model_grads(model, clip)
    cl_clip = clip_to_channels_last(clip)
    assert torch.equal(cl_clip, clip) and cl_clip.stride()[2] == 1
    out, g, cl = _model_grads(model, cl_clip)
    assert cl and not ref_cl            # the whole backbone ran channels-last
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    for k, v in ref_g.items():
        torch.testing.assert_close(g[k], v, rtol=2e-3, atol=2e-4, msg=k)


def test_prepare_model_makes_parameters_contiguous_and_converts_inputs():
    torch.manual_seed(0)
    model = build_model("resnet18", 3, num_segments=2, dropout=0.0).to(memory_format=CL)
    assert not model.base_model.conv1.weight.is_contiguous()
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    out, compile_flag = prepare_model(model, channels_last=False)
    assert out is model and not compile_flag
    assert all(p.is_contiguous() for p in model.parameters())                 # DeepSpeed can broadcast them
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())  # values unchanged
    seen = []
    model.base_model.conv1.register_forward_pre_hook(lambda m, a: seen.append(a[0].stride()))
    model.eval()(torch.randn(1, 2, 3, 16, 16))
    assert seen and seen[0][1] == 1                                          # inputs converted instead
