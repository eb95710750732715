"""``tsm-ds bench scale``: the analytic scaling model, TSM against I3D (:mod:`tsm_ds.bench.scaling`).

Writes ``scale.json``, ``scale.md`` and ``scaling.png`` and prints the calibration and the
prediction with its error against the paper. Options: :data:`tsm_ds.config.tools.BENCH_SCALE`
(section ``bench_scale``: every model input can be overridden; ``--epochs``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_SCALE, BenchScaleConfig

#: the fields this command uses
COMMAND = BENCH_SCALE


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tsm-ds bench scale`` (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def _check(b: BenchScaleConfig, epochs: int) -> None:
    """Refuse out-of-range values (argparse checks only types).

    Args:
        b: the ``bench_scale`` section; epochs: ``schedule.epochs``.

    Raises:
        SystemExit: with the message, as argparse does.
    """
    values = {**dataclasses.asdict(b), "epochs": epochs}
    for name in ("gpus", "calib_gpus", "dataset_size", "epochs", "batch_per_gpu", "frames", "max_gpus"):
        if values[name] < 1:
            raise SystemExit(f"tsm-ds bench scale: --{name.replace('_', '-')} must be >= 1")
    for name in ("bytes_per_element", "bytes_per_frame", "calib_time_s"):
        if values[name] <= 0:
            raise SystemExit(f"tsm-ds bench scale: --{name.replace('_', '-')} must be > 0")
    if not 0.0 <= b.overlap <= 1.0:
        raise SystemExit("tsm-ds bench scale: --overlap must be within [0, 1]")


def main(argv: list[str] | None = None) -> int:
    """``tsm-ds bench scale``: write ``scale.json``, ``scale.md`` and ``scaling.png``; print the
    prediction. Returns 0, or 2 on a calibration that cannot be solved.

    Raises:
        SystemExit: bad options (argparse, :func:`_check`).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    b = cfg.bench_scale
    _check(b, cfg.schedule.epochs)
    from tsm_ds.bench.scaling import format_duration, write_scale_report
    from tsm_ds.bench.scaling.scale_report import TARGET_S as PAPER_TIME_S

    options = dataclasses.asdict(b)
    out_dir = options.pop("out_dir")
    plot = options.pop("plot")
    options.pop("quick")
    try:
        rep = write_scale_report(out_dir, plot=plot, epochs=cfg.schedule.epochs, **options)
    except ValueError as e:
        print(f"tsm-ds bench scale: {e}", file=sys.stderr)
        return 2
    res, p, d = rep.result, rep.result.prediction, rep.result.tsm_vs_i3d
    print(f"calibrated: {res.calibration['ref_clips_per_s_per_gpu']:.2f} training clips/s per "
          f"{rep.calib_cluster.name} GPU ({res.calibration['ref_compute_s_per_step'] * 1e3:.1f} ms per step "
          f"of {rep.ref.batch_per_gpu} clips; x{rep.cluster.compute_speedup:g} on {rep.cluster.name})")
    line = f"predicted {b.gpus} GPUs: {format_duration(p['train_time_s'])} ({p['train_time_s']:.0f} s)"
    if "error_pct" in p:
        line += f"; paper {p['paper_time']} -> error {p['error_pct']:+.1f} %"
    print(line)
    print(f"I3D at {d['gpus']} GPUs: {format_duration(d['i3d_time_s'])} ({d['i3d_over_tsm_time']:.2f}x TSM); "
          f"efficiency TSM {100 * d['tsm_efficiency']:.1f} % / I3D {100 * d['i3d_efficiency']:.1f} %")
    for r in res.multigrid:
        if "error" not in r:
            a = r["at_gpus"]
            print(f"multigrid long cycle x{r['epoch_factor']:g} epochs at {b.gpus} GPUs: {a['train_time']} "
                  f"({a['step_factor']:.3f}x the optimizer steps); {r['gpus_for_target'] or 'no count of'} GPUs reach "
                  f"{format_duration(PAPER_TIME_S)} (without it {r['base_gpus_for_target']})")
    print(f"wrote {rep.json_path}, {rep.md_path}" + (f", {rep.png}" if rep.png else ""))
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
