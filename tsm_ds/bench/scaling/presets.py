"""Inputs of the scaling model: the paper's figures, model sizes, cluster presets, workloads.

Everything here is data (no computation): :data:`PAPER` (the reference run), :data:`MODELS`
(gradient elements and relative compute of TSM-R50 8f and I3D-R50 32f), :class:`Cluster` and the
presets in :data:`CLUSTERS`, and :class:`Workload` (one model trained with one recipe). Units: bytes,
bytes/s, seconds, clips, frames.

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

from dataclasses import dataclass
from typing import Any

__all__ = ["GB", "PAPER", "MODELS", "Cluster", "CLUSTERS", "Workload"]

#: bytes in a gigabyte (decimal, as datasheets count)
GB = 1e9

# --------------------------------------------------------------------------------------------
# Reference figures
# --------------------------------------------------------------------------------------------
#: the reference run (TSM-R50 8f on Kinetics-400): the single-node time calibrates the model, the
#: 1,536-GPU time is what it predicts
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
#: 33.1 GMACs per 32-frame clip in the non-local paper / mmaction2 layout (``i3d_resnet50``: 1.01x
#: TSM; the released non-local code's layout is 113.6). I3D's per-clip training time is the paper's
#: measured 1.8x throughput gap on V100 by default; multiply-adds (1.01x) are a what-if.
MODELS: dict[str, dict[str, Any]] = {
    "tsm": {"label": "TSM-R50 8f", "params": 24_327_632, "frames": 8, "compute_ratio": 1.0,
            "gmacs": 32.70, "source": "build_model('resnet50', 400, num_segments=8)"},
    "i3d": {"label": "I3D-R50 32f", "params": 28_043_472, "frames": 32,
            "compute_ratio": PAPER["tsm_vs_i3d_throughput"], "gmacs": 33.13,
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

