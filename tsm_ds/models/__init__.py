"""TSM models: temporal shift, the TSM/TSN recognizer, the I3D baseline, weights, complexity.

Public API (see each function's docstring):

- :func:`temporal_shift` (N*T, C, H, W) -> same shape, the reference (out-of-place) shift.
- :func:`build_model` -> nn.Module taking clips (N, T, 3, H, W), returning logits (N, classes).
- :func:`parameter_groups` -> optimizer groups of the official recipe.
- :func:`load_official_checkpoint` -> a model with the weights of an official TSM ``.pth`` file.
- :func:`complexity` -> parameters, multiply-adds and FLOPs per clip.
"""
from .shift import (ShiftConv2d, TemporalPool, TemporalShift, set_fused_shift, temporal_pool,
                    temporal_shift, temporal_shift_official)
from .tsm import ARCHS_2D, TSN, build_model, parameter_groups
from .i3d import I3D
from .weights import load_imagenet_state_dict, load_official_checkpoint, parse_official_name
from .table import complexity

ARCHS = ARCHS_2D + ("i3d_resnet50",)

__all__ = ["ARCHS", "I3D", "ShiftConv2d", "TSN", "TemporalPool", "TemporalShift", "build_model",
           "complexity", "load_imagenet_state_dict", "load_official_checkpoint",
           "parameter_groups", "parse_official_name", "set_fused_shift", "temporal_pool",
           "temporal_shift", "temporal_shift_official"]
