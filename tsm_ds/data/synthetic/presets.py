"""Named difficulty presets of the motion demo data: explicit generator fields, nothing hidden.

A preset is a dict of :func:`~tsm_ds.data.synthetic.make_demo_dataset` keyword arguments (the
generator's fields); its difficulty comes only from the *inputs* (noise, contrast, object size and
speed, distractors, background clutter, tint, number of classes), never from the labels: every
label stays exact and the time-reversal design of :mod:`tsm_ds.data.synthetic` holds for every
preset (a clip's twin is the same clip played backwards).

- ``demo``: the defaults of ``tsm-ds demo`` (4 moving classes, brightness contrast >= 0.4, noise
  sigma 0.01-0.05): TSM solves it (100 % val top-1 within a few hundred batch-8 steps).
- ``hard``: the task of ``tsm-ds bench large-batch``: 8 classes of the generator (moving in 4
  directions, growing / shrinking, appearing / vanishing; not the rotation pair, which TSM at 32 px
  never learned), low contrast (0.2), a static distractor shape in half the clips, per-clip draws
  from easy to hard: object radius 6-12 px, speed 0.75-2.5 px/frame, noise sigma 0.02-0.6
  (intensities clipped to [0, 1]); full background clutter and strong tint; 16 frames, so that the
  4 sampled frames are ~4 frames apart. Calibrated through the trainer (docs/large-batch.md,
  the pilots): batch-8 SGD stays below 90 % in the study's 5 epochs and a 4x longer run gains
  more than 5 points. The versions before it plateaued near 90 % because the rotating cw / ccw
  pair stayed at chance (confusion matrix of a 4x run: 8 classes at 97-100 %, rotating cw 9.5 %,
  ccw 89 %); with 8-frame clips every 4-class variant stayed at chance for 800 batch-8 steps.
"""
from __future__ import annotations

import copy
from typing import Any

__all__ = ["DIFFICULTIES", "difficulty_params"]

#: preset name -> generator fields (keyword arguments of ``make_demo_dataset`` / the study's
#: :class:`~tsm_ds.experiments.large_batch.grid.StudySettings`); units as there: sizes and speeds
#: in pixels (per frame), noise / contrast / tint in intensity units of [0, 1]
DIFFICULTIES: dict[str, dict[str, Any]] = {
    "demo": {"classes": ("moving_left", "moving_right", "moving_up", "moving_down"), "num_frames": 16, "size": 64,
             "speed": (1.5, 2.5), "radius": (8.0, 12.0), "noise": (0.01, 0.05), "distractor_prob": 0.0,
             "clutter": 0.5, "contrast": 0.4, "tint": 0.25},
    "hard": {"classes": ("moving_right", "moving_left", "moving_down", "moving_up", "growing", "shrinking",
                         "appearing", "vanishing"), "num_frames": 16, "size": 64,
             "speed": (0.75, 2.5), "radius": (6.0, 12.0), "noise": (0.02, 0.6), "distractor_prob": 0.5,
             "clutter": 1.0, "contrast": 0.2, "tint": 0.4},
}


def difficulty_params(name: str) -> dict[str, Any]:
    """The generator fields of preset ``name`` (a deep copy: the caller may change it).

    Returns:
        {"classes": tuple of class names, "num_frames": int, "size": int (pixels), "speed":
        (low, high) px/frame, "radius": (low, high) px, "noise": (low, high) sigma,
        "distractor_prob": float, "clutter": float, "contrast": float, "tint": float}.

    Raises:
        ValueError: an unknown preset (the message lists the known ones).
    """
    if name not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {name!r}; choose from {', '.join(DIFFICULTIES)}")
    return copy.deepcopy(DIFFICULTIES[name])
