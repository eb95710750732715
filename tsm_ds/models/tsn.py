"""The TSM / TSN recognizer: a torchvision 2D backbone with temporal shifts, dropout + new fc,
average consensus over the T frames of a clip.

Source: official TSM code ``ops/models.py`` (class ``TSN``: ``_prepare_base_model``,
``_prepare_tsn``, ``forward``, ``partialBN``/``train``) and ``ops/temporal_shift.py``
(``make_temporal_shift``, ``make_temporal_pool``).

Module layout mirrors the official one so that checkpoints map by name (see :mod:`.official`):
``base_model`` is the torchvision network with its classifier replaced by ``nn.Dropout``
(official: ``setattr(base_model, last_layer_name, nn.Dropout(p))``), ``new_fc`` the new linear
head. Differences, all handled by :func:`tsm_ds.models.official.official_key`:

* ``blockres`` shifts are fused into the convolution (:class:`.shift.ShiftConv2d`, parameter
  ``layer1.0.conv1.weight``); official: ``TemporalShift`` wrapper, ``layer1.0.conv1.net.weight``.
* MobileNetV2 is torchvision's (``features.N.conv.0.0.weight`` ...), the official code has its own
  ``archs/mobilenet_v2.py`` (``features.N.conv.0.weight`` ...); mapping table in :mod:`.official`.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torchvision

from .shift import ShiftConv2d, StreamState, TemporalPool, TemporalShift

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")
ARCHS_2D = RESNETS + ("mobilenet_v2",)
SHIFTS = ("bidirectional", "online", None)


def _shift_resnet(net: torchvision.models.ResNet, num_segments: int, shift_div: int, online: bool,
                  place: str, temporal_pool: bool) -> None:
    """Insert shifts into a torchvision ResNet in place (official ``make_temporal_shift``).

    ``blockres``: conv1 of every block (every second block when layer3 has >= 23 blocks, i.e.
    ResNet-101/152: official ``n_round = 2``); ``block``: wrap every whole block.
    With temporal pooling, stages 2-4 see num_segments // 2 frames.
    """
    segs = [num_segments] + [num_segments // 2 if temporal_pool else num_segments] * 3
    n_round = 2 if len(net.layer3) >= 23 else 1
    for stage_name, t in zip(("layer1", "layer2", "layer3", "layer4"), segs):
        stage = getattr(net, stage_name)
        for i, block in enumerate(stage):
            if place == "blockres":
                if i % n_round == 0:
                    block.conv1 = ShiftConv2d.from_conv(block.conv1, num_segments=t,
                                                        shift_div=shift_div, online=online)
            else:
                stage[i] = TemporalShift(block, num_segments=t, shift_div=shift_div, online=online)
    if temporal_pool:
        net.layer2 = TemporalPool(net.layer2, num_segments)


def _shift_mobilenet(net: torchvision.models.MobileNetV2, num_segments: int, shift_div: int,
                     online: bool) -> None:
    """Shift the first pointwise conv of each inverted-residual block with a residual connection.

    Official rule (``ops/models.py``): ``isinstance(m, InvertedResidual) and len(m.conv) == 8 and
    m.use_res_connect``; 8 official modules = torchvision's 4 (expansion blocks).
    """
    from torchvision.models.mobilenetv2 import InvertedResidual

    for m in net.features:
        if isinstance(m, InvertedResidual) and m.use_res_connect and len(m.conv) == 4:
            m.conv[0][0] = ShiftConv2d.from_conv(m.conv[0][0], num_segments=num_segments,
                                                 shift_div=shift_div, online=online)


class TSN(nn.Module):
    """Temporal Segment Network with optional temporal shift (TSM): a 2D CNN run on every frame.

    Build it with :func:`build_model`. Input (N, T, 3, H, W) float32 with any T (even with temporal
    pooling), output logits (N, num_classes): the average over T of the per-frame logits (official
    ``ConsensusModule('avg')``). The shift and pooling modules take T from the batch: before each
    forward every one is told its T (T, or T // 2 after a temporal pool), so a model built for
    ``num_segments`` = 8 computes, bit for bit, what a model built for the batch's T computes with
    the same weights (tested over T = 2..16; multigrid training changes T between steps).

    Attributes:
        base_model: the backbone; its classifier is ``nn.Dropout(dropout)``.
        new_fc: ``nn.Linear(feature_dim, num_classes)``, init N(0, 0.001), bias 0 (official).
        config: the :func:`build_model` arguments; ``build_model(**model.config)`` rebuilds it.
    """

    def __init__(self, base_model: nn.Module, feature_dim: int, num_classes: int,
                 config: dict[str, Any]):
        super().__init__()
        self.base_model = base_model
        self.new_fc = nn.Linear(feature_dim, num_classes)
        nn.init.normal_(self.new_fc.weight, 0, 0.001)
        nn.init.constant_(self.new_fc.bias, 0)
        self.config = dict(config)
        self.num_segments = config["num_segments"]
        # each temporal module's T as a divisor of the clip's T (1, or 2 after a temporal pool)
        self._temporal = [(m, max(1, self.num_segments // m.num_segments)) for m in base_model.modules()
                          if isinstance(m, (ShiftConv2d, TemporalShift, TemporalPool))]
        self.partial_bn = bool(config.get("partial_bn", False))
        self.train()   # applies partial BN (frozen BN parameters get requires_grad=False)

    # -- forward --------------------------------------------------------------------------------
    def frame_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Per-frame logits before the consensus: (N, T, 3, H, W) -> (N, T', num_classes).

        T' = T, or T // 2 with temporal pooling.

        Raises:
            ValueError: ``x`` not 5-D with 3 channels, or an odd T for a temporally pooled model.
        """
        if x.dim() != 5 or x.shape[2] != 3:
            raise ValueError(f"expected clips (N, T, 3, H, W), got shape {tuple(x.shape)}")
        n, t = x.shape[:2]
        self.set_segments(int(t))
        feats = self.base_model(x.reshape(n * t, *x.shape[2:]))
        out = self.new_fc(feats)
        return out.view(n, -1, out.shape[-1])

    def set_segments(self, t: int) -> None:
        """Tell every shift / pooling module the frames per clip of the next forward (T, or T // 2
        after a temporal pool). Raises ValueError: an odd T with temporal pooling, or T < 1."""
        if t < 1:
            raise ValueError(f"clips need T >= 1 frames, got {t}")
        if self.config["temporal_pool"] and t % 2:
            raise ValueError(f"temporal pooling halves T: give an even number of frames per clip, got T={t}")
        for m, div in self._temporal:
            m.num_segments = t if isinstance(m, TemporalPool) else t // div

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Clip logits (N, num_classes) from clips (N, T, 3, H, W): mean over frames."""
        return self.frame_logits(x).mean(dim=1)

    # -- streaming (online TSM) ----------------------------------------------------------------
    def shift_modules(self) -> list[nn.Module]:
        """The shift-carrying modules in forward order (their streaming caches go in this order)."""
        return [m for m in self.base_model.modules() if isinstance(m, (ShiftConv2d, TemporalShift))]

    def step(self, frame: torch.Tensor, cache: tuple[torch.Tensor, ...] | None = None
             ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Process one frame of a stream with the uni-directional (online) shift.

        Args:
            frame: (N, 3, H, W) float32, the next frame of N independent streams.
            cache: None for the first frame, else the cache returned by the previous call: one
                tensor per shift module (:meth:`shift_modules` order), the previous frame's
                first fold channels, (N, C_in // shift_div, H_i, W_i).

        Returns:
            (logits (N, num_classes) of this frame, new cache). In eval mode the logits equal
            ``frame_logits(clip)[:, t]`` of the clip forward, frame by frame (zeros stand for
            the frames before the start, exactly as the clip's shift pads).

        Raises:
            RuntimeError: the model was not built with shift="online", or uses temporal pooling.
            ValueError: wrong frame shape or a cache that does not belong to this model.
        """
        if self.config["shift"] != "online":
            raise RuntimeError("step() needs a model built with shift='online' (a bidirectional "
                               "shift looks at the next frame, which a stream does not have yet)")
        if self.config["temporal_pool"]:
            raise RuntimeError("step() does not support temporal_pool=True (it mixes frames)")
        if frame.dim() != 4 or frame.shape[1] != 3:
            raise ValueError(f"expected one frame (N, 3, H, W), got shape {tuple(frame.shape)}")
        mods = self.shift_modules()
        if cache is None:
            cache = (None,) * len(mods)
        if len(cache) != len(mods):
            raise ValueError(f"cache has {len(cache)} entries, this model has {len(mods)} shift "
                             "modules; pass cache=None to start a stream")
        states = [StreamState(c) for c in cache]
        try:
            for m, s in zip(mods, states):
                m.stream = s
            feats = self.base_model(frame)
        finally:
            for m in mods:
                m.stream = None
        return self.new_fc(feats), tuple(s.cache for s in states)

    # -- partial BN -----------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "TSN":
        """Train mode; with ``partial_bn`` every BatchNorm except the first stays frozen.

        Source: official ``TSN.train`` / ``partialBN`` (BN statistics and affine parameters of all
        but the first BatchNorm layer frozen: eval mode and ``requires_grad=False``).
        """
        super().train(mode)
        if self.partial_bn and mode:
            bns = [m for m in self.base_model.modules() if isinstance(m, nn.BatchNorm2d)]
            for m in bns[1:]:
                m.eval()
                m.weight.requires_grad_(False)
                m.bias.requires_grad_(False)
        return self


def build_tsn(arch: str, num_classes: int, *, num_segments: int = 8,
              shift: str | None = "bidirectional", shift_div: int = 8, shift_place: str = "blockres",
              temporal_pool: bool = False, dropout: float = 0.5, partial_bn: bool = False,
              pretrained: str | None = None) -> TSN:
    """TSM (shift set) or TSN (shift None) on a torchvision 2D backbone.

    Arguments, returns and errors as :func:`tsm_ds.models.registry.build_model` (the public entry
    point, which dispatches here for the 2D archs).
    """
    if arch not in ARCHS_2D:
        raise ValueError(f"unknown 2D arch {arch!r}; choose one of {ARCHS_2D}")
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {SHIFTS}, got {shift!r}")
    if shift_place not in ("blockres", "block"):
        raise ValueError(f"shift_place must be 'blockres' or 'block', got {shift_place!r}")
    if num_segments < 1:
        raise ValueError(f"num_segments must be >= 1, got {num_segments}")
    if temporal_pool and (num_segments % 2 or arch == "mobilenet_v2"):
        raise ValueError("temporal_pool needs a ResNet and an even num_segments "
                         f"(got arch={arch!r}, num_segments={num_segments})")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    config = dict(arch=arch, num_classes=num_classes, num_segments=num_segments, shift=shift,
                  shift_div=shift_div, shift_place=shift_place, temporal_pool=temporal_pool,
                  dropout=dropout, partial_bn=partial_bn, pretrained=None)
    # pretrained is recorded as None: rebuilding from a checkpoint's config must not need the
    # ImageNet file (the checkpoint holds the weights).

    base = getattr(torchvision.models, arch)(weights=None)
    if pretrained is not None:
        from .weights import load_imagenet_state_dict
        load_imagenet_state_dict(base, pretrained)
    if arch == "mobilenet_v2":
        feature_dim = base.classifier[-1].in_features
        base.classifier = nn.Dropout(dropout)
        if shift:
            if shift_place != "blockres":
                raise ValueError("mobilenet_v2 supports only shift_place='blockres' (the official "
                                 "rule: shift the first pointwise conv of residual blocks)")
            _shift_mobilenet(base, num_segments, shift_div, shift == "online")
    else:
        feature_dim = base.fc.in_features
        base.fc = nn.Dropout(dropout)
        if shift:
            _shift_resnet(base, num_segments, shift_div, shift == "online", shift_place,
                          temporal_pool)
        elif temporal_pool:
            base.layer2 = TemporalPool(base.layer2, num_segments)
    return TSN(base, feature_dim, num_classes, config)
