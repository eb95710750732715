"""I3D-ResNet-50: the 3D baseline of the TSM paper's throughput comparison, in two reference layouts.

Source: Wang, Girshick, Gupta, He, "Non-local Neural Networks" (CVPR 2018), Sec. 4 and Table 1:
a 2D ResNet-50 inflated to 3D; conv1 5x7x7; the first (1x1) conv of alternating bottlenecks
inflated to 3x1x1 (per stage 1,1,1 / 1,0,1,0 / 1,0,1,0,1,0 / 0,1,0, the I3D_3x1x1 layout); a
1x3x3 max-pool after conv1 and a 2x1x1 max-pool (temporal stride 2) after res2. No non-local
blocks. The two layouts (:data:`LAYOUTS`) differ only in temporal strides, never in parameters
(28.04 M with a 400-way fc):

- ``"mmaction2"`` (arch ``i3d_resnet50``): mmaction2's ``i3d_r50`` (configs ``i3d_r50_32x2x1``,
  ``mmaction/models/backbones/resnet3d.py``: ``conv1_stride_t=2, pool1_stride_t=2,
  with_pool2=True``). T 32 -> 16 (conv1) -> 8 (pool1) -> 4 (pool2, res3-res5):
  33.1 GMACs per 32x224x224 clip.
- ``"nonlocal_release"`` (arch ``i3d_resnet50_release``): the released video-nonlocal-net code
  (``lib/models/resnet_video.py``, the 32x2 I3D baseline, 73.3 % top-1 in the TSM README): conv1
  and pool1 without temporal stride, pool2 halves T: T 32 (conv1, pool1, res2) -> 16 (res3-res5):
  113.6 GMACs per 32x224x224 clip. pool1 pads 1 pixel here (as torchvision and mmaction2; 56x56
  after pool1 at 224 px); the Caffe2 code pads 0 (55x55, 112.4 GMACs).

pool2 rounds up (``ceil_mode``): identical to the references for even T (all their configs),
defined for odd or unit T (clips shorter than the references run). Module names follow
torchvision's ResNet (``conv1``, ``layer1.0.conv1``, ...) so ImageNet 2D weights inflate by name
(:func:`tsm_ds.models.weights.inflate_2d_state_dict`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

INFLATE = ((1, 1, 1), (1, 0, 1, 0), (1, 0, 1, 0, 1, 0), (0, 1, 0))
WIDTHS = (64, 128, 256, 512)
STRIDES = (1, 2, 2, 2)
#: layout name -> temporal strides of conv1 and of the first max-pool (pool2 is 2 in both)
LAYOUTS: dict[str, dict[str, int]] = {
    "mmaction2": {"conv1_stride_t": 2, "pool1_stride_t": 2},
    "nonlocal_release": {"conv1_stride_t": 1, "pool1_stride_t": 1},
}
#: arch name (:mod:`.registry`) -> layout
ARCH_LAYOUTS: dict[str, str] = {"i3d_resnet50": "mmaction2", "i3d_resnet50_release": "nonlocal_release"}


class Bottleneck3d(nn.Module):
    """ResNet bottleneck in 3D: conv1 3x1x1 (inflated) or 1x1x1, conv2 1x3x3 (spatial stride),
    conv3 1x1x1 (x4 channels), identity or 1x1x1 projection shortcut. (N, C, T, H, W) in and out.
    """

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, inflate: bool):
        super().__init__()
        out_ch = width * self.expansion
        kt = 3 if inflate else 1
        self.conv1 = nn.Conv3d(in_ch, width, (kt, 1, 1), padding=(kt // 2, 0, 0), bias=False)
        self.bn1 = nn.BatchNorm3d(width)
        self.conv2 = nn.Conv3d(width, width, (1, 3, 3), stride=(1, stride, stride),
                               padding=(0, 1, 1), bias=False)
        self.bn2 = nn.BatchNorm3d(width)
        self.conv3 = nn.Conv3d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm3d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv3d(in_ch, out_ch, 1, stride=(1, stride, stride), bias=False),
                nn.BatchNorm3d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class I3D(nn.Module):
    """I3D-ResNet-50 recognizer: clips (N, T, 3, H, W) float32 -> logits (N, num_classes).

    Temporal size (see :data:`LAYOUTS`): conv1 and pool1 divide T by their temporal strides
    (``"mmaction2"``: ceil(T/2) each; ``"nonlocal_release"``: 1), res2 keeps it, pool2 halves it
    (ceil), res3-res5 keep it. Then global average over (T, H, W), dropout, ``new_fc``.
    ``config`` as :func:`tsm_ds.models.build_model` (``config["i3d_layout"]`` names the layout).

    Raises:
        ValueError: unknown ``layout``.
    """

    def __init__(self, num_classes: int, config: dict[str, Any], dropout: float = 0.5,
                 layout: str = "mmaction2"):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown I3D layout {layout!r}; choose one of {tuple(LAYOUTS)}")
        st = LAYOUTS[layout]
        self.layout = layout
        self.conv1 = nn.Conv3d(3, 64, (5, 7, 7), stride=(st["conv1_stride_t"], 2, 2),
                               padding=(2, 3, 3), bias=False)
        self.bn1 = nn.BatchNorm3d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool3d((1, 3, 3), stride=(st["pool1_stride_t"], 2, 2), padding=(0, 1, 1))
        self.pool2 = nn.MaxPool3d((2, 1, 1), stride=(2, 1, 1), ceil_mode=True)
        in_ch = 64
        for i, (width, stride, pattern) in enumerate(zip(WIDTHS, STRIDES, INFLATE)):
            blocks = []
            for j, inflate in enumerate(pattern):
                blocks.append(Bottleneck3d(in_ch, width, stride if j == 0 else 1, bool(inflate)))
                in_ch = width * Bottleneck3d.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.dropout = nn.Dropout(dropout)
        self.new_fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv3d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm3d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.new_fc.weight, 0, 0.001)
        nn.init.zeros_(self.new_fc.bias)
        self.config = dict(config)
        self.partial_bn = bool(config.get("partial_bn", False))
        self.train()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, 3, H, W) -> (N, num_classes).

        Raises:
            ValueError: ``x`` not (N, T, 3, H, W).
        """
        if x.dim() != 5 or x.shape[2] != 3:
            raise ValueError(f"expected clips (N, T, 3, H, W), got shape {tuple(x.shape)}")
        x = x.transpose(1, 2)                       # (N, 3, T, H, W)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool2(self.layer1(x))
        x = self.layer4(self.layer3(self.layer2(x)))
        x = self.avgpool(x).flatten(1)
        return self.new_fc(self.dropout(x))

    def train(self, mode: bool = True) -> "I3D":
        """Train mode; with ``partial_bn`` all BatchNorm layers but the first are frozen."""
        super().train(mode)
        if self.partial_bn and mode:
            for m in [m for m in self.modules() if isinstance(m, nn.BatchNorm3d)][1:]:
                m.eval()
                m.weight.requires_grad_(False)
                m.bias.requires_grad_(False)
        return self


