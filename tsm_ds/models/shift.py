"""Temporal shift (TSM), its fused training path, and temporal pooling.

Source: Lin, Gan, Han, "TSM: Temporal Shift Module for Efficient Video Understanding" (ICCV 2019),
Sec. 3; official code ``ops/temporal_shift.py`` (``TemporalShift.shift``, ``TemporalPool``,
``make_temporal_shift``) and ``online_demo/mobilenet_v2_tsm.py`` (uni-directional shift).

Layout: every 2D-backbone activation here is (N*T, C, H, W) with the T frames of a clip
adjacent (frame t of clip n at row n*T + t), exactly as the official code reshapes its input.

Two implementations of one definition
-------------------------------------
* :func:`temporal_shift` is the plain out-of-place definition (zero-padded slices, ``torch.cat``).
  It is the reference for the tests and the path used under ``torch.export``, ONNX export,
  ``torch.jit`` tracing, ``torch.compile`` and autocast.
* :class:`ShiftConv2d` fuses the shift into the convolution that consumes it (``blockres``: conv1 of
  every residual block). Only 2*fold = C/4 channels move, so only they are touched: the moved
  channels are shifted *in place* in the input's storage (through ``x.data``, which does not bump
  autograd's version counter), the convolution runs, and the overwritten boundary frames are put
  back, bit for bit. Backward recomputes the shifted input the same way for the weight gradient
  and applies the transposed shift in place to the fresh input gradient. No shifted copy of the
  activation is ever allocated or saved. Gradients equal the reference (see tests/models/test_shift.py:
  gradcheck in float64 and comparison with the out-of-place path).

  Why this matters (``python -m tsm_ds.cli.bench_models --skip zoo,op --shift-sizes 112,224 --batch 1
  --threads 1``; ResNet-50 training step, batch 1 x 8 frames, 1 thread, interleaved repetitions
  on the quiet 2-core machine): TSM/TSN step-time ratio at 112 px 1.013 / 1.023 / 1.028 / 1.038
  in four runs of 11-21 reps (median 1.026), 1.020 at 224 px; the official out-of-place shift
  1.054-1.085 / 1.089 in the same runs. Run-to-run scatter (+-1.5 %) is larger than the shift's
  own cost: timed per convolution (forward + backward, the 16 shifted convs of ResNet-50 at
  112 px), the in-place shift adds 9.1 ms to a ~750 ms step (1.2 %); before the moved channel
  groups shared one copy (see :func:`_shift_inplace`) it added 15.5 ms. A compiled (C++ memcpy)
  version of the same moves added 7.6 ms: not worth a compiler dependency, not kept. Other
  alternatives measured: ``torch.cat`` reference ~ +9 % per layer1 block; ``torch.compile`` (inductor, CPU)
  compiled a bottleneck block in 164 s and ran it 1.8x slower than eager here (compiled TSM/TSN
  block ratio 1.035), so it is not used on CPU.

  The fused path is chosen automatically (see :func:`fast_path_allowed`); ``--no-fused-shift`` (or
  ``TSM_DS_FUSED_SHIFT=0``) makes the train command call :func:`use_fused_shift` (model, False) to
  force the reference on that model's shift convolutions (a module attribute, not a process global).
  Caveats, all handled by falling back to the reference: it needs a view-able (N, T, C, H, W)
  input, zero padding mode, no autocast, and no tracing/compiling/exporting. While the fused
  convolution runs, the input tensor briefly holds shifted values; nothing else may read it
  concurrently (autograd runs one backward node at a time per device, so this holds in training).
  It does not support double backward.

  Channels-last activations (``--channels-last``): the (N*T, C, H, W) tensor still views as
  (N, T, C, H, W) (time is the outermost dimension in both layouts), so the same in-place copies
  run, on strided channel slices; the shifted values are bit-identical to the reference and the
  convolution sees a channels-last input (tests/models/test_shift.py). The reference path returns
  a contiguous tensor (``torch.cat``); :class:`ShiftConv2d` and :class:`TemporalShift` put it back
  in channels-last (one copy) so that the network keeps its layout after a fallback shift.

Kept whole: the reference shift and the fused in-place path are two implementations of one
definition that share the channel moves (``_moves``) and are tested against each other; a reader
needs both side by side.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

ShiftMode = Literal["bidirectional", "online"]

def use_fused_shift(module: nn.Module, enabled: bool) -> int:
    """Allow (True, the default of every :class:`ShiftConv2d`) or forbid (False) the fused in-place
    shift in ``module`` and its children; the train command passes ``model.fused_shift``
    (``--no-fused-shift``, ``TSM_DS_FUSED_SHIFT=0``), benchmarks and tests compare the two paths.

    Returns:
        The number of :class:`ShiftConv2d` modules set.
    """
    convs = [m for m in module.modules() if isinstance(m, ShiftConv2d)]
    for m in convs:
        m.fused = bool(enabled)
    return len(convs)


def fast_path_allowed(x: torch.Tensor) -> bool:
    """True when the fused in-place shift may run on ``x``.

    False (reference path) when tracing or scripting (torch.jit), compiling or exporting
    (torch.compile, torch.export, ONNX), under autocast for ``x``'s device, or for tensor subclasses
    (fake/functional tensors). A module forbidden the fused path (:func:`use_fused_shift`) does not ask.
    """
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return False
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export():
        return False
    if type(x) is not torch.Tensor and not isinstance(x, nn.Parameter):
        return False
    if x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type):
        return False
    return True


def _check(x: torch.Tensor, num_segments: int, shift_div: int) -> tuple[int, int, int, int, int]:
    if x.dim() != 4:
        raise ValueError(f"temporal shift expects (N*T, C, H, W), got shape {tuple(x.shape)}")
    nt, c, h, w = x.shape
    if num_segments < 1 or nt % num_segments:
        raise ValueError(f"temporal shift: batch dimension {nt} is not a multiple of "
                         f"num_segments={num_segments}; pass clips of exactly num_segments frames")
    if shift_div < 1:
        raise ValueError(f"shift_div must be >= 1, got {shift_div}")
    return nt // num_segments, num_segments, c, h, w


def _moves(c: int, shift_div: int, online: bool) -> list[tuple[int, int, int]]:
    """Channel ranges that move: (start, stop, source offset in time).

    offset +1: frame t takes frame t+1 (the future); -1: frame t takes frame t-1 (the past).
    """
    fold = c // shift_div
    if fold == 0:
        return []
    if online:
        return [(0, fold, -1)]
    return [(0, fold, +1), (fold, 2 * fold, -1)]


def temporal_shift(x: torch.Tensor, num_segments: int, shift_div: int = 8,
                   online: bool = False) -> torch.Tensor:
    """Shift part of the channels along time (out of place; the reference definition).

    Args:
        x: (N*T, C, H, W), any float dtype; the T frames of each clip adjacent.
        num_segments: T, frames per clip.
        shift_div: fold = C // shift_div channels move per direction (official default 8).
        online: False (bidirectional, official ``TemporalShift.shift``): channels [0, fold) take
            frame t+1, [fold, 2*fold) take frame t-1, the rest stay; zeros enter at the clip ends.
            True (uni-directional, official online demo): channels [0, fold) take frame t-1
            (zeros at t = 0), the rest stay.

    Returns:
        A new tensor of the same shape and dtype as ``x``.

    Raises:
        ValueError: ``x`` not 4-D, N*T not a multiple of ``num_segments``, or ``shift_div`` < 1.

    Export-friendly: only views, ``F.pad`` and ``torch.cat``; differentiable.
    """
    n, t, c, h, w = _check(x, num_segments, shift_div)
    moves = _moves(c, shift_div, online)
    if not moves:
        return x.clone()
    x5 = x.view(n, t, c, h, w)
    parts = []
    for start, stop, off in moves:
        s = x5[:, :, start:stop]
        if off > 0:   # frame t <- t+1, zero frame at the end: pad (.., time_left=0, time_right=1)
            parts.append(F.pad(s[:, 1:], (0, 0, 0, 0, 0, 0, 0, 1)))
        else:         # frame t <- t-1, zero frame at the start
            parts.append(F.pad(s[:, :-1], (0, 0, 0, 0, 0, 0, 1, 0)))
    parts.append(x5[:, :, moves[-1][1]:])
    return torch.cat(parts, dim=2).view(n * t, c, h, w)


def temporal_shift_official(x: torch.Tensor, num_segments: int, shift_div: int = 8,
                            online: bool = False) -> torch.Tensor:
    """The official implementation verbatim (``zeros_like`` + slice copies); for benchmarks.

    Same contract as :func:`temporal_shift`. Source: ``ops/temporal_shift.py``,
    ``TemporalShift.shift`` with ``inplace=False``.
    """
    n, t, c, h, w = _check(x, num_segments, shift_div)
    x5 = x.view(n, t, c, h, w)
    fold = c // shift_div
    out = torch.zeros_like(x5)
    if online:
        out[:, 1:, :fold] = x5[:, :-1, :fold]
        out[:, :, fold:] = x5[:, :, fold:]
    else:
        out[:, :-1, :fold] = x5[:, 1:, :fold]
        out[:, 1:, fold:2 * fold] = x5[:, :-1, fold:2 * fold]
        out[:, :, 2 * fold:] = x5[:, :, 2 * fold:]
    return out.view(n * t, c, h, w)


# ---------------------------------------------------------------------------------------------
# In-place primitives on (N, T, C, H, W) views that autograd does not track (callers pass .data)


# Two ways to move a channel range along time in place, chosen by device and size (measured on
# the 2-core CPU, ResNet-50 layer1 at 112 / 224 px): frame-by-frame copies move the least data (only
# the moved channels, once each way) but cost one op per frame, which dominates for small frames;
# a temporary copy of the moved range needs ~6 ops in all but moves 1.5x the data. On a GPU every
# op is a kernel launch (~5 us; an H100 step of 8 TSM-R50 clips takes ~13 ms): per-frame copies
# were ~1,000 tiny kernels a step, so off the CPU the region copy always runs, a constant number
# of kernels per call whatever T is (issue 37; the official shift is three slice copies).
_PER_FRAME_MIN_ELEMENTS = 64 * 1024


def per_frame_copies(device_type: str, frame_elements: int) -> bool:
    """True when the in-place shift moves a channel range frame by frame (the CPU, frames of at
    least 64 Ki elements); False: one copy of the moved range, a constant number of kernels (every
    other device, CUDA included). Both are bit-equal to :func:`temporal_shift`."""
    return device_type == "cpu" and frame_elements >= _PER_FRAME_MIN_ELEMENTS


@torch.no_grad()
def _shift_inplace(x5: torch.Tensor, moves, *, save: bool) -> list:
    """Apply the shift to ``x5`` (N, T, C, H, W) in place; return what :func:`_unshift_inplace`
    needs to undo it; with ``save=False`` nothing is kept (used on gradients).

    Large frames: per move, frame-by-frame copies in the order that never reads an overwritten
    frame; only the overwritten boundary frame is saved (("frame", data) per move). Small
    frames: one copy of the whole moved channel range [lo, hi) (both moves at once, they are
    adjacent), the moves read from it, and undoing is one copy back ([("region", data)]).
    """
    if not moves:
        return []
    t = x5.shape[1]
    lo, hi = moves[0][0], moves[-1][1]
    saved = []
    if per_frame_copies(x5.device.type, x5[:, 0, lo:moves[0][1]].numel()):
        for start, stop, off in moves:
            s = x5[:, :, start:stop]
            if off > 0:      # s[t] <- s[t+1]; frame 0 is lost, the last frame becomes zero
                if save:
                    saved.append(("frame", s[:, 0].clone()))
                for i in range(t - 1):
                    s[:, i].copy_(s[:, i + 1])
                s[:, t - 1].zero_()
            else:            # s[t] <- s[t-1]; the last frame is lost, frame 0 becomes zero
                if save:
                    saved.append(("frame", s[:, t - 1].clone()))
                for i in range(t - 1, 0, -1):
                    s[:, i].copy_(s[:, i - 1])
                s[:, 0].zero_()
        return saved
    region = x5[:, :, lo:hi]
    src = region.clone()
    for start, stop, off in moves:
        a, b = start - lo, stop - lo
        if off > 0:
            region[:, :-1, a:b].copy_(src[:, 1:, a:b])
            region[:, -1, a:b].zero_()
        else:
            region[:, 1:, a:b].copy_(src[:, :-1, a:b])
            region[:, 0, a:b].zero_()
    return [("region", src)] if save else []


@torch.no_grad()
def _unshift_inplace(x5: torch.Tensor, moves, saved: list) -> None:
    """Undo :func:`_shift_inplace` exactly (copies only, so the restored values are bit-identical)."""
    if not saved:
        return
    if saved[0][0] == "region":
        x5[:, :, moves[0][0]:moves[-1][1]].copy_(saved[0][1])
        return
    t = x5.shape[1]
    for (start, stop, off), (_, data) in zip(moves, saved):
        s = x5[:, :, start:stop]
        if off > 0:
            for i in range(t - 1, 0, -1):
                s[:, i].copy_(s[:, i - 1])
            s[:, 0].copy_(data)
        else:
            for i in range(t - 1):
                s[:, i].copy_(s[:, i + 1])
            s[:, t - 1].copy_(data)


def _transpose_moves(moves):
    """The adjoint of a shift is the shift in the opposite direction (zeros enter at the other end)."""
    return [(a, b, -off) for a, b, off in moves]


class _ShiftConv2dFn(torch.autograd.Function):
    """conv2d(shift(x)) without materialising shift(x). See the module docstring."""

    @staticmethod
    def forward(ctx, x, weight, bias, n, t, moves, stride, padding, dilation, groups):
        x5 = x.data.view(n, t, *x.shape[1:])
        saved = _shift_inplace(x5, moves, save=True)
        try:
            out = F.conv2d(x.data, weight, bias, stride, padding, dilation, groups)
        finally:
            _unshift_inplace(x5, moves, saved)
        ctx.save_for_backward(x, weight)
        ctx.cfg = (n, t, moves, stride, padding, dilation, groups, bias is not None)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        n, t, moves, stride, padding, dilation, groups, has_bias = ctx.cfg
        need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], \
            has_bias and ctx.needs_input_grad[2]
        gx = gw = gb = None
        if need_x or need_w or need_b:
            x5 = x.data.view(n, t, *x.shape[1:])
            saved = _shift_inplace(x5, moves, save=True) if need_w else None
            try:
                gx, gw, gb = torch.ops.aten.convolution_backward(
                    grad_out, x.data, weight, [weight.shape[0]] if has_bias else None,
                    list(stride), list(padding), list(dilation), False, [0, 0], groups,
                    [need_x, need_w, need_b])
            finally:
                if saved is not None:
                    _unshift_inplace(x5, moves, saved)
            if need_x:   # gx is freshly allocated by convolution_backward: transpose-shift in place
                _shift_inplace(gx.view(n, t, *gx.shape[1:]), _transpose_moves(moves), save=False)
        return gx, gw, gb, None, None, None, None, None, None, None


def _same_format(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y`` (the out-of-place shift of ``x``, always contiguous: ``torch.cat``) in ``x``'s layout when
    ``x`` is channels-last, so that a channels_last network stays so after a fallback shift
    (``--channels-last`` under autocast or compile); otherwise ``y`` itself."""
    if (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()):
        return y.contiguous(memory_format=torch.channels_last)
    return y


