"""The scaling model's report: numbers taken from the other benches' JSON (:func:`bench_inputs`),
the markdown text (:func:`markdown_report`), and the whole ``bench scale`` run from plain arguments
(:func:`write_scale_report`: ``scale.json``, ``scale.md``, ``scaling.png``).
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tsm_ds.bench.scaling.model import (
    ScalingResult,
    data_loading_time,
    format_duration,
    gpu_counts,
    run_model,
    step_breakdown,
    steps_per_epoch,
)
from tsm_ds.bench.scaling.presets import CLUSTERS, GB, MODELS, PAPER, Cluster, Workload
from tsm_ds.utils.io import append_markdown, markdown_table, read_report, write_report

#: the time the multigrid section asks the GPU count for: the paper's 1,536-GPU time (14 min 13 s)
TARGET_S = PAPER["large_scale_time_s"]

__all__ = ["bench_inputs", "markdown_report", "ScaleReport", "write_scale_report"]

# --------------------------------------------------------------------------------------------
# Inputs from the other benchmarks
# --------------------------------------------------------------------------------------------
def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _find_row(rows: list[dict[str, Any]], family: str, frames: int) -> dict[str, Any] | None:
    for row in rows:
        name = str(row.get("model") or row.get("name") or row.get("arch") or "").lower()
        t = row.get("frames", row.get("num_segments"))
        if family in name and (t == frames or (t is None and f"{frames}f" in name)) \
                and (family != "tsm" or "50" in name):
            return row
    return None


def bench_inputs(bench_dir: str | os.PathLike) -> dict[str, Any]:
    """Numbers the scaling model can take from the other benches' JSON files in ``bench_dir``.

    ``models.json`` (``tsm-ds bench models``): rows ``model`` ("TSM-R50", "I3D-R50-32f"),
    ``frames``, ``grad_MB_fp32`` (or ``params_M`` / ``params``), ``train_clips_per_s``,
    ``GMACs_per_clip``. Gradient elements of TSM-R50 8f and I3D-R50 32f, and their training
    throughput and multiply-add ratios measured on the machine that ran the bench.
    ``comm.json`` (``tsm-ds bench comm``): the 1-bit row's ``bytes_ratio_vs_fp32``.
    ``data.json`` (``tsm-ds bench data``): the ``tsm_ds`` loader's ``clips_per_s`` on the real
    clips (8 frames per clip, one decoding thread) x 8 = sampled frames decoded per second per core.
    Missing or unreadable files give fewer keys; nothing here raises.

    Returns:
        {"tsm_params", "i3d_params", "i3d_compute_ratio_measured", "i3d_macs_ratio",
        "onebit_ratio", "decode_fps_per_core", "notes": [str]} with the keys that were found.
    """
    bench_dir = Path(bench_dir)
    found: dict[str, Any] = {"notes": []}
    models = read_report(bench_dir / "models.json")
    rows = [r for r in (models or {}).get("rows", []) if isinstance(r, dict)]
    tsm_row, i3d_row = _find_row(rows, "tsm", 8), _find_row(rows, "i3d", 32)
    for key, row in (("tsm", tsm_row), ("i3d", i3d_row)):
        if row is None:
            continue
        if _num(row.get("grad_MB_fp32")):
            found[f"{key}_params"] = int(round(row["grad_MB_fp32"] * 1e6 / 4))
        elif _num(row.get("params_M")):
            found[f"{key}_params"] = int(round(row["params_M"] * 1e6))
        elif _num(row.get("params")):
            found[f"{key}_params"] = int(row["params"])
    if tsm_row is not None and i3d_row is not None:
        a, b = _num(tsm_row.get("train_clips_per_s")), _num(i3d_row.get("train_clips_per_s"))
        if a and b:
            found["i3d_compute_ratio_measured"] = a / b
            found["notes"].append(
                f"models.json: TSM/I3D-32f training throughput {a / b:.2f}x here "
                f"({tsm_row.get('img_size', '?')} px, batch {tsm_row.get('batch', '?')})")
        a, b = _num(tsm_row.get("GMACs_per_clip")), _num(i3d_row.get("GMACs_per_clip"))
        if a and b:
            found["i3d_macs_ratio"] = b / a
            found["notes"].append(f"models.json: I3D-32f/TSM multiply-adds per clip {b / a:.2f}x")
    comm = read_report(bench_dir / "comm.json")
    for row in (comm or {}).get("rows", []):
        if isinstance(row, dict) and row.get("method") == "onebit" and _num(row.get("bytes_ratio_vs_fp32")):
            found["onebit_ratio"] = float(row["bytes_ratio_vs_fp32"])
            found["notes"].append(f"comm.json: 1-bit sends {found['onebit_ratio']:.1f}x fewer bytes than fp32 "
                                  f"(world size {(comm.get('meta') or {}).get('world_size', '?')})")
    data = read_report(bench_dir / "data.json")
    drows = [r for r in (data or {}).get("rows", []) if isinstance(r, dict)]
    # our loader on the real clips: clips/s with one decoding thread x frames per clip
    frames = 8
    for row in drows:
        v = _num(row.get("frames_per_s_per_core") or row.get("decode_fps_per_core"))
        if not v and row.get("loader") == "tsm_ds" and str(row.get("input", "")).startswith("real") \
                and _num(row.get("clips_per_s")):
            v = row["clips_per_s"] * frames
        if v:
            found["decode_fps_per_core"] = v
            found["notes"].append(f"data.json: {v:.0f} sampled frames/s per core ({row.get('loader', '?')} "
                                  f"on {row.get('input', '?')}, 1 thread, this CPU)")
            break
    return found


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
def markdown_report(res: ScalingResult, batch_per_gpu: int) -> str:
    """The readable ``scale.md``: calibration, prediction (and its error against the paper), TSM
    vs I3D, what-ifs, sensitivity, the scaling curve and the assumptions, as markdown text.

    Args:
        res: what :func:`~tsm_ds.bench.scaling.model.run_model` returned (``assumptions`` filled).
        batch_per_gpu: clips per GPU per step of the calibration (quoted with the fitted compute).
    """
    p, c, d = res.prediction, res.calibration, res.tsm_vs_i3d
    lines = ["## Scaling model", "",
             "step = max(data loading, compute + (1 - overlap) x all-reduce); ring all-reduce "
             "2(n-1)/n x bytes / bandwidth + 2(n-1) x alpha, hierarchical across nodes. "
             f"Calibrated ONLY on {c['gpus']} GPUs = {format_duration(c['paper_time_s'])} (paper).", "",
             "### Calibration", "",
             f"- model time on {c['gpus']} GPUs: {c['model_time_s']:.1f} s (paper {c['paper_time_s']} s, "
             "equal by construction)",
             f"- fitted compute per step (batch {batch_per_gpu}/GPU): {c['ref_compute_s_per_step'] * 1e3:.1f} ms"
             f" = {c['ref_clips_per_s_per_gpu']:.2f} training clips/s per GPU",
             f"- all-reduce per step on one node: {c['comm_s_per_step'] * 1e3:.2f} ms; data loading "
             f"{c['load_s_per_step'] * 1e3:.1f} ms (hidden behind compute)", "",
             "### Prediction", ""]
    lines.append(f"- {p['gpus']} GPUs: **{p['train_time']}** ({p['train_time_s']:.0f} s); step "
                 f"{p['step_s'] * 1e3:.1f} ms = compute {p['compute_s'] * 1e3:.1f} + exposed all-reduce "
                 f"{p['comm_exposed_s'] * 1e3:.2f} ms (intra {p['comm_intra_s'] * 1e3:.2f}, inter "
                 f"{p['comm_inter_s'] * 1e3:.2f}); loading {p['load_s'] * 1e3:.1f} ms; "
                 f"{p['steps_per_epoch']} steps/epoch")
    if "error_pct" in p:
        lines.append(f"- paper: {p['paper_time']} ({p['paper_time_s']} s) -> prediction error "
                     f"**{p['error_pct']:+.1f} %**; a fixed cost of {p['residual_per_epoch_s']:.2f} s per "
                     "epoch (not in the model, invisible at one node) would account for the rest")
    lines.append(f"- speedup {p['speedup_vs_calibration']:.1f}x on {p['gpus'] // c['gpus']}x the GPUs, "
                 f"scaling efficiency {100 * p['efficiency']:.1f} %")
    lines += ["", "### TSM vs I3D", "",
              f"- at {d['gpus']} GPUs: TSM {format_duration(d['tsm_time_s'])}, I3D "
              f"{format_duration(d['i3d_time_s'])} ({d['i3d_over_tsm_time']:.2f}x); scaling efficiency "
              f"TSM {100 * d['tsm_efficiency']:.1f} % vs I3D {100 * d['i3d_efficiency']:.1f} %",
              f"- gradient bytes/step: TSM {d['tsm_grad_bytes'] / 1e6:.1f} MB, I3D "
              f"{d['i3d_grad_bytes'] / 1e6:.1f} MB; exposed all-reduce share of the step: TSM "
              f"{100 * d['tsm_comm_share']:.2f} %, I3D {100 * d['i3d_comm_share']:.2f} %; loading per step "
              f"TSM {d['tsm_load_s'] * 1e3:.1f} ms, I3D {d['i3d_load_s'] * 1e3:.1f} ms", "",
              "### What-ifs", "",
              markdown_table(res.whatifs, ["what_if", "model", "cluster", "gpus", "train_time",
                                           "train_time_s", "efficiency", "step_s", "comm_exposed_s", "load_s",
                                           "grad_bytes", "bound"]),
              *(["### Sensitivity of the prediction (each variant re-calibrated on one node)", "",
                 markdown_table(res.sensitivity)] if res.sensitivity else []),
              "### Scaling curve", "",
              markdown_table(res.curve, ["model", "gpus", "nodes", "step_s", "compute_s", "comm_exposed_s",
                                         "load_s", "bound", "train_time_s", "ideal_time_s", "efficiency"]),
              *multigrid_lines(res.multigrid, p["gpus"]),
              "### Assumptions", ""]
    lines += [f"- {k}: {v}" for k, v in res.assumptions.items()]
    return "\n".join(lines) + "\n"


def multigrid_lines(rows: list[dict[str, Any]], gpus: int) -> list[str]:
    """The report's "With the multigrid schedule" section (:func:`~tsm_ds.bench.scaling.multigrid.multigrid_summary`
    rows; [] without them)."""
    if not rows:
        return []
    out = ["### With the multigrid schedule (long cycle, the official 50-epoch recipe's lr steps 20 and 40)", "",
           "Each step of a shape costs the base step's compute times its clips x frames x pixels over the base's, "
           "the same all-reduce, and the loading of its frames; the time is the sum over the schedule's steps. "
           "Accuracy at the schedule's batches is not modelled.", ""]
    for r in rows:
        if "error" in r:
            out.append(f"- epoch factor {r['epoch_factor']:g}: {r['error']}")
            continue
        a = r["at_gpus"]
        reach = (f"{r['gpus_for_target']} GPUs reach {format_duration(TARGET_S)} "
                 f"({format_duration(r['time_for_target_s'])})" if r["gpus_for_target"] else
                 f"no GPU count up to the curve's end reaches {format_duration(TARGET_S)}")
        out.append(f"- epoch factor {r['epoch_factor']:g}: {gpus} GPUs **{a['train_time']}** "
                   f"({a['train_time_s']:.0f} s, {a['speedup']:.2f}x faster than without): {a['steps']} optimizer "
                   f"steps against {a['base_steps']} "
                   f"(x{a['step_factor']:.3f}), {a['epochs']} epochs, steps of up to {a['max_global_batch']:,} clips "
                   f"({a['dropped_per_epoch_max']:,} clips of an epoch fill no step at the largest); {reach}; "
                   f"without the schedule {r['base_gpus_for_target']} GPUs by the same model")
    return out + [""]


@dataclass
class ScaleReport:
    """What :func:`write_scale_report` computed and wrote.

    Attributes:
        result: the model's output (calibration, prediction, curve, what-ifs, assumptions).
        cluster: hardware of the prediction (a preset, with overrides: name ends in ``*``).
        calib_cluster: hardware the calibration time was measured on.
        ref: the calibration workload (always TSM-R50 8f).
        tsm, i3d: the predicted workloads.
        json_path, md_path: ``scale.json`` / ``scale.md``.
        png: ``scaling.png``, or None (not asked for, or nothing to plot).
    """

    result: ScalingResult
    cluster: Cluster
    calib_cluster: Cluster
    ref: Workload
    tsm: Workload
    i3d: Workload
    json_path: Path
    md_path: Path
    png: Path | None = None


def write_scale_report(out_dir: str | os.PathLike, *, from_bench: str | os.PathLike | None = None,
                       cluster: str = "summit", calib_cluster: str = "summit",
                       gpus: int = PAPER["large_scale_gpus"], gpus_per_node: int | None = None,
                       calib_gpus: int = PAPER["single_node_gpus"],
                       calib_time_s: float = PAPER["single_node_time_s"],
                       gpu_throughput: float | None = None, inter_bandwidth: float | None = None,
                       intra_bandwidth: float | None = None, latency_us: float | None = None,
                       dataset_size: int = PAPER["dataset_size"], epochs: int = PAPER["epochs"],
                       batch_per_gpu: int = PAPER["batch_per_gpu"], frames: int = 8,
                       bytes_per_element: float = 4.0, overlap: float = 0.0,
                       bytes_per_frame: float = 20_000.0, decode_fps_per_core: float | None = None,
                       i3d_ratio: float | None = None, i3d_params: int | None = None,
                       tsm_params: int | None = None, max_gpus: int = 3072,
                       plot: bool = True) -> ScaleReport:
    """Run the scaling model (``tsm-ds bench scale``) and write ``scale.json``, ``scale.md`` and
    (``plot``) ``scaling.png`` into ``out_dir``.

    Calibrates TSM-R50 8f on ``calib_gpus`` GPUs of ``calib_cluster`` taking ``calib_time_s``
    (or the time implied by ``gpu_throughput`` clips/s per GPU of ``cluster``), then predicts
    ``gpus`` GPUs of ``cluster``: TSM with ``frames`` frames against I3D-R50 32f, the scaling curve
    up to ``max_gpus`` and the what-ifs. Parameters, the measured TSM/I3D ratio, the 1-bit ratio
    and the decode rate come from the other benches' JSON in ``from_bench`` (default ``out_dir``)
    when present (:func:`bench_inputs`); a decode rate that would make the calibration node
    data-bound is not used. The paper's 1,536-GPU time is compared only for its own setting
    (1,536 GPUs, 8 frames, Summit).

    Args:
        out_dir: output folder (created).
        cluster, calib_cluster: preset names of :data:`~tsm_ds.bench.scaling.presets.CLUSTERS`.
        gpus_per_node, inter_bandwidth, intra_bandwidth, latency_us: overrides of ``cluster``
            (bandwidths in GB/s per node / per GPU; latency: inter-node alpha per hop in us).
        dataset_size, epochs, batch_per_gpu, bytes_per_element, overlap, bytes_per_frame,
        decode_fps_per_core: workload fields (:class:`~tsm_ds.bench.scaling.presets.Workload`).
        i3d_ratio: I3D compute per clip relative to TSM (default: the paper's 1.8x).
        i3d_params, tsm_params: gradient elements (default: from models.json, else the presets).

    Returns:
        :class:`ScaleReport`.

    Raises:
        ValueError: an unknown cluster preset, or a calibration that cannot be solved (no time
            left for compute, or a data-bound calibration node).
        OSError: ``out_dir`` is not writable.
    """
    for name in (cluster, calib_cluster):
        if name not in CLUSTERS:
            raise ValueError(f"unknown cluster {name!r}; choose from {sorted(CLUSTERS)}")
    out = Path(out_dir)
    found = bench_inputs(Path(from_bench) if from_bench else out)

    hw = CLUSTERS[cluster]
    over: dict[str, Any] = {}
    if gpus_per_node:
        over["gpus_per_node"] = gpus_per_node
    if inter_bandwidth:
        over["inter_bw"] = inter_bandwidth * GB
    if intra_bandwidth:
        over["intra_bw"] = intra_bandwidth * GB
    if latency_us is not None:
        over["inter_latency"] = latency_us * 1e-6
    if over:
        hw = replace(hw, name=hw.name + "*", **over)
    calib_hw = hw if calib_cluster == cluster else CLUSTERS[calib_cluster]

    decode = decode_fps_per_core or found.get("decode_fps_per_core") or 200.0
    if decode_fps_per_core is None and "decode_fps_per_core" in found:
        # a rate measured on a busy 2-core CPU must not make the paper's node data-bound (its
        # authors report an 8-frame model is not: temporal-shift-module issue #28)
        probe = Workload(label="probe", params=1, frames=8, compute_ratio=1.0, batch_per_gpu=batch_per_gpu,
                         decode_fps_per_core=decode, bytes_per_frame=bytes_per_frame)
        need = calib_time_s / (epochs * steps_per_epoch(replace(probe, dataset_size=dataset_size), calib_gpus))
        if data_loading_time(probe, CLUSTERS[calib_cluster], calib_gpus)["total_s"] > need:
            found["notes"].append(f"data.json decode rate {decode:.0f} frames/s/core not used: it would make "
                                  "the calibration node data-bound")
            decode = 200.0
            del found["decode_fps_per_core"]
    common = dict(dataset_size=dataset_size, epochs=epochs, batch_per_gpu=batch_per_gpu,
                  bytes_per_element=bytes_per_element, overlap=overlap,
                  bytes_per_frame=bytes_per_frame, decode_fps_per_core=decode)
    tsm_params = tsm_params or found.get("tsm_params") or MODELS["tsm"]["params"]
    i3d_params_used = i3d_params or found.get("i3d_params") or MODELS["i3d"]["params"]
    i3d_ratio_used = i3d_ratio or MODELS["i3d"]["compute_ratio"]
    # the calibration workload is always TSM-R50 8f; ``frames`` changes the predicted one
    ref = Workload(label="TSM-R50 8f", params=tsm_params, frames=8, compute_ratio=1.0, **common)
    tsm = replace(ref, label=f"TSM-R50 {frames}f", frames=frames, compute_ratio=frames / 8)
    i3d = Workload(label="I3D-R50 32f", params=i3d_params_used, frames=32, compute_ratio=i3d_ratio_used,
                   **common)

    paper_time = PAPER["large_scale_time_s"] if (
        gpus == PAPER["large_scale_gpus"] and frames == 8 and cluster == "summit") else None
    counts = gpu_counts(calib_gpus, max(max_gpus, gpus), hw.gpus_per_node)
    if gpus not in counts:
        counts = sorted(set(counts) | {gpus})
    if gpu_throughput:
        # given throughput: the calibration time it implies (run_model fits it back exactly)
        ref_compute = ref.batch_per_gpu / gpu_throughput * hw.compute_speedup
        calib_time = step_breakdown(ref, calib_hw, calib_gpus, ref_compute)["train_time_s"]
    else:
        calib_time = calib_time_s
    macs = found.get("i3d_macs_ratio", MODELS["i3d"]["gmacs"] / MODELS["tsm"]["gmacs"])
    extra = [(f"I3D compute by multiply-adds ({macs:.2f}x)", replace(i3d, compute_ratio=macs))]
    if "i3d_compute_ratio_measured" in found:
        m = found["i3d_compute_ratio_measured"]
        extra.append((f"I3D compute by this machine's measured ratio ({m:.2f}x)",
                      replace(i3d, compute_ratio=m)))
    res = run_model(tsm, i3d, hw, counts=counts, calib_gpus=calib_gpus,
                    calib_time_s=calib_time, target_gpus=gpus, paper_time_s=paper_time,
                    calib_workload=ref, extra_whatifs=extra, calib_cluster=calib_hw,
                    onebit_ratio=found.get("onebit_ratio"))

    from tsm_ds.bench.scaling.multigrid import multigrid_summary

    res.multigrid = multigrid_summary(tsm, hw, res.calibration["ref_compute_s_per_step"], gpus=gpus,
                                      target_s=TARGET_S, max_gpus=max(max_gpus, gpus))
    res.assumptions = {
        "paper": PAPER["source"] + "; 6 V100 49 h 55 min (calibration), 1,536 V100 14 min 13 s (predicted)",
        "epochs": f"{epochs} (official TSM Kinetics recipe; assumed equal at 6 and 1,536 GPUs, so "
                  "epochs cancel from the prediction except in the communication term)",
        "dataset_size": f"{dataset_size} Kinetics-400 training clips (approximate)",
        "cluster": hw.source,
        "gradient": f"TSM {tsm_params / 1e6:.2f} M / I3D {i3d_params_used / 1e6:.2f} M elements x "
                    f"{bytes_per_element:g} bytes; 25 MiB buckets"
                    + (" (parameters from models.json)" if "i3d_params" in found else
                       " (counted from build_model: TSM-R50 24.33 M, I3D-R50 28.04 M)"),
        "i3d_compute": f"{i3d_ratio_used:g}x TSM per clip ("
                       + ("--i3d-ratio" if i3d_ratio else "paper's 1.8x throughput") + ")"
                       + (f"; measured here: {found['i3d_compute_ratio_measured']:.2f}x"
                          if "i3d_compute_ratio_measured" in found else ""),
        "data": f"{bytes_per_frame:g} bytes/frame (JPEG frame folders, assumption), "
                f"{decode:g} frames/s per core" + (" (data.json)" if decode_fps_per_core is None
                                                   and "decode_fps_per_core" in found else " (assumption)"),
        "overlap": f"{overlap:g} (0 = communication not hidden behind backward)",
        "1-bit": (f"fp32 bytes / {found['onebit_ratio']:.2f} (comm.json)" if "onebit_ratio" in found else
                  "bytes/32 + one fp32 scale per 65,536 elements") + "; same 2(n-1)/n form as the ring "
                  "(all-to-all + all-gather); its fp32 warm-up stage is ignored",
        "bench_notes": "; ".join(found["notes"]) or "no bench JSON found",
    }
    meta = {"calibration": res.calibration, "prediction": res.prediction, "tsm_vs_i3d": res.tsm_vs_i3d,
            "whatifs": res.whatifs, "sensitivity": res.sensitivity, "assumptions": res.assumptions,
            "multigrid": res.multigrid,
            "cluster": dataclasses.asdict(hw),
            "workloads": {"tsm": dataclasses.asdict(tsm), "i3d": dataclasses.asdict(i3d)}}
    json_path, md_path = write_report("scale", res.curve, out, meta=meta, title="Scaling model",
                                      columns=["model", "gpus", "step_s", "train_time_s", "efficiency"])
    # write_report lists meta as bullets; replace the markdown by the readable version
    append_markdown(md_path, markdown_report(res, ref.batch_per_gpu), replace=True)
    png = None
    if plot:
        from tsm_ds.bench.plots import plot_scaling

        png = plot_scaling(json_path, out / "scaling.png")
    return ScaleReport(res, hw, calib_hw, ref, tsm, i3d, json_path, md_path, png)
