"""Model-side parts of the large-batch recipe (Goyal et al. 2017, "Accurate, Large Minibatch SGD").

- :func:`zero_init_residual`: the last BatchNorm gamma of each residual block starts at zero, so
  every residual block starts as the identity and the network as a shallower one (Goyal et al.,
  Sec. 5.1, "zero gamma"; torchvision's ``zero_init_residual``). For training from scratch.
- Ghost BatchNorm (:class:`GhostBatchNorm2d`, :func:`use_ghost_bn`): BatchNorm statistics over
  groups of G clips inside a larger micro-batch (Hoffer, Hubara, Soudry 2017, "Train longer,
  generalize better"), so that one process running micro-batches of k x G clips normalises as the
  paper's workers did (8 clips per GPU: "Training Kinetics in 15 Minutes", BatchNorm over a fixed
  number of clips per worker as Goyal et al. Sec. 2.3). Each group is normalised by BatchNorm's own
  forward in turn, so outputs, gradients and running statistics equal those of k micro-batches of G
  clips with gradient accumulation (tested).
"""
from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["zero_init_residual", "GhostBatchNorm2d", "use_ghost_bn"]


def zero_init_residual(model: nn.Module) -> int:
    """Zero the gamma (weight) of the last BatchNorm of every residual block, in place.

    Blocks: torchvision's ``BasicBlock`` (``bn2``) and ``Bottleneck`` (``bn3``), and MobileNetV2's
    ``InvertedResidual`` with a skip connection (the BatchNorm closing ``conv``). The block then
    computes ``relu(x + 0)`` (ResNets) or ``x + 0`` (MobileNetV2) at init: the identity on the
    non-negative activations it receives.

    Args:
        model: a recognizer or backbone; modules are found by type, anywhere in it.

    Returns:
        The number of BatchNorm layers zeroed (0: no residual block found).
    """
    from torchvision.models.mobilenetv2 import InvertedResidual
    from torchvision.models.resnet import BasicBlock, Bottleneck

    n = 0
    with torch.no_grad():
        for mod in model.modules():
            bn = None
            if isinstance(mod, Bottleneck):
                bn = mod.bn3
            elif isinstance(mod, BasicBlock):
                bn = mod.bn2
            elif isinstance(mod, InvertedResidual) and mod.use_res_connect:
                bn = next((m for m in reversed(list(mod.conv.modules())) if isinstance(m, nn.BatchNorm2d)), None)
            if bn is not None and bn.weight is not None:
                bn.weight.zero_()
                n += 1
    return n


class GhostBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose training statistics are taken over groups of ``clips`` clips.

    In training, the batch (N*T frames of N clips, the T frames of a clip adjacent, TSN's layout)
    is split into N / ``clips`` equal groups, each normalised by ``nn.BatchNorm2d.forward`` in turn
    (so the running statistics take one momentum update per group, in order); in eval mode, and
    when N <= ``clips``, it is BatchNorm. ``num_clips`` (N of the current forward) is set by the
    model's pre-hook of :func:`use_ghost_bn`. Parameters and buffers are BatchNorm's (same names:
    checkpoints and exports are unchanged).

    Raises (forward):
        ValueError: N is not a multiple of ``clips``, or the frames do not split into N clips.
    """

    def __init__(self, *args, clips: int = 8, **kwargs):
        super().__init__(*args, **kwargs)
        if clips < 1:
            raise ValueError(f"ghost BatchNorm over {clips} clips: give >= 1")
        self.clips = int(clips)
        self.num_clips: int | None = None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, clips={self.clips}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.num_clips
        if not self.training or n is None or n <= self.clips:
            return super().forward(x)
        if n % self.clips or x.shape[0] % n:
            raise ValueError(f"ghost BatchNorm over {self.clips} clips: a batch of {n} clips ({x.shape[0]} frames) "
                             f"does not split into groups of {self.clips} clips; make the micro-batch a multiple")
        return torch.cat([super(GhostBatchNorm2d, self).forward(part) for part in x.chunk(n // self.clips)])


def use_ghost_bn(model: nn.Module, clips: int) -> int:
    """Replace every ``nn.BatchNorm2d`` of ``model`` by a :class:`GhostBatchNorm2d` over ``clips``
    clips (same parameters and buffers, in place) and register a forward pre-hook that tells them
    the clips of each batch (the input (N, T, C, H, W)'s N).

    Args:
        model: a recognizer taking clips (N, T, 3, H, W) (:class:`tsm_ds.models.tsn.TSN`).
        clips: G, clips per BatchNorm group (the paper: 8 per GPU).

    Returns:
        The number of BatchNorm layers replaced.

    Raises:
        ValueError: ``clips`` < 1.
    """
    if clips < 1:
        raise ValueError(f"--ghost-bn-clips {clips}: give the clips per BatchNorm group, >= 1")
    ghosts: list[GhostBatchNorm2d] = []

    def swap(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if type(child) is nn.BatchNorm2d:
                g = GhostBatchNorm2d(child.num_features, eps=child.eps, momentum=child.momentum,
                                     affine=child.affine, track_running_stats=child.track_running_stats,
                                     clips=clips, device=child.weight.device if child.affine else None,
                                     dtype=child.weight.dtype if child.affine else None)
                g.load_state_dict(child.state_dict())
                g.train(child.training)
                if child.affine:
                    g.weight.requires_grad_(child.weight.requires_grad)
                    g.bias.requires_grad_(child.bias.requires_grad)
                setattr(parent, name, g)
                ghosts.append(g)
            else:
                swap(child)
    swap(model)

    def tell(_mod, args):
        n = int(args[0].shape[0]) if args and torch.is_tensor(args[0]) else None
        for g in ghosts:
            g.num_clips = n
    if ghosts:
        model.register_forward_pre_hook(tell)
    return len(ghosts)
