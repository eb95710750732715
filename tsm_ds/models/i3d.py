"""I3D-ResNet-50: the 3D baseline of the TSM paper's throughput comparison.

Source: Wang, Girshick, Gupta, He, "Non-local Neural Networks" (CVPR 2018), Sec. 4 and Table 1:
a 2D ResNet-50 inflated to 3D; conv1 5x7x7; the first (1x1) conv of alternating bottlenecks
inflated to 3x1x1 (per stage 1,1,1 / 1,0,1,0 / 1,0,1,0,1,0 / 0,1,0, the I3D_3x1x1 layout, as in
mmaction2's ``i3d_r50`` config); temporal stride 2 in the first max-pool (3x3x3). No
non-local blocks. Module names follow torchvision's ResNet (``conv1``, ``layer1.0.conv1``, ...)
so ImageNet 2D weights inflate by name (:func:`tsm_ds.models.weights.inflate_2d_state_dict`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

INFLATE = ((1, 1, 1), (1, 0, 1, 0), (1, 0, 1, 0, 1, 0), (0, 1, 0))
WIDTHS = (64, 128, 256, 512)
STRIDES = (1, 2, 2, 2)


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

    Temporal size: T through conv1, T/2 (ceil) after the first max-pool, kept to the end; global
    average over (T, H, W), dropout, ``new_fc``. ``config`` as :func:`tsm_ds.models.build_model`.
    """

    def __init__(self, num_classes: int, config: dict[str, Any], dropout: float = 0.5):
        super().__init__()
        self.conv1 = nn.Conv3d(3, 64, (5, 7, 7), stride=(1, 2, 2), padding=(2, 3, 3), bias=False)
        self.bn1 = nn.BatchNorm3d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool3d((3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1))
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
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
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


def build_i3d(num_classes: int, *, num_segments: int = 32, dropout: float = 0.5,
              pretrained: str | None = None, partial_bn: bool = False) -> I3D:
    """I3D-R50 (see module docstring); ``pretrained`` = torchvision ResNet-50 ImageNet file, inflated.

    ``num_segments`` is recorded in ``config`` (the network accepts any T >= 1).
    """
    config = dict(arch="i3d_resnet50", num_classes=num_classes, num_segments=num_segments,
                  shift=None, shift_div=8, shift_place="blockres", temporal_pool=False,
                  dropout=dropout, partial_bn=partial_bn, pretrained=None)
    model = I3D(num_classes, config, dropout)
    if pretrained is not None:
        from .weights import inflate_2d_state_dict, read_state_dict
        sd = inflate_2d_state_dict(read_state_dict(pretrained), model)
        model.load_state_dict(sd, strict=False)
    return model
