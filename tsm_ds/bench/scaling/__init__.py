"""``tsm-ds bench scale``: an analytic model of data-parallel training time, TSM against I3D.

Calibrated only on the paper's single-node time (6 V100, 49 h 55 min), it predicts the 1,536-GPU
time (paper: 14 min 13 s) with its error, compares TSM with I3D and evaluates what-ifs (network,
storage, CPU cores, gradient precision, 1-bit compression, newer GPUs). Modules:

- :mod:`~tsm_ds.bench.scaling.presets`: the paper's figures, model sizes, :class:`Cluster`
  presets (Summit, H100, H200) and :class:`Workload`, with their sources;
- :mod:`~tsm_ds.bench.scaling.model`: ring / hierarchical all-reduce, data loading, one step,
  :func:`calibrate` and :func:`run_model` (:class:`ScalingResult`);
- :mod:`~tsm_ds.bench.scaling.scale_report`: numbers taken from the other benches' JSON
  (:func:`bench_inputs`), the markdown and the whole run from plain arguments
  (:func:`write_scale_report`).

The command line is :mod:`tsm_ds.cli.bench_scale`. Every name below is importable from here
(``from tsm_ds.bench import scaling as S; S.run_model(...)``).
"""
from __future__ import annotations

from tsm_ds.bench.scaling.model import (
                                        ScalingResult,
                                        allreduce_time,
                                        calibrate,
                                        data_loading_time,
                                        format_duration,
                                        gpu_counts,
                                        gradient_bytes,
                                        ring_allreduce_time,
                                        run_model,
                                        step_breakdown,
                                        steps_per_epoch,
                                        straggler_factor,
)
from tsm_ds.bench.scaling.presets import CLUSTERS, GB, MODELS, PAPER, Cluster, Workload
from tsm_ds.bench.scaling.scale_report import ScaleReport, bench_inputs, markdown_report, write_scale_report

__all__ = ["GB", "PAPER", "MODELS", "Cluster", "CLUSTERS", "Workload",
           "ring_allreduce_time", "allreduce_time", "gradient_bytes", "data_loading_time",
           "steps_per_epoch", "straggler_factor", "step_breakdown", "calibrate", "gpu_counts",
           "format_duration", "ScalingResult", "run_model",
           "bench_inputs", "markdown_report", "ScaleReport", "write_scale_report"]
