"""``tsm-ds bench large-batch``, the library half: does accuracy hold as the global batch grows?

The paper's claim (Lin, Gan, Han, "Training Kinetics in 15 Minutes", arXiv:1910.00932; TSM, ICCV
2019) is that TSM trains at a global batch of 12,288 clips without losing accuracy, with the linear
lr scaling rule and warm-up (Goyal et al. 2017); LARS (You, Gitman, Ginsburg 2017) and LAMB (You
et al. 2020) are the usual alternatives. This study measures it in miniature: the motion demo
data (time-reversed classes, where only temporal modelling helps), TSM, global batches from the
base batch up (world size 1, a fixed micro-batch x gradient accumulation), the same clips seen at
every batch, four recipes, every run through ``tsm_ds.train`` and the DeepSpeed engine.

Measured with the defaults (batches 8 / 32 / 128, 6,400 clips per run, 2 seeds at 8 and 128; 98
min on the shared 2-core CPU; README "Large batch"): LARS and LAMB hold 100 % val top-1 at every
batch; SGD with the linear rule holds to 32 and falls to chance at 128 (lr 0.048 blows the loss up
right after warm-up); SGD without scaling holds to 32 and reaches 82 % at 128 (too few steps).

Modules: :mod:`.grid` (settings, recipes, runs), :mod:`.runs` (one run's command, process and
read-back), :mod:`.study_report` (points, verdicts, tables, plot), :mod:`.study` (:func:`run_study`).
The command line is :mod:`tsm_ds.cli.bench_large_batch`.
"""
from __future__ import annotations

from .grid import QUICK, RECIPES, Recipe, RunSpec, StudySettings, plan_grid, plan_sweep, warmup_steps_for
from .study_report import aggregate, verdicts
from .runs import read_run, train_command
from .study import PILOT_TOP1, choose_lr, run_study

__all__ = ["QUICK", "RECIPES", "Recipe", "RunSpec", "StudySettings", "plan_grid", "plan_sweep", "warmup_steps_for",
           "aggregate", "verdicts", "read_run", "train_command", "PILOT_TOP1", "choose_lr", "run_study"]
