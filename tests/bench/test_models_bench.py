"""``tsm-ds bench models`` at a toy size: the report's bookkeeping (not its timings)."""
import json

import torch

from tsm_ds.cli import bench_models as bench


def test_bench_models_tiny(tmp_path):
    old = torch.get_num_threads()
    try:
        rc = bench.main(["--models", "TSM-R50,TSN-R50", "--img-size", "32", "--batch", "1",
                         "--frames", "2", "--reps", "1", "--shift-sizes", "32", "--threads", "1",
                         "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(old)
    assert rc == 0
    rows = {r["model"]: r for r in json.loads((tmp_path / "models.json").read_text())["rows"]}
    tsm, tsn = rows["TSM-R50"], rows["TSN-R50"]
    assert tsm["GMACs_per_clip"] == tsn["GMACs_per_clip"] > 0        # the shift adds no MACs
    assert tsm["GFLOPs_per_clip"] == 2 * tsm["GMACs_per_clip"]
    assert round(tsm["params_M"], 2) == 24.33
    assert tsm["grad_MB_fp32"] == 2 * tsm["grad_MB_bf16"] == tsm["params_M"] * 4
    assert tsm["train_throughput_vs_TSM"] == 1.0
    over = json.loads((tmp_path / "shift_overhead.json").read_text())["rows"]
    assert {r["variant"] for r in over} == {"TSM (fused shift)", "TSM (official out-of-place shift)",
                                            "TSN (no shift)"}
    op = json.loads((tmp_path / "shift_op.json").read_text())["rows"]
    assert {r["op"] for r in op} >= {"official out-of-place (zeros_like + slices)",
                                     "fused path: in-place shift + restore"}
