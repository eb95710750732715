"""``tsm-ds bench scale``: an analytic model of data-parallel training time, TSM against I3D.

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

Sources (numbers the defaults use; see ``PAPER`` and ``CLUSTERS``):
- J. Lin, C. Gan, S. Han, "Training Kinetics in 15 Minutes: Large-scale Distributed Training on
  Videos", arXiv:1910.00932 (abstract): TSM-R50, 8 frames, 1,536 GPUs / mini-batch 12,288 clips
  (8 per GPU), 49 h 55 min on one node -> 14 min 13 s, 74.0 % top-1, 1.8x the throughput of I3D.
  The authors (mit-han-lab/temporal-shift-module issue #28) confirm "about 49 hours to train a
  ResNet-50 TSM on Kinetics using 6 V100 GPUs" and that data loading does not delay an 8-frame
  model. Epochs: 50, the official Kinetics recipe (official code, ``main.py`` defaults / README);
  the same number is assumed for the 1,536-GPU run (the paper keeps accuracy: 74.0 %).
- Summit (OLCF Summit user guide, docs.olcf.ornl.gov/systems/summit_user_guide.html): 6 V100 per
  node, NVLink 2.0 at 50 GB/s per direction between GPUs, dual-rail EDR InfiniBand (2 x 100 Gb/s;
  23 GB/s node injection bandwidth), non-blocking fat tree, 42 usable POWER9 cores per node,
  Alpine GPFS 2.5 TB/s.
- H100/H200 (NVIDIA H100 / H200 datasheets, DGX H100 user guide): 8 GPUs per node, NVLink 4 at
  900 GB/s bidirectional (450 GB/s per direction), 8 x ConnectX-7 NDR 400 Gb/s per node (400 GB/s).
  Their per-GPU training speed relative to V100 is an ASSUMPTION (``compute_speedup``), stated in
  the report.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

GB = 1e9

# --------------------------------------------------------------------------------------------
# Reference figures
# --------------------------------------------------------------------------------------------
PAPER: dict[str, Any] = {
    "source": "Lin, Gan, Han: Training Kinetics in 15 Minutes, arXiv:1910.00932",
    "single_node_gpus": 6,
    "single_node_time_s": 49 * 3600 + 55 * 60,      # 49 h 55 min: the ONLY calibration target
    "large_scale_gpus": 1536,
    "large_scale_time_s": 14 * 60 + 13,             # 14 min 13 s: predicted, never fitted
    "top1": 74.0,
    "batch_per_gpu": 8,                             # 12,288 clips / 1,536 GPUs
    "frames": 8,
    "tsm_vs_i3d_throughput": 1.8,
    "epochs": 50,                                   # official Kinetics recipe (assumed for both runs)
    "dataset_size": 240_000,                        # Kinetics-400 training clips, approximately
}

#: Model sizes (parameters = gradient elements) and per-clip cost relative to TSM-R50 8f, 400
#: classes, counted from ``tsm_ds.models.build_model`` (tests check they still match):
#: TSM-R50 24,327,632 parameters, 32.7 GMACs per 8-frame 224 px clip (TSM paper: 24.3 M, 33 G);
#: I3D-R50 (Wang et al., "Non-local Neural Networks", 2018, I3D_3x1x1) 28,043,472 parameters,
#: 99.2 GMACs per 32-frame clip (3.03x TSM). I3D's per-clip training time is the paper's measured
#: 1.8x throughput gap on V100 by default; multiply-adds (3.03x) are a what-if.
MODELS: dict[str, dict[str, Any]] = {
    "tsm": {"label": "TSM-R50 8f", "params": 24_327_632, "frames": 8, "compute_ratio": 1.0,
            "gmacs": 32.70, "source": "build_model('resnet50', 400, num_segments=8)"},
    "i3d": {"label": "I3D-R50 32f", "params": 28_043_472, "frames": 32,
            "compute_ratio": PAPER["tsm_vs_i3d_throughput"], "gmacs": 99.24,
            "source": "build_model('i3d_resnet50', 400, num_segments=32); compute: paper's 1.8x"},
}


@dataclass(frozen=True)
class Cluster:
    """Hardware of a GPU cluster, as far as the scaling model needs it.

    Attributes:
        name: preset name ("summit", "h100", "h200") or "custom".
        gpus_per_node: g, GPUs sharing one node's NVLink domain and network adapters.
        intra_bw: bytes/s per direction of the slowest link of the intra-node ring (NVLink).
        inter_bw: bytes/s per direction a whole node can inject into the network (all rails).
        intra_latency: seconds per hop of an intra-node ring step (alpha, NVLink).
        inter_latency: seconds per hop of an inter-node ring step (alpha, InfiniBand + software).
        storage_bw_node: bytes/s one node can read from storage.
        storage_bw_total: bytes/s the shared file system delivers to all nodes together.
        cpu_cores_per_gpu: CPU cores decoding and augmenting for one GPU's loader.
        compute_speedup: per-GPU training speed relative to the calibration GPU (V100 = 1.0).
        source: where the numbers come from (free text, printed in the report).
    """

    name: str
    gpus_per_node: int
    intra_bw: float
    inter_bw: float
    intra_latency: float
    inter_latency: float
    storage_bw_node: float
    storage_bw_total: float
    cpu_cores_per_gpu: float
    compute_speedup: float = 1.0
    source: str = ""


CLUSTERS: dict[str, Cluster] = {
    "summit": Cluster(
        name="summit", gpus_per_node=6, intra_bw=50 * GB, inter_bw=23 * GB,
        intra_latency=2e-6, inter_latency=5e-6,
        storage_bw_node=23 * GB, storage_bw_total=2500 * GB, cpu_cores_per_gpu=7.0,
        compute_speedup=1.0,
        source=("OLCF Summit user guide / ORNL: 6x V100 per node, NVLink 2.0 50 GB/s per direction "
                "(X-Bus 64 GB/s between the sockets), non-blocking fat tree of dual-rail EDR "
                "InfiniBand (2 x 100 Gb/s = 25 GB/s signalling; 23 GB/s node injection bandwidth "
                "used), 42 usable POWER9 cores, Alpine GPFS 2.5 TB/s; latencies 2 us (NVLink) / "
                "5 us (IB hop incl. NCCL) are assumptions")),
    "h100": Cluster(
        name="h100", gpus_per_node=8, intra_bw=450 * GB, inter_bw=400 * GB,
        intra_latency=2e-6, inter_latency=5e-6,
        storage_bw_node=50 * GB, storage_bw_total=2500 * GB, cpu_cores_per_gpu=14.0,
        compute_speedup=3.0,
        source=("DGX H100: NVLink 4 900 GB/s bidirectional (450 per direction), 8x ConnectX-7 "
                "NDR 400 Gb/s = 400 GB/s per node, 2x56 cores. compute_speedup 3.0x V100 is an "
                "ASSUMPTION (ResNet-50-class training, mixed precision; peak dense tensor FLOPs "
                "would say 7.9x, conv nets reach far less)")),
    "h200": Cluster(
        name="h200", gpus_per_node=8, intra_bw=450 * GB, inter_bw=400 * GB,
        intra_latency=2e-6, inter_latency=5e-6,
        storage_bw_node=50 * GB, storage_bw_total=2500 * GB, cpu_cores_per_gpu=14.0,
        compute_speedup=3.3,
        source=("H200 SXM: same NVLink 4 / NDR network as DGX H100, same dense compute as H100, "
                "4.8 TB/s HBM3e vs 3.35; compute_speedup 3.3x V100 is an ASSUMPTION (H100 + 10% "
                "for the memory-bound parts of a conv net)")),
}


@dataclass(frozen=True)
class Workload:
    """One model trained with one recipe.

    Attributes:
        label: name in tables ("TSM-R50 8f").
        params: gradient elements all-reduced per step (= trainable parameters).
        frames: T, frames per clip.
        compute_ratio: compute time per clip relative to the calibrated reference (TSM-R50 8f on
            the calibration GPU) = 1.0. A 2D backbone's cost grows linearly with T (TSM 16f: 2.0).
        dataset_size: training clips per epoch.
        epochs: passes over the dataset.
        batch_per_gpu: micro-batch, clips per GPU per step.
        bytes_per_element: bytes per gradient element on the wire (fp32 4, bf16/fp16 2).
        compression: divide the wire bytes by this (1-bit: 32).
        compression_overhead_bytes: extra bytes per GPU per step (1-bit: scales, per world size).
        bytes_per_frame: bytes read from storage per sampled frame (JPEG frame folders).
        decode_fps_per_core: frames one CPU core decodes and augments per second.
        overlap: fraction of the all-reduce hidden behind backward (0 = none, 1 = all).
        bucket_bytes: gradient bucket size; each bucket is one all-reduce and pays the latency.
        step_jitter_cv: coefficient of variation of one GPU's compute time per step. A synchronous
            step waits for the slowest of n GPUs, whose expected time is about
            ``mean * (1 + cv * sqrt(2 ln n))`` (maximum of n normal variables); 0 turns it off.
    """

    label: str
    params: int
    frames: int
    compute_ratio: float
    dataset_size: int = PAPER["dataset_size"]
    epochs: int = PAPER["epochs"]
    batch_per_gpu: int = PAPER["batch_per_gpu"]
    bytes_per_element: float = 4.0
    compression: float = 1.0
    compression_overhead_bytes: float = 0.0
    bytes_per_frame: float = 20_000.0
    decode_fps_per_core: float = 200.0
    overlap: float = 0.0
    bucket_bytes: float = 25 * 2**20
    step_jitter_cv: float = 0.0


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
# Inputs from the other benchmarks
# --------------------------------------------------------------------------------------------
def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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


def bench_inputs(bench_dir: Path) -> dict[str, Any]:
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
    found: dict[str, Any] = {"notes": []}
    models = _load_json(bench_dir / "models.json")
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
    comm = _load_json(bench_dir / "comm.json")
    for row in (comm or {}).get("rows", []):
        if isinstance(row, dict) and row.get("method") == "onebit" and _num(row.get("bytes_ratio_vs_fp32")):
            found["onebit_ratio"] = float(row["bytes_ratio_vs_fp32"])
            found["notes"].append(f"comm.json: 1-bit sends {found['onebit_ratio']:.1f}x fewer bytes than fp32 "
                                  f"(world size {(comm.get('meta') or {}).get('world_size', '?')})")
    data = _load_json(bench_dir / "data.json")
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
            32 with one fp32 scale per 65,536-element chunk (tsm_ds.engine.compression's layout).

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


def _markdown(res: ScalingResult, cluster: Cluster, tsm: Workload, i3d: Workload) -> str:
    from tsm_ds.bench.report import markdown_table

    p, c, d = res.prediction, res.calibration, res.tsm_vs_i3d
    lines = ["## Scaling model", "",
             "step = max(data loading, compute + (1 - overlap) x all-reduce); ring all-reduce "
             "2(n-1)/n x bytes / bandwidth + 2(n-1) x alpha, hierarchical across nodes. "
             f"Calibrated ONLY on {c['gpus']} GPUs = {format_duration(c['paper_time_s'])} (paper).", "",
             "### Calibration", "",
             f"- model time on {c['gpus']} GPUs: {c['model_time_s']:.1f} s (paper {c['paper_time_s']} s, "
             "equal by construction)",
             f"- fitted compute per step (batch {tsm.batch_per_gpu}/GPU): {c['ref_compute_s_per_step'] * 1e3:.1f} ms"
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
              "### Assumptions", ""]
    lines += [f"- {k}: {v}" for k, v in res.assumptions.items()]
    return "\n".join(lines) + "\n"


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
                         "the paper's single node)"),
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
    prediction. Returns 0, or 2 on a calibration that cannot be solved."""
    from tsm_ds.bench.report import append_markdown, write_report

    args = build_parser().parse_args(argv)
    _check(args)
    out = Path(args.out_dir)
    found = bench_inputs(Path(args.from_bench) if args.from_bench else out)

    cluster = CLUSTERS[args.cluster]
    over: dict[str, Any] = {}
    if args.gpus_per_node:
        over["gpus_per_node"] = args.gpus_per_node
    if args.inter_bandwidth:
        over["inter_bw"] = args.inter_bandwidth * GB
    if args.intra_bandwidth:
        over["intra_bw"] = args.intra_bandwidth * GB
    if args.latency_us is not None:
        over["inter_latency"] = args.latency_us * 1e-6
    if over:
        cluster = replace(cluster, name=cluster.name + "*", **over)
    calib_cluster = cluster if args.calib_cluster == args.cluster else CLUSTERS[args.calib_cluster]

    decode = args.decode_fps_per_core or found.get("decode_fps_per_core") or 200.0
    if args.decode_fps_per_core is None and "decode_fps_per_core" in found:
        # a rate measured on a busy 2-core CPU must not make the paper's node data-bound (its
        # authors report an 8-frame model is not: temporal-shift-module issue #28)
        probe = Workload(label="probe", params=1, frames=8, compute_ratio=1.0, batch_per_gpu=args.batch_per_gpu,
                         decode_fps_per_core=decode, bytes_per_frame=args.bytes_per_frame)
        need = args.calib_time_s / (args.epochs * steps_per_epoch(replace(probe, dataset_size=args.dataset_size),
                                                                  args.calib_gpus))
        if data_loading_time(probe, CLUSTERS[args.calib_cluster], args.calib_gpus)["total_s"] > need:
            found["notes"].append(f"data.json decode rate {decode:.0f} frames/s/core not used: it would make "
                                  "the calibration node data-bound")
            decode = 200.0
            del found["decode_fps_per_core"]
    common = dict(dataset_size=args.dataset_size, epochs=args.epochs, batch_per_gpu=args.batch_per_gpu,
                  bytes_per_element=args.bytes_per_element, overlap=args.overlap,
                  bytes_per_frame=args.bytes_per_frame, decode_fps_per_core=decode)
    tsm_params = args.tsm_params or found.get("tsm_params") or MODELS["tsm"]["params"]
    i3d_params = args.i3d_params or found.get("i3d_params") or MODELS["i3d"]["params"]
    i3d_ratio = args.i3d_ratio or MODELS["i3d"]["compute_ratio"]
    # the calibration workload is always TSM-R50 8f; --frames changes the predicted one
    ref = Workload(label="TSM-R50 8f", params=tsm_params, frames=8, compute_ratio=1.0, **common)
    tsm = replace(ref, label=f"TSM-R50 {args.frames}f", frames=args.frames, compute_ratio=args.frames / 8)
    i3d = Workload(label="I3D-R50 32f", params=i3d_params, frames=32, compute_ratio=i3d_ratio, **common)

    paper_time = PAPER["large_scale_time_s"] if (
        args.gpus == PAPER["large_scale_gpus"] and args.frames == 8 and args.cluster == "summit") else None
    counts = gpu_counts(args.calib_gpus, max(args.max_gpus, args.gpus), cluster.gpus_per_node)
    if args.gpus not in counts:
        counts = sorted(set(counts) | {args.gpus})
    try:
        if args.gpu_throughput:
            # given throughput: the calibration time it implies (run_model fits it back exactly)
            ref_compute = ref.batch_per_gpu / args.gpu_throughput * cluster.compute_speedup
            calib_time = step_breakdown(ref, calib_cluster, args.calib_gpus, ref_compute)["train_time_s"]
        else:
            calib_time = args.calib_time_s
        macs = found.get("i3d_macs_ratio", MODELS["i3d"]["gmacs"] / MODELS["tsm"]["gmacs"])
        extra = [(f"I3D compute by multiply-adds ({macs:.2f}x)", replace(i3d, compute_ratio=macs))]
        if "i3d_compute_ratio_measured" in found:
            m = found["i3d_compute_ratio_measured"]
            extra.append((f"I3D compute by this machine's measured ratio ({m:.2f}x)",
                          replace(i3d, compute_ratio=m)))
        res = run_model(tsm, i3d, cluster, counts=counts, calib_gpus=args.calib_gpus,
                        calib_time_s=calib_time, target_gpus=args.gpus, paper_time_s=paper_time,
                        calib_workload=ref, extra_whatifs=extra, calib_cluster=calib_cluster,
                        onebit_ratio=found.get("onebit_ratio"))
    except ValueError as e:
        print(f"tsm-ds bench scale: {e}", file=sys.stderr)
        return 2

    res.assumptions = {
        "paper": PAPER["source"] + "; 6 V100 49 h 55 min (calibration), 1,536 V100 14 min 13 s (predicted)",
        "epochs": f"{args.epochs} (official TSM Kinetics recipe; assumed equal at 6 and 1,536 GPUs, so "
                  "epochs cancel from the prediction except in the communication term)",
        "dataset_size": f"{args.dataset_size} Kinetics-400 training clips (approximate)",
        "cluster": cluster.source,
        "gradient": f"TSM {tsm_params / 1e6:.2f} M / I3D {i3d_params / 1e6:.2f} M elements x "
                    f"{args.bytes_per_element:g} bytes; 25 MiB buckets"
                    + (" (parameters from models.json)" if "i3d_params" in found else
                       " (counted from build_model: TSM-R50 24.33 M, I3D-R50 28.04 M)"),
        "i3d_compute": f"{i3d_ratio:g}x TSM per clip ("
                       + ("--i3d-ratio" if args.i3d_ratio else "paper's 1.8x throughput") + ")"
                       + (f"; measured here: {found['i3d_compute_ratio_measured']:.2f}x"
                          if "i3d_compute_ratio_measured" in found else ""),
        "data": f"{args.bytes_per_frame:g} bytes/frame (JPEG frame folders, assumption), "
                f"{decode:g} frames/s per core" + (" (data.json)" if args.decode_fps_per_core is None
                                                   and "decode_fps_per_core" in found else " (assumption)"),
        "overlap": f"{args.overlap:g} (0 = communication not hidden behind backward)",
        "1-bit": (f"fp32 bytes / {found['onebit_ratio']:.2f} (comm.json)" if "onebit_ratio" in found else
                  "bytes/32 + one fp32 scale per 65,536 elements") + "; same 2(n-1)/n form as the ring "
                  "(all-to-all + all-gather); its fp32 warm-up stage is ignored",
        "bench_notes": "; ".join(found["notes"]) or "no bench JSON found",
    }
    rows = res.curve
    meta = {"calibration": res.calibration, "prediction": res.prediction, "tsm_vs_i3d": res.tsm_vs_i3d,
            "whatifs": res.whatifs, "sensitivity": res.sensitivity, "assumptions": res.assumptions,
            "cluster": dataclasses.asdict(cluster),
            "workloads": {"tsm": dataclasses.asdict(tsm), "i3d": dataclasses.asdict(i3d)}}
    json_path, md_path = write_report("scale", rows, out, meta=meta, title="Scaling model",
                                      columns=["model", "gpus", "step_s", "train_time_s", "efficiency"])
    # write_report lists meta as bullets; replace the markdown by the readable version
    append_markdown(md_path, _markdown(res, cluster, tsm, i3d), replace=True)
    png = None
    if not args.no_plot:
        from tsm_ds.bench.plots import plot_scaling

        png = plot_scaling(json_path, out / "scaling.png")
    p = res.prediction
    print(f"calibrated: {res.calibration['ref_clips_per_s_per_gpu']:.2f} training clips/s per "
          f"{calib_cluster.name} GPU ({res.calibration['ref_compute_s_per_step'] * 1e3:.1f} ms per step "
          f"of {ref.batch_per_gpu} clips; x{cluster.compute_speedup:g} on {cluster.name})")
    line = f"predicted {args.gpus} GPUs: {format_duration(p['train_time_s'])} ({p['train_time_s']:.0f} s)"
    if "error_pct" in p:
        line += f"; paper {p['paper_time']} -> error {p['error_pct']:+.1f} %"
    print(line)
    d = res.tsm_vs_i3d
    print(f"I3D at {d['gpus']} GPUs: {format_duration(d['i3d_time_s'])} ({d['i3d_over_tsm_time']:.2f}x TSM); "
          f"efficiency TSM {100 * d['tsm_efficiency']:.1f} % / I3D {100 * d['i3d_efficiency']:.1f} %")
    print(f"wrote {json_path}, {md_path}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
