"""``tsm-ds bench scale``: the analytic scaling model, TSM against I3D (:mod:`tsm_ds.bench.scaling`).

Writes ``scale.json``, ``scale.md`` and ``scaling.png`` and prints the calibration and the
prediction with its error against the paper.
"""
from __future__ import annotations

import argparse
import sys

from tsm_ds.bench.scaling.presets import CLUSTERS, PAPER


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``tsm-ds bench scale`` (every model input can be overridden)."""
    ap = argparse.ArgumentParser(prog="tsm-ds bench scale", description=(
        "Analytic scaling model: calibrated on the paper's single-node time, predicts the "
        "1,536-GPU time with its error, TSM vs I3D, what-ifs. Writes scale.json, scale.md, "
        "scaling.png."))
    ap.add_argument("--out-dir", "--out", dest="out_dir", default="bench_out", help="output folder (default %(default)s)")
    ap.add_argument("--from-bench", metavar="DIR", default=None,
                    help="read models.json / data.json from DIR (default: --out-dir) for parameters, "
                         "the measured TSM/I3D ratio and decode speed; missing files are fine")
    ap.add_argument("--cluster", choices=sorted(CLUSTERS), default="summit",
                    help="hardware preset of the prediction (default %(default)s)")
    ap.add_argument("--calib-cluster", choices=sorted(CLUSTERS), default="summit",
                    help="hardware the calibration time was measured on (default %(default)s: "
                         "the paper's single node)")
    ap.add_argument("--gpus", type=int, default=PAPER["large_scale_gpus"], help="GPUs to predict")
    ap.add_argument("--gpus-per-node", type=int, default=None)
    ap.add_argument("--calib-gpus", type=int, default=PAPER["single_node_gpus"])
    ap.add_argument("--calib-time-s", type=float, default=PAPER["single_node_time_s"],
                    help="measured training time at --calib-gpus (default: paper's 49 h 55 min)")
    ap.add_argument("--gpu-throughput", type=float, default=None, metavar="CLIPS_PER_S",
                    help="given training throughput of TSM-R50 8f per GPU of --cluster (clips/s) "
                         "instead of the calibration time")
    ap.add_argument("--inter-bandwidth", type=float, default=None, metavar="GB_PER_S",
                    help="network bytes/s per node in GB/s (Summit 23)")
    ap.add_argument("--intra-bandwidth", type=float, default=None, metavar="GB_PER_S",
                    help="NVLink ring bandwidth per GPU in GB/s (Summit 50)")
    ap.add_argument("--latency-us", type=float, default=None, help="inter-node alpha per ring hop (us)")
    ap.add_argument("--dataset-size", type=int, default=PAPER["dataset_size"])
    ap.add_argument("--epochs", type=int, default=PAPER["epochs"])
    ap.add_argument("--batch-per-gpu", type=int, default=PAPER["batch_per_gpu"])
    ap.add_argument("--frames", type=int, default=8, help="TSM frames per clip (compute scales with T)")
    ap.add_argument("--bytes-per-element", type=float, default=4.0, help="gradient bytes on the wire")
    ap.add_argument("--overlap", type=float, default=0.0, help="fraction of all-reduce hidden (0..1)")
    ap.add_argument("--bytes-per-frame", type=float, default=20_000.0, help="stored bytes per frame")
    ap.add_argument("--decode-fps-per-core", type=float, default=None,
                    help="frames/s one CPU core decodes+augments (default 200, or data.json)")
    ap.add_argument("--i3d-ratio", type=float, default=None,
                    help="I3D-R50 32f compute per clip relative to TSM (default: paper's 1.8)")
    ap.add_argument("--i3d-params", type=int, default=None)
    ap.add_argument("--tsm-params", type=int, default=None)
    ap.add_argument("--max-gpus", type=int, default=3072, help="end of the scaling curve")
    ap.add_argument("--no-plot", action="store_true", help="skip scaling.png")
    ap.add_argument("--quick", action="store_true", help="accepted for 'bench all' (the model is instant)")
    return ap


def _check(args: argparse.Namespace) -> None:
    """Refuse out-of-range values (argparse checks only types).

    Raises:
        SystemExit: with the message, as argparse does.
    """
    for name in ("gpus", "calib_gpus", "dataset_size", "epochs", "batch_per_gpu", "frames", "max_gpus"):
        if getattr(args, name) < 1:
            raise SystemExit(f"tsm-ds bench scale: --{name.replace('_', '-')} must be >= 1")
    for name in ("bytes_per_element", "bytes_per_frame", "calib_time_s"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"tsm-ds bench scale: --{name.replace('_', '-')} must be > 0")
    if not 0.0 <= args.overlap <= 1.0:
        raise SystemExit("tsm-ds bench scale: --overlap must be within [0, 1]")


def main(argv: list[str] | None = None) -> int:
    """``tsm-ds bench scale``: write ``scale.json``, ``scale.md`` and ``scaling.png``; print the
    prediction. Returns 0, or 2 on a calibration that cannot be solved.

    Raises:
        SystemExit: bad options (argparse, :func:`_check`).
    """
    args = build_parser().parse_args(argv)
    _check(args)
    from tsm_ds.bench.scaling import format_duration, write_scale_report

    options = vars(args).copy()
    out_dir, no_plot = options.pop("out_dir"), options.pop("no_plot")
    options.pop("quick")
    try:
        rep = write_scale_report(out_dir, plot=not no_plot, **options)
    except ValueError as e:
        print(f"tsm-ds bench scale: {e}", file=sys.stderr)
        return 2
    res, p, d = rep.result, rep.result.prediction, rep.result.tsm_vs_i3d
    print(f"calibrated: {res.calibration['ref_clips_per_s_per_gpu']:.2f} training clips/s per "
          f"{rep.calib_cluster.name} GPU ({res.calibration['ref_compute_s_per_step'] * 1e3:.1f} ms per step "
          f"of {rep.ref.batch_per_gpu} clips; x{rep.cluster.compute_speedup:g} on {rep.cluster.name})")
    line = f"predicted {args.gpus} GPUs: {format_duration(p['train_time_s'])} ({p['train_time_s']:.0f} s)"
    if "error_pct" in p:
        line += f"; paper {p['paper_time']} -> error {p['error_pct']:+.1f} %"
    print(line)
    print(f"I3D at {d['gpus']} GPUs: {format_duration(d['i3d_time_s'])} ({d['i3d_over_tsm_time']:.2f}x TSM); "
          f"efficiency TSM {100 * d['tsm_efficiency']:.1f} % / I3D {100 * d['i3d_efficiency']:.1f} %")
    print(f"wrote {rep.json_path}, {rep.md_path}" + (f", {rep.png}" if rep.png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