def _can_view5(x: torch.Tensor, n: int, t: int) -> bool:
    try:
        x.data.view(n, t, *x.shape[1:])
        return True
    except RuntimeError:
        return False


class ShiftConv2d(nn.Conv2d):
    """A ``nn.Conv2d`` that applies the temporal shift to its input first: conv(shift(x)).

    This is the ``blockres`` placement (official: ``TemporalShift(b.conv1, ...)``), fused. It is a
    Conv2d subclass so that its parameters keep torchvision's names (``layer1.0.conv1.weight``; the
    official checkpoints call them ``layer1.0.conv1.net.weight``, mapped in :mod:`.weights`) and so
    that DeepSpeed ZeRO-3 parameter hooks see the weight in the module that uses it.

    Input (N*T, C_in, H, W) -> output (N*T, C_out, H', W'). Attributes: ``num_segments`` (T, may be
    changed by temporal pooling), ``shift_div``, ``online`` (uni-directional), and ``stream``: when
    not None the module is in streaming mode (see :class:`StreamState`).
    """

    def __init__(self, *args, num_segments: int = 8, shift_div: int = 8, online: bool = False,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.num_segments = num_segments
        self.shift_div = shift_div
        self.online = online
        self.fused = True   # the fused in-place path may run (use_fused_shift)
        self.stream: StreamState | None = None

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, *, num_segments: int, shift_div: int = 8,
                  online: bool = False) -> "ShiftConv2d":
        """Wrap an existing ``nn.Conv2d``, sharing its parameters (no copy)."""
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                  conv.dilation, conv.groups, conv.bias is not None, conv.padding_mode,
                  num_segments=num_segments, shift_div=shift_div, online=online,
                  device="meta")
        new.weight = conv.weight
        new.bias = conv.bias
        return new

    def extra_repr(self) -> str:
        mode = "online" if self.online else "bidirectional"
        return (super().extra_repr() +
                f", shift=({mode}, num_segments={self.num_segments}, shift_div={self.shift_div})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stream is not None:
            return super().forward(self.stream.shift(x, self.in_channels // self.shift_div))
        n, t, c, _, _ = _check(x, self.num_segments, self.shift_div)
        moves = _moves(c, self.shift_div, self.online)
        if (moves and self.fused and fast_path_allowed(x) and self.padding_mode == "zeros"
                and not isinstance(self.padding, str) and _can_view5(x, n, t)):
            return _ShiftConv2dFn.apply(x, self.weight, self.bias, n, t, moves, self.stride,
                                        self.padding, self.dilation, self.groups)
        return super().forward(_same_format(x, temporal_shift(x, self.num_segments, self.shift_div, self.online)))


class TemporalShift(nn.Module):
    """Shift, then run ``net`` (the official ``TemporalShift`` module, used for ``block`` placement).

    ``net`` receives the shifted (N*T, C, H, W) tensor; the parameter names are the official ones
    (``layer1.0.net.conv1.weight``). Here the shifted tensor feeds both the residual branch and the
    identity, so it has to exist: this path uses the out-of-place :func:`temporal_shift`.
    """

    def __init__(self, net: nn.Module, num_segments: int = 8, shift_div: int = 8,
                 online: bool = False):
        super().__init__()
        self.net = net
        self.num_segments = num_segments
        self.shift_div = shift_div
        self.online = online
        self.stream: StreamState | None = None

    def extra_repr(self) -> str:
        mode = "online" if self.online else "bidirectional"
        return f"{mode}, num_segments={self.num_segments}, shift_div={self.shift_div}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stream is not None:
            return self.net(self.stream.shift(x, x.shape[1] // self.shift_div))
        return self.net(_same_format(x, temporal_shift(x, self.num_segments, self.shift_div, self.online)))


class StreamState:
    """Per-module cache for streaming online TSM: the first fold channels of the previous frame.

    ``shift(x, fold)`` takes one frame (N, C, H, W), returns it with channels [0, fold) replaced
    by the cached ones (zeros for the first frame) and caches the current frame's [0, fold).
    Source: official ``online_demo/mobilenet_v2_tsm.py`` (``InvertedResidualWithShift``).
    """

    def __init__(self, cache: torch.Tensor | None = None):
        self.cache = cache

    def shift(self, x: torch.Tensor, fold: int) -> torch.Tensor:
        prev = self.cache if self.cache is not None else torch.zeros_like(x[:, :fold])
        if prev.shape != x[:, :fold].shape:
            raise ValueError(f"streaming cache shape {tuple(prev.shape)} does not match the frame's "
                             f"{tuple(x[:, :fold].shape)}; start a new stream with cache=None")
        self.cache = x[:, :fold].detach().clone()
        return torch.cat([prev, x[:, fold:]], dim=1)


def temporal_pool(x: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Max-pool over time with kernel 3, stride 2, padding 1: (N*T, C, H, W) -> (N*(T//2), C, H, W).

    Source: official ``ops/temporal_shift.py``, ``TemporalPool.temporal_pool`` (T even).

    Raises:
        ValueError: N*T not a multiple of ``num_segments`` or T odd.
    """
    n, t, c, h, w = _check(x, num_segments, 1)
    if t % 2:
        raise ValueError(f"temporal pooling needs an even num_segments, got {t}")
    x5 = x.view(n, t, c, h, w).transpose(1, 2)
    x5 = F.max_pool3d(x5, kernel_size=(3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0))
    return x5.transpose(1, 2).reshape(n * (t // 2), c, h, w)


class TemporalPool(nn.Module):
    """Temporal max pooling before ``net`` (official ``TemporalPool``, wraps ``layer2``)."""

    def __init__(self, net: nn.Module, num_segments: int):
        super().__init__()
        self.net = net
        self.num_segments = num_segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(temporal_pool(x, self.num_segments))
