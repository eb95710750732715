"""The analytic model of data-parallel training time: ring all-reduce, data loading, one step,
calibration on one measured point, the scaling curve and what-ifs (:func:`run_model`).

The model (one data-parallel step, every GPU the same)::

    step = max(data_loading, compute + (1 - overlap) * allreduce)
    train_time = epochs * ceil(dataset / (gpus * batch_per_gpu)) * step

- ``compute``: forward + backward + optimizer step of one micro-batch on one GPU. It is the only
  fitted quantity: solved from the paper's single-node time (one Summit node, 6 V100, 49 h 55 min)
  so that the model reproduces that figure exactly. Every other number is a hardware
  specification, a model size or a recipe value; the 1,536-GPU time is then a prediction.
- ``allreduce``: bandwidth-optimal ring all-reduce of the gradient, ``2 (n-1)/n * bytes / bw +
  2 (n-1) * alpha`` for a ring of n members (Patarasuk & Yuan 2009; Thakur et al. 2005). Across
  nodes it is hierarchical (NCCL/Horovod style): reduce-scatter inside the node over NVLink, one
  ring per local GPU across the nodes on a 1/g shard with 1/g of the node's network bandwidth, then
  all-gather inside the node. The bandwidth term across nodes is therefore ``2 (N-1)/N * bytes /
  node_bandwidth`` (N nodes), the same as a flat ring's, but the latency term is ``2 (N-1) alpha``
  instead of ``2 (nN-1) alpha``; at 1,536 GPUs that is 510 hops instead of 3,070.
- ``data_loading``: the loader is a pipeline (read -> decode/augment) running ahead of the GPU in
  worker processes, so its cost per step is the slowest stage: reading ``batch * frames *
  bytes_per_frame`` at the node's share of the storage bandwidth, or decoding ``batch * frames``
  frames on the CPU cores that serve one GPU.

Units: seconds, bytes, bytes/s. The inputs (papers' figures, cluster presets) are in
:mod:`tsm_ds.bench.scaling.presets`; reading the other benches' JSON and the markdown report in
:mod:`tsm_ds.bench.scaling.scale_report`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from tsm_ds.bench.scaling.presets import CLUSTERS, GB, PAPER, Cluster, Workload

__all__ = ["ring_allreduce_time", "allreduce_time", "gradient_bytes", "data_loading_time",
           "steps_per_epoch", "straggler_factor", "step_breakdown", "calibrate", "gpu_counts",
           "format_duration", "ScalingResult", "run_model"]

# --------------------------------------------------------------------------------------------
# Communication
# --------------------------------------------------------------------------------------------
def ring_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Time of a bandwidth-optimal ring all-reduce of ``nbytes`` among ``n`` members.

    ``2 (n-1)/n * nbytes / bandwidth + 2 (n-1) * latency``: reduce-scatter then all-gather, each
    n-1 steps moving nbytes/n per member (Patarasuk & Yuan, "Bandwidth optimal all-reduce
    algorithms for clusters of workstations", JPDC 2009).

    Args:
        n: ring members (>= 1); 1 costs nothing.
        nbytes: bytes of the buffer each member holds (>= 0).
        bandwidth: bytes/s per direction of the slowest link in the ring (> 0).
        latency: seconds per ring step (alpha, >= 0).

    Returns:
        Seconds (float).

    Raises:
        ValueError: n < 1, nbytes < 0, bandwidth <= 0 or latency < 0.
    """
    if n < 1:
        raise ValueError(f"ring_allreduce_time: n must be >= 1, got {n}")
    if nbytes < 0 or bandwidth <= 0 or latency < 0:
        raise ValueError(f"ring_allreduce_time: need nbytes >= 0, bandwidth > 0, latency >= 0; got "
                         f"nbytes={nbytes}, bandwidth={bandwidth}, latency={latency}")
    if n == 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bandwidth + 2.0 * (n - 1) * latency


