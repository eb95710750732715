"""``tsm-ds bench multigrid``, the library half: the same top-1 for less compute?

Multigrid training (Wu, Girshick, He, Feichtenhofer, Krahenbuhl, "A Multigrid Method for Efficiently
Training Video Models", CVPR 2020; PySlowFast ``slowfast/utils/multigrid.py``) trains on smaller clip
shapes at larger batches for most of the run and reports SlowFast-R50 on Kinetics-400 at equal top-1
in 4.5x less wall time. This study measures it on the large-batch study's task (the motion demo data
at preset ``hard``, TSM-ResNet-18 T=4 at 32 px, world size 1, one thread): the base recipe (SGD,
stepwise lr) against the same recipe with the long-cycle schedule (``tsm_ds.train --multigrid long``)
at equal epochs and at 1.5x epochs, 2 seeds each, every run evaluated at the base shape after precise
BatchNorm statistics, training time measured with the evaluations apart.

Modules: :mod:`.plan` (settings, runs, commands, the per-step cost, the estimate), :mod:`.report` (the
timeline, time to accuracy, seconds per shape, verdicts, tables), :mod:`.study` (:func:`run_study`).
The task, its data, a run's command, process and read-back, and the pass rule are the large-batch
study's (:mod:`tsm_ds.experiments.large_batch`), imported. The command line is
:mod:`tsm_ds.cli.bench_multigrid`.
"""
from __future__ import annotations

from .plan import QUICK, Arm, MGSettings, arms, estimate_seconds, estimate_text, step_costs, train_command
from .report import SPEED_GOAL, run_metrics, timeline, verdicts
from .study import publish, run_study, write_report

__all__ = ["QUICK", "Arm", "MGSettings", "arms", "estimate_seconds", "estimate_text", "step_costs", "train_command",
           "SPEED_GOAL", "run_metrics", "timeline", "verdicts", "publish", "run_study", "write_report"]
