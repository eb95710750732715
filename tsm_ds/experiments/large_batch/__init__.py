"""``tsm-ds bench large-batch``, the library half: does accuracy hold as the global batch grows?

The paper's claim (Lin, Gan, Han, "Training Kinetics in 15 Minutes", arXiv:1910.00932; TSM, ICCV
2019) is that TSM trains at a global batch of 12,288 clips without losing accuracy, with the linear
lr scaling rule and warm-up (Goyal et al. 2017); LARS (You, Gitman, Ginsburg 2017) and LAMB (You
et al. 2020) are the usual alternatives. This study measures it in miniature: the motion demo
data (time-reversed classes, where only temporal modelling helps), TSM, global batches from the
base batch up (world size 1, a fixed micro-batch x gradient accumulation), the same clips seen at
every batch, three recipes, every run through ``tsm_ds.train`` and the DeepSpeed engine.

The default study (docs/large-batch.md) runs the paper's regime: the ``hard`` preset of the demo
data (8 classes, per-clip object size, speed and noise from easy to hard, low contrast, full
clutter: the base batch must not solve it), global batches 8 / 64 / 256 (32x), 15 epochs of 5,120
clips (300 optimizer steps at 256, 20 per epoch), BatchNorm over 8 clips at every batch, a 5-epoch
warm-up above the base batch, three recipes ((a) SGD with the linear rule, the paper's; (b) LARS;
(c) LAMB), each lr chosen by a sweep of 3 values a factor 2 apart, the pass rule of
:mod:`.study_report`, time to accuracy for every run, and the base's 2x-longer run (is the base near
convergence?). Estimated in :func:`.grid.estimate_seconds` (``tsm-ds bench large-batch --help``).
The previous study (50 steps at 512, warm-up a fraction of each run) is kept under
``results/large_batch/history/``.

Modules: :mod:`.grid` (settings, recipes, runs), :mod:`.runs` (one run's command, process and
read-back), :mod:`.study_report` (points, verdicts, tables, plot), :mod:`.study` (:func:`run_study`).
The command line is :mod:`tsm_ds.cli.bench_large_batch`.
"""
from __future__ import annotations

from .grid import QUICK, RECIPES, STAGES, Recipe, RunSpec, StudySettings, estimate_seconds, plan_stage, warmup_steps_for
from .runs import portable, read_run, train_command
from .study import publish, run_study, write_report
from .study_report import choose_lr, pass_rule, verdicts

__all__ = ["QUICK", "RECIPES", "STAGES", "Recipe", "RunSpec", "StudySettings", "plan_stage", "warmup_steps_for",
           "estimate_seconds", "pass_rule", "verdicts", "read_run", "train_command", "portable", "choose_lr",
           "run_study", "write_report", "publish"]