def allreduce_time(gpus: int, nbytes: float, cluster: Cluster, *, buckets: int = 1) -> dict[str, float]:
    """Hierarchical all-reduce time of ``nbytes`` per GPU over ``gpus`` GPUs of ``cluster``.

    Inside a node: ring reduce-scatter + all-gather over NVLink among min(gpus, g) GPUs. Across N
    nodes: each of the g local GPUs runs a ring over the N nodes on its 1/g shard using 1/g of the
    node's injection bandwidth, i.e. ``ring_allreduce_time(N, nbytes/g, inter_bw/g)`` whose
    bandwidth term equals a flat ring's ``2 (N-1)/N * nbytes / inter_bw``. Latency terms are paid
    once per gradient bucket.

    Args:
        gpus: world size (>= 1). Partial nodes count as full nodes for the inter-node ring.
        nbytes: gradient bytes per GPU per step.
        cluster: hardware.
        buckets: all-reduce calls per step (>= 1).

    Returns:
        {"intra_s", "inter_s", "total_s"} in seconds.

    Raises:
        ValueError: gpus < 1 or buckets < 1.
    """
    if gpus < 1 or buckets < 1:
        raise ValueError(f"allreduce_time: gpus and buckets must be >= 1, got {gpus}, {buckets}")
    g = min(gpus, cluster.gpus_per_node)
    nodes = math.ceil(gpus / cluster.gpus_per_node)
    # bandwidth part once for the whole buffer, latency part once per bucket
    intra = ring_allreduce_time(g, nbytes, cluster.intra_bw) + \
        (2.0 * (g - 1) * cluster.intra_latency * buckets if g > 1 else 0.0)
    inter = 0.0
    if nodes > 1:
        inter = ring_allreduce_time(nodes, nbytes / g, cluster.inter_bw / g) + \
            2.0 * (nodes - 1) * cluster.inter_latency * buckets
    return {"intra_s": intra, "inter_s": inter, "total_s": intra + inter}


def gradient_bytes(w: Workload, gpus: int) -> float:
    """Bytes each GPU puts into the all-reduce per step: params * bytes/element / compression +
    overhead (the overhead is per step, e.g. 1-bit scales)."""
    return w.params * w.bytes_per_element / w.compression + w.compression_overhead_bytes


# --------------------------------------------------------------------------------------------
# Data loading, step time, training time
# --------------------------------------------------------------------------------------------
def data_loading_time(w: Workload, cluster: Cluster, gpus: int) -> dict[str, float]:
    """Seconds per step the input pipeline of one GPU needs (its slowest stage).

    read: ``batch * frames * bytes_per_frame`` per GPU at the node's share of the storage
    bandwidth ``min(storage_bw_node, storage_bw_total / nodes) / gpus_on_node``.
    decode: ``batch * frames`` frames on ``cpu_cores_per_gpu`` cores at ``decode_fps_per_core``.

    Returns:
        {"read_s", "decode_s", "total_s"} (total = max of the two: the stages are pipelined).
    """
    nodes = math.ceil(gpus / cluster.gpus_per_node)
    per_node = min(gpus, cluster.gpus_per_node)
    node_bw = min(cluster.storage_bw_node, cluster.storage_bw_total / nodes)
    frames = w.batch_per_gpu * w.frames
    read = frames * w.bytes_per_frame * per_node / node_bw
    decode = frames / (w.decode_fps_per_core * cluster.cpu_cores_per_gpu)
    return {"read_s": read, "decode_s": decode, "total_s": max(read, decode)}


def steps_per_epoch(w: Workload, gpus: int) -> int:
    """ceil(dataset / (gpus * batch)): DistributedSampler pads the last step (drop_last=False)."""
    return math.ceil(w.dataset_size / (gpus * w.batch_per_gpu))


def straggler_factor(cv: float, gpus: int) -> float:
    """``1 + cv * sqrt(2 ln n)``: expected slowest-of-n compute time over the mean (1.0 for n = 1
    or cv = 0). Asymptotic maximum of n i.i.d. normal variables (Gumbel limit)."""
    return 1.0 + cv * math.sqrt(2.0 * math.log(gpus)) if gpus > 1 else 1.0


