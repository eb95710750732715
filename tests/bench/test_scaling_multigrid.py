"""The scaling model with the multigrid schedule (tsm_ds.bench.scaling.multigrid): the schedule's steps,
the time as the sum of its steps, the step-count factor, and the fewest GPUs for the paper's time."""
from __future__ import annotations

import pytest

from tsm_ds.bench import scaling as S
from tsm_ds.bench.scaling.multigrid import base_gpus_for_time, gpus_for_time, multigrid_summary, multigrid_time
from tsm_ds.engine.loop.multigrid import build_schedule


@pytest.fixture(scope="module")
def paper():
    w = S.Workload(label="TSM-R50 8f", params=S.MODELS["tsm"]["params"], frames=8, compute_ratio=1.0)
    c = S.CLUSTERS["summit"]
    return w, c, S.calibrate(w, c, gpus=6, time_s=S.PAPER["single_node_time_s"])


def test_steps_are_the_schedules_and_time_their_sum(paper):
    w, c, ref = paper
    r = multigrid_time(w, c, 16, ref, epoch_factor=1.5)   # 128 clips a base step: docs/multigrid.md's table
    assert r["steps"] == build_schedule(frames=8, crop=224, global_batch=128, epochs=50, lr_steps=(20, 40),
                                        mode="long").total_steps(240_000) == 43_561
    assert r["base_steps"] == 93_750 and r["step_factor"] == pytest.approx(43_561 / 93_750)
    assert sum(x["steps"] for x in r["shapes"]) == r["steps"]
    assert r["train_time_s"] == pytest.approx(sum(x["steps"] * x["step_s"] for x in r["shapes"]))
    base_step = S.step_breakdown(w, c, 16, ref)["step_s"]
    for x in r["shapes"]:   # compute x clips x frames x pixels over the base's: 1.00-1.02
        assert base_step <= x["step_s"] <= 1.021 * base_step
    assert r["speedup"] == pytest.approx(r["base_time_s"] / r["train_time_s"])


def test_at_1536_gpus_and_the_fewest_for_the_papers_time(paper):
    w, c, ref = paper
    r = multigrid_time(w, c, 1536, ref, epoch_factor=1.5)
    assert r["max_global_batch"] == 98_304 and r["dropped_per_epoch_max"] == 157 * 1536 - 2 * 98_304
    assert r["base_steps"] == 1000 and r["steps"] < 0.5 * r["base_steps"]
    target = S.PAPER["large_scale_time_s"]
    g = gpus_for_time(w, c, ref, target, max_gpus=3072, epoch_factor=1.5)
    assert g["train_time_s"] <= target and g["gpus"] % 6 == 0
    assert multigrid_time(w, c, g["gpus"] - 6, ref, epoch_factor=1.5)["train_time_s"] > target
    base = base_gpus_for_time(w, c, ref, target, max_gpus=3072)
    assert S.step_breakdown(w, c, base, ref)["train_time_s"] <= target < S.step_breakdown(w, c, base - 6,
                                                                                        ref)["train_time_s"]
    rows = multigrid_summary(w, c, ref, gpus=1536, target_s=target, max_gpus=3072)
    assert [x["epoch_factor"] for x in rows] == [1.5, 1.0] and rows[0]["gpus_for_target"] == g["gpus"]
    assert rows[0]["base_gpus_for_target"] == base and rows[1]["gpus_for_target"] < g["gpus"] < base