def build_i3d(num_classes: int, *, layout: str = "mmaction2", num_segments: int = 32,
              dropout: float = 0.5, pretrained: str | None = None, partial_bn: bool = False) -> I3D:
    """I3D-R50 in ``layout`` (module docstring); ``pretrained`` = torchvision ResNet-50 ImageNet
    file, inflated.

    ``num_segments`` is recorded in ``config`` (the network accepts any T >= 1); so are the arch
    name of the layout (:data:`ARCH_LAYOUTS`) and ``i3d_layout``, which marks checkpoints of these
    layouts (see :func:`tsm_ds.models.registry.check_checkpoint_config`).

    Raises:
        ValueError: unknown ``layout``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown I3D layout {layout!r}; choose one of {tuple(LAYOUTS)}")
    arch = next(a for a, lay in ARCH_LAYOUTS.items() if lay == layout)
    config = dict(arch=arch, num_classes=num_classes, num_segments=num_segments,
                  shift=None, shift_div=8, shift_place="blockres", temporal_pool=False,
                  dropout=dropout, partial_bn=partial_bn, pretrained=None, i3d_layout=layout)
    model = I3D(num_classes, config, dropout, layout)
    if pretrained is not None:
        from .weights import inflate_2d_state_dict, read_state_dict
        sd = inflate_2d_state_dict(read_state_dict(pretrained), model)
        model.load_state_dict(sd, strict=False)
    return model