def step_breakdown(w: Workload, cluster: Cluster, gpus: int, ref_compute_s: float) -> dict[str, Any]:
    """One step of ``w`` on ``gpus`` GPUs of ``cluster``.

    Args:
        ref_compute_s: seconds per step of the reference workload (TSM-R50 8f, same batch per
            GPU) on the calibration GPU; scaled here by ``w.compute_ratio / cluster.compute_speedup``.

    Returns:
        dict with compute_s, comm_s (full all-reduce), comm_exposed_s, load_s, step_s, bound
        ("data" or "compute+comm"), steps_per_epoch, train_time_s.
    """
    compute = ref_compute_s * w.compute_ratio / cluster.compute_speedup * \
        straggler_factor(w.step_jitter_cv, gpus)
    nbytes = gradient_bytes(w, gpus)
    buckets = max(1, math.ceil(nbytes / w.bucket_bytes))
    comm = allreduce_time(gpus, nbytes, cluster, buckets=buckets)
    exposed = (1.0 - w.overlap) * comm["total_s"]
    load = data_loading_time(w, cluster, gpus)
    busy = compute + exposed
    step = max(load["total_s"], busy)
    spe = steps_per_epoch(w, gpus)
    return {
        "model": w.label, "cluster": cluster.name, "gpus": gpus,
        "nodes": math.ceil(gpus / cluster.gpus_per_node),
        "compute_s": compute, "comm_s": comm["total_s"], "comm_intra_s": comm["intra_s"],
        "comm_inter_s": comm["inter_s"], "comm_exposed_s": exposed,
        "load_s": load["total_s"], "load_read_s": load["read_s"], "load_decode_s": load["decode_s"],
        "step_s": step, "bound": "data" if load["total_s"] > busy else "compute+comm",
        "grad_bytes": nbytes, "steps_per_epoch": spe,
        "train_time_s": w.epochs * spe * step,
    }


def calibrate(w: Workload, cluster: Cluster, *, gpus: int, time_s: float) -> float:
    """Solve the reference compute time per step so that ``w`` on ``gpus`` GPUs takes ``time_s``.

    Inverts ``time_s = epochs * steps_per_epoch * (compute + exposed_comm)``; by construction
    ``step_breakdown(w, cluster, gpus, result)["train_time_s"] == time_s`` (up to rounding).

    Returns:
        Seconds per step of the reference workload on the calibration GPU (compute_speedup = 1).

    Raises:
        ValueError: the measured time is too short for the communication alone, or the model
            says the run was data-bound (then compute cannot be identified from the time).
    """
    probe = step_breakdown(w, cluster, gpus, 0.0)
    step = time_s / (w.epochs * probe["steps_per_epoch"])
    compute = step - probe["comm_exposed_s"]
    if compute <= 0:
        raise ValueError(f"calibrate: {time_s:.0f} s on {gpus} GPUs leaves no time for compute "
                         f"(exposed communication {probe['comm_exposed_s']:.3g} s per step); "
                         "check --intra-bandwidth / --inter-bandwidth")
    if probe["load_s"] > step:
        raise ValueError(f"calibrate: the data-loading model ({probe['load_s']:.3g} s/step) is slower "
                         f"than the measured step ({step:.3g} s): the run would be data-bound and "
                         "compute cannot be calibrated; check --decode-fps-per-core / --bytes-per-frame")
    return compute * cluster.compute_speedup / w.compute_ratio / straggler_factor(w.step_jitter_cv, gpus)


def gpu_counts(lo: int, hi: int, per_node: int) -> list[int]:
    """Powers of two times ``per_node`` from ``lo`` up to ``hi`` (6, 12, 24, ..., 3072 on Summit),
    plus ``lo`` and ``hi`` themselves."""
    out, n = {lo, hi}, per_node
    while n <= hi:
        if n >= lo:
            out.add(n)
        n *= 2
    return sorted(out)


