"""A synthetic video dataset whose labels live only in the order of the frames.

The demo dataset (``tsm-ds demo``, and the trainer's fallback when no data is given) shows in a
few CPU minutes what the TSM paper claims: a 2D network that shifts channels in time (TSM) models
temporal order, the same network averaging per-frame scores (TSN) cannot.

Design: classes come in *time-reversal pairs* ("moving_right" / "moving_left", "moving_down" /
"moving_up", "growing" / "shrinking", "rotating_cw" / "rotating_ccw", "appearing" / "vanishing").
Clip j of the second class of a pair is clip j of the first class played backwards: the same
shape, colours, background, distractor and per-frame noise, frames in reverse order. So

- the bag of frames of a clip and of its twin is the same (up to the codec), and any function of
  the unordered frames (TSN's average consensus) scores both alike: within a pair it is at chance;
- single frames pooled over time have the same distribution in both classes of a pair; for the
  four ``moving_*`` classes the object's position is also drawn so that the pooled single-frame
  distribution is the same across *all* four (the moving coordinate runs along a trajectory whose
  midpoint is uniform over the positions that keep it in the frame; the still coordinate is the
  position of an independent trajectory of the same law at a uniformly drawn frame);
- nothing else depends on the class: shapes, colours, sizes, speeds, backgrounds, an optional
  static distractor and noise are drawn from one law for every class.

Everything is drawn from ``numpy.random.default_rng((seed, split, pair, j))``, so a clip does not
depend on the others, on the order they are made in, or on the number of worker processes, and
the decoded frames are byte-identical for the same seed and parameters (same machine and
PyAV/FFmpeg build).

Modules: :mod:`~tsm_ds.data.synthetic.render` (the class pairs, :func:`sample_clip`,
:func:`render_clip`: numpy only) and :mod:`~tsm_ds.data.synthetic.dataset`
(:func:`make_demo_dataset`, :func:`encode_video`, :func:`available_codec`: PyAV, files);
:mod:`~tsm_ds.data.synthetic.presets` names difficulty presets (``demo``, ``hard``: explicit
generator fields, difficulty from the inputs only).

Files: ``root/{train,val}/<class>/<class>_<j:04d>.mp4`` (H.264 via libx264 when the PyAV build
has it, else MPEG-4 part 2), list files ``root/train.txt`` and ``root/val.txt`` with lines
``<path relative to root> <label>``, ``root/classes.txt`` (one name per line, line number =
label) and ``root/meta.json`` (parameters plus per-clip ground truth: object centre, size, angle
and opacity per frame). ``meta.json`` is written last and atomically: its presence marks a
complete dataset, which a second call with the same parameters reuses.
"""
from __future__ import annotations

from .dataset import available_codec, encode_video, make_demo_dataset
from .presets import DIFFICULTIES, difficulty_params
from .render import ALL_CLASSES, CLASS_PAIRS, DEFAULT_CLASSES, render_clip, sample_clip

__all__ = ["CLASS_PAIRS", "ALL_CLASSES", "DEFAULT_CLASSES", "make_demo_dataset", "sample_clip",
           "render_clip", "encode_video", "available_codec", "DIFFICULTIES", "difficulty_params"]
