"""The analytic scaling model (tsm_ds.bench.scaling): formulas on known numbers, the single-node
calibration, and that the 1,536-GPU figure is a computed prediction."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from tsm_ds.bench import scaling as S

GB = 1e9


def tsm_workload(**kw) -> S.Workload:
    return S.Workload(label="TSM-R50 8f", params=24_300_000, frames=8, compute_ratio=1.0, **kw)


def test_ring_allreduce_known_numbers():
    # 4 members, 100 MB, 10 GB/s, 10 us per step: 2*3/4 * 1e8/1e10 + 2*3*1e-5
    assert S.ring_allreduce_time(4, 1e8, 1e10, 1e-5) == pytest.approx(0.015 + 6e-5, rel=1e-12)
    # 2 members send the whole buffer once each way: 2*1/2 * 8e6 / 4e9
    assert S.ring_allreduce_time(2, 8e6, 4e9) == pytest.approx(2e-3, rel=1e-12)
    assert S.ring_allreduce_time(1, 1e9, 1.0, 1.0) == 0.0
    # bandwidth term tends to 2 * bytes / bw for large rings
    assert S.ring_allreduce_time(10_000, 1e9, 1e9) == pytest.approx(2 * 9_999 / 10_000, rel=1e-12)
    with pytest.raises(ValueError, match="n must be >= 1"):
        S.ring_allreduce_time(0, 1e6, 1e9)
    with pytest.raises(ValueError, match="bandwidth > 0"):
        S.ring_allreduce_time(4, 1e6, 0.0)


def test_hierarchical_allreduce_known_numbers():
    c = replace(S.CLUSTERS["summit"], gpus_per_node=4, intra_bw=100 * GB, inter_bw=10 * GB,
                intra_latency=1e-6, inter_latency=1e-5)
    b = 4e8
    one_node = S.allreduce_time(4, b, c)
    assert one_node["inter_s"] == 0.0
    assert one_node["total_s"] == pytest.approx(2 * 3 / 4 * b / 100e9 + 2 * 3 * 1e-6, rel=1e-12)
    # 2 nodes x 4 GPUs: each local GPU rings a 1/4 shard over 2 nodes with 1/4 of the NIC
    two = S.allreduce_time(8, b, c, buckets=3)
    assert two["inter_s"] == pytest.approx(2 * 1 / 2 * b / 10e9 + 2 * 1 * 1e-5 * 3, rel=1e-12)
    assert two["intra_s"] == pytest.approx(2 * 3 / 4 * b / 100e9 + 2 * 3 * 1e-6 * 3, rel=1e-12)
    # 256 nodes: same bandwidth term as a flat ring on the node bandwidth, far fewer latency hops
    many = S.allreduce_time(1024, b, replace(c, inter_latency=0.0))
    assert many["inter_s"] == pytest.approx(2 * 255 / 256 * b / 10e9, rel=1e-12)


def test_steps_data_loading_and_straggler():
    w = tsm_workload()
    assert S.steps_per_epoch(w, 6) == 5000          # 240,000 / 48
    assert S.steps_per_epoch(w, 1536) == 20         # 240,000 / 12,288 = 19.5 -> padded to 20
    c = S.CLUSTERS["summit"]
    load = S.data_loading_time(w, c, 6)
    assert load["decode_s"] == pytest.approx(64 / (200.0 * 7.0))
    assert load["read_s"] == pytest.approx(64 * 20_000 * 6 / 23e9)
    # a 5 GB/s filer shared by 256 nodes: 19.5 MB/s per node
    slow = S.data_loading_time(w, replace(c, storage_bw_total=5 * GB), 1536)
    assert slow["read_s"] == pytest.approx(64 * 20_000 * 6 / (5e9 / 256))
    assert S.straggler_factor(0.05, 1) == 1.0
    assert S.straggler_factor(0.05, 6) == pytest.approx(1 + 0.05 * math.sqrt(2 * math.log(6)))


@pytest.mark.parametrize("gpus,time_s", [(6, 49 * 3600 + 55 * 60), (12, 30_000.0), (48, 9_000.0)])
def test_calibration_reproduces_the_measured_time(gpus, time_s):
    c = S.CLUSTERS["summit"]
    for w in (tsm_workload(), tsm_workload(overlap=0.3, step_jitter_cv=0.03, bytes_per_element=2.0)):
        ref = S.calibrate(w, c, gpus=gpus, time_s=time_s)
        assert S.step_breakdown(w, c, gpus, ref)["train_time_s"] == pytest.approx(time_s, rel=1e-12)


def test_prediction_equals_hand_computation():
    """Summit defaults: the 1,536-GPU time from the formulas written out here by hand."""
    c, w = S.CLUSTERS["summit"], tsm_workload()
    b = 24_300_000 * 4.0
    buckets = math.ceil(b / (25 * 2**20))
    intra = 2 * 5 / 6 * b / 50e9 + 2 * 5 * 2e-6 * buckets
    inter = 2 * 255 / 256 * (b / 6) / (23e9 / 6) + 2 * 255 * 5e-6 * buckets
    compute = 179_700 / (50 * 5000) - intra            # calibration: one node, 5,000 steps/epoch
    expected = 50 * 20 * (compute + intra + inter)
    res = S.run_model(w, replace(w, label="I3D", params=28_000_000, frames=32, compute_ratio=1.8), c,
                      counts=[6, 1536])
    assert res.calibration["ref_compute_s_per_step"] == pytest.approx(compute, rel=1e-12)
    assert res.prediction["train_time_s"] == pytest.approx(expected, rel=1e-12)
    assert res.prediction["error_pct"] == pytest.approx(100 * (expected - 853) / 853, rel=1e-9)


def test_prediction_is_computed_not_copied():
    w, c = tsm_workload(), S.CLUSTERS["summit"]
    i3d = replace(w, label="I3D", params=28_000_000, frames=32, compute_ratio=1.8)
    times = []
    for bw in (1.0, 5.0, 23.0, 100.0):
        res = S.run_model(w, i3d, replace(c, inter_bw=bw * GB), counts=[6, 1536])
        times.append(res.prediction["train_time_s"])
        assert res.calibration["model_time_s"] == pytest.approx(179_700, rel=1e-12)
    # strictly faster with more network bandwidth; never the paper's 853 s copied back
    assert all(a > b for a, b in zip(times, times[1:]))
    assert all(t != 853 for t in times)
    slower = S.run_model(w, i3d, replace(c, inter_latency=50e-6), counts=[6, 1536])
    assert slower.prediction["train_time_s"] > S.run_model(w, i3d, c, counts=[6, 1536]).prediction["train_time_s"]
    # with the same epochs at both scales, epochs cancel except in the communication term:
    # T(1536) = 20/5000 * T(6) + epochs * 20 * (comm(1536) - comm(6)), linear in epochs
    t = {e: S.run_model(replace(w, epochs=e), replace(i3d, epochs=e), c, counts=[6, 1536])
         .prediction["train_time_s"] for e in (25, 50, 100)}
    assert t[100] - t[50] == pytest.approx(2 * (t[50] - t[25]), rel=1e-9)
    assert t[25] > 20 / 5000 * 179_700


def test_curve_monotone_and_tsm_vs_i3d():
    w, c = tsm_workload(), S.CLUSTERS["summit"]
    i3d = replace(w, label="I3D", params=28_000_000, frames=32, compute_ratio=1.8)
    counts = S.gpu_counts(6, 3072, 6)
    assert counts == [6, 12, 24, 48, 96, 192, 384, 768, 1536, 3072]
    res = S.run_model(w, i3d, c, counts=counts)
    for label in ("TSM-R50 8f", "I3D"):
        rows = [r for r in res.curve if r["model"] == label]
        t = [r["train_time_s"] for r in rows]
        eff = [r["efficiency"] for r in rows]
        assert all(a > b for a, b in zip(t, t[1:]))                 # more GPUs, less time
        assert eff[0] == pytest.approx(1.0) and all(e <= 1.0 + 1e-12 for e in eff)
        assert all(a >= b - 1e-12 for a, b in zip(eff, eff[1:]))    # efficiency never rises
        assert all(r["train_time_s"] >= r["ideal_time_s"] * (1 - 1e-12) for r in rows)
    d = res.tsm_vs_i3d
    assert d["i3d_time_s"] > d["tsm_time_s"] and d["i3d_grad_bytes"] > d["tsm_grad_bytes"]
    # wire formats: fp32 > bf16 > 1-bit in exposed communication and time
    by = {r["what_if"]: r for r in res.whatifs if r["model"] == "TSM-R50 8f"}
    assert by["baseline fp32 comm"]["train_time_s"] > by["bf16 comm"]["train_time_s"] > by["1-bit comm"]["train_time_s"]
    assert by["h100 fp32 comm"]["train_time_s"] < by["baseline fp32 comm"]["train_time_s"]
    # a slow filer makes the 32-frame I3D data-bound while 8-frame TSM is not
    filer = [r for r in res.whatifs if r["what_if"].startswith("shared storage")]
    assert {r["model"]: r["bound"] for r in filer} == {"TSM-R50 8f": "compute+comm", "I3D": "data"}


def test_data_bound_step_and_calibration_error():
    c = S.CLUSTERS["summit"]
    w = tsm_workload(decode_fps_per_core=1.0)       # 64 frames on 7 cores at 1 frame/s
    row = S.step_breakdown(w, c, 6, 0.5)
    assert row["bound"] == "data" and row["step_s"] == pytest.approx(64 / 7)
    with pytest.raises(ValueError, match="data-bound"):
        S.calibrate(w, c, gpus=6, time_s=179_700)
    with pytest.raises(ValueError, match="no time for compute"):
        S.calibrate(tsm_workload(), replace(c, intra_bw=1.0), gpus=6, time_s=179_700)


def test_bench_inputs_reads_other_benches(tmp_path):
    assert S.bench_inputs(tmp_path) == {"notes": []}
    (tmp_path / "models.json").write_text("{not json")
    assert S.bench_inputs(tmp_path) == {"notes": []}
    # the columns tsm_ds.bench.models writes
    (tmp_path / "models.json").write_text(json.dumps({"rows": [
        {"model": "TSN-R50", "frames": 8, "params_M": 24.33, "grad_MB_fp32": 97.310528,
         "train_clips_per_s": 9.0, "GMACs_per_clip": 32.0},
        {"model": "TSM-R50", "frames": 8, "params_M": 24.33, "grad_MB_fp32": 97.310528,
         "train_clips_per_s": 2.0, "GMACs_per_clip": 32.7},
        {"model": "I3D-R50-8f", "frames": 8, "params_M": 28.04, "train_clips_per_s": 3.0},
        {"model": "I3D-R50-32f", "frames": 32, "params_M": 28.043472, "train_clips_per_s": 0.5,
         "GMACs_per_clip": 98.1}]}))
    found = S.bench_inputs(tmp_path)
    assert found["tsm_params"] == 24_327_632            # 97.310528 MB / 4 bytes
    assert found["i3d_params"] == 28_043_472
    assert found["i3d_compute_ratio_measured"] == pytest.approx(4.0)
    assert found["i3d_macs_ratio"] == pytest.approx(3.0)
    # the columns tsm_ds.bench.comm writes
    (tmp_path / "comm.json").write_text(json.dumps({"meta": {"world_size": 2}, "rows": [
        {"method": "fp32", "bytes_sent_per_rank": 97.3e6, "bytes_ratio_vs_fp32": 1.0},
        {"method": "onebit", "bytes_sent_per_rank": 3.05e6, "bytes_ratio_vs_fp32": 31.9}]}))
    assert S.bench_inputs(tmp_path)["onebit_ratio"] == 31.9
    # the columns tsm_ds.bench.data writes: our loader on the real clips, 8 frames, 1 thread
    (tmp_path / "data.json").write_text(json.dumps({"rows": [
        {"input": "real clips (17)", "loader": "decode_all", "clips_per_s": 17.0},
        {"input": "1-min 360p, keyframe every 250", "loader": "tsm_ds", "clips_per_s": 3.0},
        {"input": "real clips (17)", "loader": "tsm_ds", "clips_per_s": 25.0}]}))
    assert S.bench_inputs(tmp_path)["decode_fps_per_core"] == 200.0


def test_model_sizes_match_the_models_package():
    """The stated parameter counts are the ones build_model gives (400 classes)."""
    import torch

    from tsm_ds.models import build_model

    for key, arch, t, shift in (("tsm", "resnet50", 8, "bidirectional"), ("i3d", "i3d_resnet50", 32, None)):
        with torch.device("meta"):  # shapes only: no weight initialisation
            m = build_model(arch, 400, num_segments=t, shift=shift)
        assert sum(p.numel() for p in m.parameters() if p.requires_grad) == S.MODELS[key]["params"]


def test_calibrate_on_summit_predict_h100():
    w = tsm_workload()
    summit, h100 = S.CLUSTERS["summit"], S.CLUSTERS["h100"]
    res = S.run_model(w, w, h100, counts=[6, 1536], calib_cluster=summit, paper_time_s=None)
    ref = res.calibration["ref_compute_s_per_step"]
    assert res.calibration["model_time_s"] == pytest.approx(179_700, rel=1e-12)
    assert res.prediction["compute_s"] == pytest.approx(ref / h100.compute_speedup, rel=1e-12)
    assert "error_pct" not in res.prediction and res.sensitivity == []
    # 1,536 GPUs on 8-GPU nodes: 192 nodes in the inter-node ring
    b = 24_300_000 * 4.0
    assert res.prediction["comm_inter_s"] == pytest.approx(
        2 * 191 / 192 * b / 400e9 + 2 * 191 * 5e-6 * math.ceil(b / (25 * 2**20)), rel=1e-12)