def format_duration(seconds: float) -> str:
    """``'14 min 13 s'`` / ``'49 h 55 min'`` style."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {(s % 3600) // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{seconds:.1f} s"


# --------------------------------------------------------------------------------------------
# The whole model: calibration, prediction, curves, what-ifs
# --------------------------------------------------------------------------------------------
@dataclass
class ScalingResult:
    """Everything ``tsm-ds bench scale`` computes (also written as JSON)."""

    calibration: dict[str, Any]
    prediction: dict[str, Any]
    curve: list[dict[str, Any]]
    tsm_vs_i3d: dict[str, Any]
    whatifs: list[dict[str, Any]]
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    assumptions: dict[str, Any] = field(default_factory=dict)
    multigrid: list[dict[str, Any]] = field(default_factory=list)   # :func:`.multigrid.multigrid_summary`


def run_model(tsm: Workload, i3d: Workload, cluster: Cluster, *, counts: Sequence[int],
              calib_gpus: int = PAPER["single_node_gpus"],
              calib_time_s: float = PAPER["single_node_time_s"],
              target_gpus: int = PAPER["large_scale_gpus"],
              paper_time_s: float | None = PAPER["large_scale_time_s"],
              whatif_clusters: Sequence[Cluster] = (CLUSTERS["h100"], CLUSTERS["h200"]),
              calib_workload: Workload | None = None,
              extra_whatifs: Sequence[tuple[str, Workload]] = (),
              calib_cluster: Cluster | None = None,
              onebit_ratio: float | None = None) -> ScalingResult:
    """Calibrate on the single-node time, predict ``target_gpus``, draw the curves and what-ifs.

    Args:
        tsm, i3d: the two workloads (their ``compute_ratio`` relative to TSM-R50 8f).
        cluster: hardware of the prediction (and of the calibration unless ``calib_cluster``).
        counts: GPU counts of the scaling curve.
        calib_gpus, calib_time_s: the single calibration point (6 GPUs, 49 h 55 min).
        target_gpus, paper_time_s: the predicted point and the paper's figure to compare with
            (None: no error is reported).
        whatif_clusters: other GPU generations for the what-if table.
        calib_workload: the workload the calibration time was measured with (default ``tsm``);
            e.g. TSM-R50 8f when ``tsm`` is a 16-frame model to be predicted.
        extra_whatifs: (name, workload) pairs evaluated on ``cluster`` at ``target_gpus``.
        calib_cluster: hardware the calibration time was measured on (default ``cluster``); its
            ``compute_speedup`` normalises the fitted compute, so a Summit calibration can predict
            an H100 cluster.
        onebit_ratio: fp32 bytes / 1-bit bytes per step (``bench comm`` measures it); default:
            32 with one fp32 scale per 65,536-element chunk (tsm_ds.engine.comm.compression's layout).

    Returns:
        ScalingResult.

    Raises:
        ValueError: from :func:`calibrate`.
    """
    cw = calib_workload or tsm
    cc = calib_cluster or cluster
    ref = calibrate(cw, cc, gpus=calib_gpus, time_s=calib_time_s)
    check = step_breakdown(cw, cc, calib_gpus, ref)
    calibration = {
        "gpus": calib_gpus, "cluster": cc.name, "paper_time_s": calib_time_s,
        "model_time_s": check["train_time_s"],
        "ref_compute_s_per_step": ref,
        "ref_clips_per_s_per_gpu": cw.batch_per_gpu / ref,
        "steps": cw.epochs * check["steps_per_epoch"], "workload": cw.label,
        "comm_s_per_step": check["comm_s"], "load_s_per_step": check["load_s"],
    }
    pred = step_breakdown(tsm, cluster, target_gpus, ref)
    small = step_breakdown(tsm, cluster, calib_gpus, ref)   # same workload and hardware, few GPUs
    prediction = {"gpus": target_gpus, **{k: pred[k] for k in (
        "train_time_s", "step_s", "compute_s", "comm_s", "comm_intra_s", "comm_inter_s",
        "comm_exposed_s", "load_s", "bound", "steps_per_epoch")},
        "train_time": format_duration(pred["train_time_s"]),
        "model": tsm.label, "cluster": cluster.name,
        "speedup_vs_calibration": small["train_time_s"] / pred["train_time_s"],
        "efficiency": small["train_time_s"] * calib_gpus / (pred["train_time_s"] * target_gpus)}
    if paper_time_s:
        prediction["paper_time_s"] = paper_time_s
        prediction["paper_time"] = format_duration(paper_time_s)
        prediction["error_pct"] = 100.0 * (pred["train_time_s"] - paper_time_s) / paper_time_s
        # what a fixed per-epoch cost (loader restart, sampler, logging) would have to be to
        # close the gap: a cost invisible on one node (5,000 steps/epoch) and large at 20
        prediction["residual_per_epoch_s"] = (paper_time_s - pred["train_time_s"]) / tsm.epochs

    curve: list[dict[str, Any]] = []
    base: dict[str, float] = {}
    for w in (tsm, i3d):
        for n in counts:
            row = step_breakdown(w, cluster, n, ref)
            if n == counts[0]:
                base[w.label] = row["train_time_s"] * n
            row["ideal_time_s"] = base[w.label] / n
            row["efficiency"] = row["ideal_time_s"] / row["train_time_s"]
            curve.append(row)

    t_tsm = step_breakdown(tsm, cluster, target_gpus, ref)
    t_i3d = step_breakdown(i3d, cluster, target_gpus, ref)
    eff = {r["model"]: r["efficiency"] for r in curve if r["gpus"] == target_gpus}
    tsm_vs_i3d = {
        "gpus": target_gpus, "tsm_time_s": t_tsm["train_time_s"], "i3d_time_s": t_i3d["train_time_s"],
        "i3d_over_tsm_time": t_i3d["train_time_s"] / t_tsm["train_time_s"],
        "tsm_efficiency": eff.get(tsm.label), "i3d_efficiency": eff.get(i3d.label),
        "tsm_grad_bytes": t_tsm["grad_bytes"], "i3d_grad_bytes": t_i3d["grad_bytes"],
        "tsm_comm_share": t_tsm["comm_exposed_s"] / t_tsm["step_s"],
        "i3d_comm_share": t_i3d["comm_exposed_s"] / t_i3d["step_s"],
        "tsm_load_s": t_tsm["load_s"], "i3d_load_s": t_i3d["load_s"],
    }

    def whatif(name: str, w: Workload, c: Cluster, gpus: int) -> dict[str, Any]:
        row = step_breakdown(w, c, gpus, ref)
        one = step_breakdown(w, c, calib_gpus, ref)
        return {"what_if": name, "model": w.label, "cluster": c.name, "gpus": gpus,
                "train_time_s": row["train_time_s"], "train_time": format_duration(row["train_time_s"]),
                "efficiency": one["train_time_s"] * calib_gpus / (row["train_time_s"] * gpus),
                "step_s": row["step_s"], "compute_s": row["compute_s"],
                "comm_exposed_s": row["comm_exposed_s"], "load_s": row["load_s"],
                "grad_bytes": row["grad_bytes"], "bound": row["bound"]}

    n = target_gpus
    sensitivity: list[dict[str, Any]] = []
    if paper_time_s:
        # each variant is re-calibrated on the single node, then predicts target_gpus again
        variants = [
            ("as configured", cw, tsm, cluster),
            ("inter-node alpha 1 us", cw, tsm, replace(cluster, inter_latency=1e-6)),
            ("inter-node alpha 20 us", cw, tsm, replace(cluster, inter_latency=20e-6)),
            ("network 25 GB/s (2x100 Gb/s signalling)", cw, tsm, replace(cluster, inter_bw=25 * GB)),
            (f"network {cluster.inter_bw / 2 / GB:g} GB/s (one rail)", cw, tsm,
             replace(cluster, inter_bw=cluster.inter_bw / 2)),
            ("network 5 GB/s", cw, tsm, replace(cluster, inter_bw=5 * GB)),
            ("overlap 0.5", replace(cw, overlap=0.5), replace(tsm, overlap=0.5), cluster),
            ("fp16 gradients on the wire", replace(cw, bytes_per_element=2.0),
             replace(tsm, bytes_per_element=2.0), cluster),
            ("straggler cv 2 %", replace(cw, step_jitter_cv=0.02), replace(tsm, step_jitter_cv=0.02), cluster),
            ("straggler cv 5 %", replace(cw, step_jitter_cv=0.05), replace(tsm, step_jitter_cv=0.05), cluster),
            ("dataset 246k clips", replace(cw, dataset_size=246_000), replace(tsm, dataset_size=246_000), cluster),
        ]
        for name, cwv, tv, cv in variants:
            r = step_breakdown(tv, cv, n, calibrate(cwv, cv, gpus=calib_gpus, time_s=calib_time_s))
            sensitivity.append({"variant": name, "train_time_s": r["train_time_s"],
                                "train_time": format_duration(r["train_time_s"]),
                                "error_pct": 100.0 * (r["train_time_s"] - paper_time_s) / paper_time_s,
                                "comm_exposed_ms": 1e3 * r["comm_exposed_s"]})
    if onebit_ratio:
        one_bit: dict[str, float] = dict(compression=onebit_ratio)
    else:  # sign bits + one fp32 scale per 65,536-element chunk, as the ring payload
        one_bit = dict(compression=32.0, compression_overhead_bytes=4.0 * math.ceil(tsm.params / 65536))
    whatifs = [
        whatif("baseline fp32 comm", tsm, cluster, n),
        whatif("bf16 comm", replace(tsm, bytes_per_element=2.0), cluster, n),
        whatif("1-bit comm", replace(tsm, **one_bit), cluster, n),
        whatif("fully overlapped comm", replace(tsm, overlap=1.0), cluster, n),
        whatif(f"half the network ({cluster.inter_bw / 2 / GB:g} GB/s per node)", tsm,
               replace(cluster, inter_bw=cluster.inter_bw / 2), n),
        whatif("10 GbE network (1.25 GB/s)", tsm, replace(cluster, inter_bw=1.25 * GB), n),
        whatif("16 frames", replace(tsm, label="TSM-R50 16f", frames=16, compute_ratio=2.0), cluster, n),
        whatif("I3D baseline", i3d, cluster, n),
        whatif("I3D bf16 comm", replace(i3d, bytes_per_element=2.0), cluster, n),
        whatif("3072 GPUs", tsm, cluster, 3072),
    ]
    # TSM against I3D where a bottleneck bites: network (bytes) and input pipeline (frames)
    for name, c in (("10 GbE network", replace(cluster, inter_bw=1.25 * GB)),
                    ("1 CPU core per GPU", replace(cluster, cpu_cores_per_gpu=1.0)),
                    ("shared storage 5 GB/s (NFS-class filer)", replace(cluster, storage_bw_total=5 * GB))):
        whatifs += [whatif(name, tsm, c, n), whatif(name, i3d, c, n)]
    whatifs += [whatif(name, w, cluster, n) for name, w in extra_whatifs]
    for c in whatif_clusters:
        for name, w in (("fp32 comm", tsm), ("bf16 comm", replace(tsm, bytes_per_element=2.0))):
            nn = math.ceil(n / c.gpus_per_node) * c.gpus_per_node
            whatifs.append(whatif(f"{c.name} {name}", w, c, nn))
            whatifs.append(whatif(f"{c.name} {name}, 10 GbE", w, replace(c, inter_bw=1.25 * GB), nn))
    return ScalingResult(calibration, prediction, curve, tsm_vs_i3d, whatifs, sensitivity)
