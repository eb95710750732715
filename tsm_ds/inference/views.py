"""Multi-view testing: which views a test protocol takes, and how their scores are averaged.

A *view* is one clip (T frames sampled from the video) seen through one spatial crop. The official
TSM test protocols (``test_models.py`` in mit-han-lab/temporal-shift-module, and the paper's
Section 4 tables) take ``num_clips x num_crops`` views of every video:

- clips: 1 (TSN uniform: the centre frame of each of T equal segments), 2 (``--twice_sample``: the
  segment centres plus the segment starts), 10 (``--dense_sample``: 10 dense clips spread evenly
  over the video, as I3D / Non-local test);
- crops (``--test_crops``): 1 (resize the short side to the scale size, centre crop), 3 (left,
  right, centre along the long side, no flip), 5 (four corners + centre), 10 (the 5 and their
  horizontal flips); ``--full_res`` makes every crop a square of the scale size (256 for 224)
  instead of the input size, fed to the network at that size. Official: test_models.py at commit
  23eada75c6e55cdd0b91f2c99f310918260885a1 (``input_size = net.scale_size if args.full_res else
  net.input_size``); the box arithmetic is :func:`tsm_ds.data.transforms.official_view_boxes`.
- full_res default: ``None`` = this package's meaning before issue 18, full resolution for 3
  crops only (``--num-crops 3`` used to be the only 3-crop scheme, and it was the full-res one).
  The official script's ``--test_crops 3`` without ``--full_res`` is ``full_res=False``.
- resize: ``"box"`` (default, one resized crop per view) or ``"official"`` (scale the whole frame
  with bilinear on uint8, then crop; see :mod:`tsm_ds.data.transforms`).

The data side (:class:`tsm_ds.data.dataset.VideoClipDataset` in ``mode="test"``) builds the views
of one video as a uint8 tensor (V, T, 3, H, W), V = num_clips * num_crops, normalised per batch on the
model's device (:func:`tsm_ds.engine.loop.evaluate.gather_predictions`, ``tsm-ds predict``). This module folds
the views into the batch axis, runs the model, and averages the V scores of each video back into one.

Averaging default: **logits**. The official ``test_models.py`` averages the network's raw outputs
over views (``rst.reshape(batch_size, num_crop, -1).mean(1)``; its ``--softmax`` flag applies the
softmax only *after* averaging), so the paper's multi-view numbers are logit averages and our
default reproduces them. ``average="prob"`` (softmax per view, then mean; mmaction2's
``average_clips='prob'``) is offered because it keeps one over-confident view from dominating.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tsm_ds.data.transforms import RESIZE_MODES

AVERAGE_MODES = ("logits", "prob")
#: num_clips -> the official sampling that produces them.
CLIP_SAMPLING = {1: "tsn", 2: "tsn", 10: "dense"}
#: num_crops -> the official crop scheme's name.
CROP_SCHEMES = {1: "centre crop", 3: "left/right/centre", 5: "corners + centre",
                10: "corners + centre, flipped"}
LEGACY_3CROP_NOTE = ("--num-crops 3 without --full-res/--no-full-res keeps its old meaning, 3 full-resolution "
                     "crops (= --num-crops 3 --full-res); this default is deprecated: the official "
                     "test_models.py --test_crops 3 without --full_res is --num-crops 3 --no-full-res")


def legacy_note(num_crops: int, full_res: bool | None) -> str | None:
    """The deprecation note for ``--num-crops 3`` without an explicit ``--[no-]full-res``, else None."""
    return LEGACY_3CROP_NOTE if int(num_crops) == 3 and full_res is None else None


@dataclass(frozen=True)
class ViewProtocol:
    """One multi-view test protocol: ``num_clips`` clips x ``num_crops`` crops per video.

    Attributes:
        num_clips: clips per video: 1 (uniform), 2 (twice sample), 10 (dense).
        num_crops: crops per clip: 1 (centre), 3 (left/right/centre), 5 (corners + centre),
            10 (corners + centre + flips).
        sampling: ``"tsn"`` (segment-based: 1 or 2 clips) or ``"dense"`` (10 clips).
        full_res: crops of side scale_size instead of the input size (official ``--full_res``).
        resize: ``"box"`` or ``"official"`` (see :mod:`tsm_ds.data.transforms`).

    Source: ``test_models.py`` flags ``--twice_sample``, ``--dense_sample``, ``--test_crops``,
    ``--full_res`` (mit-han-lab/temporal-shift-module).
    """

    num_clips: int = 1
    num_crops: int = 1
    sampling: str = "tsn"
    full_res: bool = False
    resize: str = "box"

    @property
    def num_views(self) -> int:
        """V = num_clips * num_crops, the views per video."""
        return self.num_clips * self.num_crops

    @property
    def twice_sample(self) -> bool:
        """True for the official 2-clip protocol: segment centres + segment starts."""
        return self.num_clips == 2 and self.sampling == "tsn"

    def dataset_kwargs(self) -> dict:
        """Keyword arguments for ``VideoClipDataset(records, **kwargs)`` (test mode, these views)."""
        kw = {"mode": "test", "sampling": self.sampling, "num_clips": self.num_clips,
              "num_crops": self.num_crops, "full_res": self.full_res, "resize": self.resize}
        if self.twice_sample:
            kw["twice_sample"] = True
        return kw

    def describe(self) -> str:
        """Human-readable name, e.g.
        ``"10 clips (dense) x 3 crops (left/right/centre, full-res) = 30 views"``; ``resize=official``
        is appended when set."""
        clips = {1: "1 clip", 2: "2 clips (twice sample)"}.get(self.num_clips, f"{self.num_clips} clips")
        if self.sampling == "dense":
            clips += " (dense)"
        crops = CROP_SCHEMES.get(self.num_crops, "?") + (", full-res" if self.full_res else "")
        text = f"{clips} x {self.num_crops} crops ({crops}) = {self.num_views} views"
        return text + (", resize=official" if self.resize == "official" else "")


def view_protocol(num_clips: int = 1, num_crops: int = 1, sampling: str | None = None, *,
                  full_res: bool | None = None, resize: str | None = None) -> ViewProtocol:
    """Validate and complete a protocol: ``sampling`` defaults to the official one for num_clips.

    Args:
        num_clips: 1, 2 or 10 (see :data:`CLIP_SAMPLING`).
        num_crops: 1, 3, 5 or 10 (see :data:`CROP_SCHEMES`).
        sampling: ``"tsn"`` or ``"dense"``; None picks ``"dense"`` for 10 clips, else ``"tsn"``.
        full_res: crops of side scale_size (official ``--full_res``); None: True for 3 crops
            only (the pre-issue-18 meaning of ``--num-crops 3``, see :data:`LEGACY_3CROP_NOTE`).
        resize: ``"box"`` (None: the default) or ``"official"``.

    Returns:
        The :class:`ViewProtocol`.

    Raises:
        ValueError: a clip or crop count outside those choices, an unknown sampling or resize.
    """
    if num_clips not in CLIP_SAMPLING:
        raise ValueError(f"num_clips={num_clips}: the test protocols take 1 (uniform), 2 (twice sample) "
                         f"or 10 (dense) clips per video")
    if num_crops not in CROP_SCHEMES:
        raise ValueError(f"num_crops={num_crops}: the test protocols take 1 (centre), 3 (left/right/"
                         f"centre), 5 (corners + centre) or 10 (5 + flips) crops per clip")
    resize = resize or "box"
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize={resize!r}: expected one of {RESIZE_MODES}")
    sampling = sampling or CLIP_SAMPLING[num_clips]
    if sampling not in ("tsn", "dense"):
        raise ValueError(f"sampling={sampling!r}: expected 'tsn' or 'dense'")
    full_res = bool(int(num_crops) == 3 if full_res is None else full_res)
    return ViewProtocol(num_clips=num_clips, num_crops=int(num_crops), sampling=sampling,
                        full_res=full_res, resize=resize)


def average_views(scores: torch.Tensor, num_views: int, average: str = "logits") -> torch.Tensor:
    """Average the V view scores of each video into one score vector.

    Args:
        scores: float (N*V, K) logits, the V views of video n in rows ``n*V .. n*V+V-1``
            (video-major, as :func:`fold_views` lays them out); or (N, V, K).
        num_views: V (>= 1).
        average: ``"logits"`` (mean of logits; the official test code) or ``"prob"`` (softmax of
            each view over the K classes, then the mean: probabilities that sum to 1).

    Returns:
        float (N, K), same dtype as ``scores``: mean logits, or mean probabilities.

    Raises:
        ValueError: unknown ``average``, ``num_views < 1``, or a row count not divisible by V.
    """
    if average not in AVERAGE_MODES:
        raise ValueError(f"average={average!r}: expected one of {AVERAGE_MODES}")
    if num_views < 1:
        raise ValueError(f"num_views={num_views}: must be >= 1")
    if scores.dim() == 2:
        if scores.shape[0] % num_views:
            raise ValueError(f"{scores.shape[0]} score rows are not a whole number of videos of "
                             f"{num_views} views each")
        scores = scores.reshape(scores.shape[0] // num_views, num_views, scores.shape[1])
    elif scores.dim() != 3 or scores.shape[1] != num_views:
        raise ValueError(f"scores of shape {tuple(scores.shape)}: expected (N*V, K) or (N, V={num_views}, K)")
    if average == "prob":
        scores = F.softmax(scores, dim=-1)
    return scores.mean(dim=1)


def fold_views(clip: torch.Tensor, num_views: int) -> torch.Tensor:
    """Fold the views of a batch into the batch axis.

    Args:
        clip: float (N, V, T, 3, H, W) (test mode with views), or (N, T, 3, H, W) when V == 1.
        num_views: V.

    Returns:
        (N*V, T, 3, H, W), views of video n in rows n*V .. n*V+V-1 (a view of ``clip``, no copy).

    Raises:
        ValueError: the view axis does not hold ``num_views`` views, or the rank is wrong.
    """
    if clip.dim() == 5 and num_views == 1:
        return clip
    if clip.dim() != 6 or clip.shape[1] != num_views:
        raise ValueError(f"clip of shape {tuple(clip.shape)}: expected (N, V={num_views}, T, 3, H, W)"
                         + (" or (N, T, 3, H, W)" if num_views == 1 else "")
                         + "; check that the dataset's num_clips * num_crops equals the protocol's views")
    return clip.reshape(clip.shape[0] * num_views, *clip.shape[2:])


class MultiViewForward:
    """``forward(model, clip) -> scores`` for :func:`tsm_ds.engine.loop.evaluate.gather_predictions`.

    Folds the V views into the batch, runs the model in chunks of at most ``max_clips`` clips
    (memory: 10 x 3 views of 8 frames at 224 px is 240 frames per video), averages per video.

    Args:
        num_views: V = num_clips * num_crops.
        average: ``"logits"`` (default, as the official test code) or ``"prob"``.
        max_clips: clips per model call (None: all N*V at once).

    Call:
        model: module mapping float (B, T, 3, H, W) to logits (B, K); put in eval mode by the caller.
        clip: float (N, V, T, 3, H, W) or (N, T, 3, H, W) when V == 1; moved to the model's device.
        Returns float32 (N, K): averaged logits or probabilities (see :func:`average_views`).

    Raises:
        ValueError: from :func:`fold_views` / :func:`average_views` on shape mismatches.
    """

    def __init__(self, num_views: int, average: str = "logits", max_clips: int | None = None):
        if average not in AVERAGE_MODES:
            raise ValueError(f"average={average!r}: expected one of {AVERAGE_MODES}")
        if max_clips is not None and max_clips < 1:
            raise ValueError(f"max_clips={max_clips}: must be >= 1 or None")
        self.num_views, self.average, self.max_clips = num_views, average, max_clips

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, clip: torch.Tensor) -> torch.Tensor:
        flat = fold_views(clip, self.num_views)
        param = next(model.parameters(), None)
        if param is not None:
            flat = flat.to(device=param.device, dtype=param.dtype if param.is_floating_point() else flat.dtype)
        step = self.max_clips or flat.shape[0]
        logits = torch.cat([model(flat[i:i + step]) for i in range(0, flat.shape[0], step)])
        return average_views(logits.float(), self.num_views, self.average)
