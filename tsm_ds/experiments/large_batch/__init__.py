"""``tsm-ds bench large-batch``, the library half: does accuracy hold as the global batch grows?

The paper's claim (Lin, Gan, Han, "Training Kinetics in 15 Minutes", arXiv:1910.00932; TSM, ICCV
2019) is that TSM trains at a global batch of 12,288 clips without losing accuracy, with the linear
lr scaling rule and warm-up (Goyal et al. 2017); LARS (You, Gitman, Ginsburg 2017) and LAMB (You
et al. 2020) are the usual alternatives. This study measures it in miniature: the motion demo
data (time-reversed classes, where only temporal modelling helps), TSM, global batches from the
base batch up (world size 1, a fixed micro-batch x gradient accumulation), the same clips seen at
every batch, four recipes, every run through ``tsm_ds.train`` and the DeepSpeed engine.

The default study (docs/large-batch.md): the ``hard`` preset of the demo data (8 classes,
per-clip object size, speed and noise from easy to hard, low contrast, full clutter: batch 8 must
not solve it perfectly), batches 8 / 64 / 512 with 25,600 clips per run (50 steps at 512), 2,000
validation clips, evaluations every quarter epoch (time to 95 % of the best batch-8 accuracy), a
4x longer batch-8 run (the task's calibration) and the scaling
model's 1,536-GPU projection; estimated 2.2 h on the 2-core machine (:func:`.grid.estimate_seconds`).
The previous study (easy data, batches 8 / 32 / 128) saturated at 100 %.

Modules: :mod:`.grid` (settings, recipes, runs), :mod:`.runs` (one run's command, process and
read-back), :mod:`.study_report` (points, verdicts, tables, plot), :mod:`.study` (:func:`run_study`).
The command line is :mod:`tsm_ds.cli.bench_large_batch`.
"""
from __future__ import annotations

from .grid import (
                   QUICK,
                   RECIPES,
                   Recipe,
                   RunSpec,
                   StudySettings,
                   estimate_seconds,
                   plan_grid,
                   plan_headroom,
                   plan_sweep,
                   warmup_steps_for,
)
from .runs import read_run, train_command
from .study import PILOT_TOP1, choose_lr, publish, run_study
from .study_report import aggregate, verdicts

__all__ = ["QUICK", "RECIPES", "Recipe", "RunSpec", "StudySettings", "plan_grid", "plan_sweep", "plan_headroom",
           "warmup_steps_for", "estimate_seconds", "aggregate", "verdicts", "read_run", "train_command", "PILOT_TOP1",
           "choose_lr", "run_study", "publish"]
