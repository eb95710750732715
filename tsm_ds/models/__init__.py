"""TSM models: temporal shift, the TSM/TSN recognizer, the I3D baseline, weights, complexity.

Modules (imports point down: shift <- tsn, i3d <- registry <- official, complexity; weights is
used by tsn / i3d / official and imports none of them):

- :mod:`.shift`: the temporal shift (official semantics), fused shift + conv, temporal pool.
- :mod:`.tsn`: the recognizer (TSM with a shift, TSN without) on a torchvision 2D backbone.
- :mod:`.i3d`: the I3D-ResNet-50 baseline.
- :mod:`.registry`: ``BUILDERS`` (arch -> builder) and :func:`build_model`.
- :mod:`.groups`: optimizer parameter groups of the official recipe.
- :mod:`.weights`: state-dict files, ImageNet init, I3D inflation.
- :mod:`.official`: official TSM checkpoint import.
- :mod:`.complexity`: parameters, multiply-adds and FLOPs per clip.

Public API (see each function's docstring):

- :func:`temporal_shift` (N*T, C, H, W) -> same shape, the reference (out-of-place) shift.
- :func:`build_model` -> nn.Module taking clips (N, T, 3, H, W), returning logits (N, classes).
- :func:`parameter_groups` -> optimizer groups of the official recipe.
- :func:`load_official_checkpoint` -> a model with the weights of an official TSM ``.pth`` file.
- :func:`complexity` -> parameters, multiply-adds and FLOPs per clip.
"""
from .complexity import complexity
from .groups import parameter_groups
from .i3d import I3D
from .official import load_official_checkpoint, parse_official_name
from .registry import ARCHS, BUILDERS, build_model
from .shift import (
                    ShiftConv2d,
                    TemporalPool,
                    TemporalShift,
                    temporal_pool,
                    temporal_shift,
                    temporal_shift_official,
                    use_fused_shift,
)
from .tsn import ARCHS_2D, TSN
from .weights import CheckpointError, load_imagenet_state_dict

__all__ = ["ARCHS", "ARCHS_2D", "BUILDERS", "CheckpointError", "I3D", "ShiftConv2d", "TSN",
           "TemporalPool", "TemporalShift", "build_model", "complexity", "load_imagenet_state_dict",
           "load_official_checkpoint", "parameter_groups", "parse_official_name", "use_fused_shift",
           "temporal_pool", "temporal_shift", "temporal_shift_official"]
