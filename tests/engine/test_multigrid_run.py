"""A run with a multigrid shape schedule (``--multigrid long+short``) through the Trainer and the
DeepSpeed engine: every optimizer step trains on the clips, clip shapes and global batch the
schedule gives it, with the stage's lr factor; evaluation runs at the base shape after precise
BatchNorm statistics; a checkpoint written mid-cycle on 2 ranks resumes on 1 rank with the same
shapes and samples as the uninterrupted run on 1 rank.

The schedule (base T=4, crop 32, global batch 4, 4 epochs with an lr step at 2, PySlowFast's long
and short cycles, epoch factor 1.5, 48 clips): 6 epochs, 18 optimizer steps; epochs 0-2 at T=2
(crops 16 / 24 at batch 32 / 16, lr x4 then x2), epochs 3-5 at T=4 (crops 16 / 24 / 32 / 16 at
batch 16 / 8 / 4 / 16, lr x1 then x0.1). The 2-rank run stops after step 12, two steps into
epoch 4's short cycle.

The worker half runs as ``deepspeed --num_gpus W tests/engine/test_multigrid_run.py --spec JSON``.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from worker_launch import launch_worker  # tests/engine on sys.path (the test's folder)

REPO = Path(__file__).resolve().parents[2]
N_CLIPS, GLOBAL, SEED, T, CROP = 48, 4, 3, 4, 32


class Tiny(nn.Module):
    """(N, T, 3, H, W) of any T, H, W -> (N, 3): conv, BatchNorm, average, fc head (``new_fc``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.new_fc = nn.Linear(4, 3)
        self.config = {"arch": "tiny", "num_classes": 3, "num_segments": T}

    def forward(self, x):
        n, t = x.shape[:2]
        return self.new_fc(self.bn(self.conv(x.flatten(0, 1))).relu().mean((2, 3))).view(n, t, -1).mean(1)


class Clips(torch.utils.data.Dataset):
    """Synthetic clips of (index) or (index, T, crop) items; records the (index, T, crop) items it is
    asked for (the training steps'; precise BatchNorm asks for plain indices)."""

    num_segments, img_size = T, CROP

    def __init__(self, n, seed=0):
        self.n, self.seed, self.epoch, self.seen = n, seed, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, item):
        shaped = isinstance(item, (tuple, list))   # the schedule's items; plain ones: precise BN's base shape
        i, t, c = item if shaped else (item, T, CROP)
        if shaped:
            self.seen.append([int(i), int(t), int(c)])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + i)
        x = torch.randn(t, 3, c, c, generator=g)
        x[:, i % 3] += 1.0
        return {"clip": x, "label": i % 3, "index": i, "bad": 0}


def _groups(m, weight_decay):
    return [{"params": [m.conv.weight, m.bn.weight, m.new_fc.weight], "weight_decay": weight_decay,
             "lr_mult": 1.0, "name": "weight"},
            {"params": [m.conv.bias, m.bn.bias, m.new_fc.bias], "weight_decay": 0.0, "lr_mult": 1.0, "name": "bias"}]


def _rank_main(spec: dict) -> None:
    import logging

    import torch.distributed as dist

    from tsm_ds.config import tree_with
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.engine.loop.trainer import Trainer, TrainSettings

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = Clips(N_CLIPS)
    steps: dict[int, dict] = {}

    def record(step, info):   # what this rank loaded for this optimizer step, and the step's metrics
        m = info["metrics"]
        steps[step] = {"items": list(data.seen), "lr": m["lr/weight"], "lr_factor": m["multigrid/lr_factor"],
                       "global_batch": m["multigrid/global_batch"]}
        data.seen[:] = []

    config = tree_with({"schedule.epochs": 4, "schedule.max_steps": spec.get("max_steps"), "schedule.seed": SEED,
                        "data.num_workers": 0, "output.resume": spec.get("resume"), "output.save_every_steps": 2,
                        "output.keep_last": 10, "schedule.batch_size": GLOBAL, "schedule.micro_batch_size": 1,
                        "schedule.lr": 0.1, "schedule.lr_steps": [2], "schedule.warmup_steps": 0,
                        "schedule.multigrid": "long+short", "schedule.precise_bn_batches": 3,
                        "logging.progress": False})
    settings = TrainSettings(run_dir=Path(spec["run_dir"]), config=config, class_names=["a", "b", "c"],
                             step_callback=record)
    tr = Trainer(Tiny(), data, Clips(6, seed=9), load_config("cpu_fp32"), settings, param_groups=_groups)
    tr.fit()
    lay = tr.parts.layout
    out = {"steps": steps, "world": lay.world, "accum": lay.accum, "final_step": tr.state.step,
           "total_steps": lay.total_steps}
    Path(spec["out"], f"{spec['phase']}_rank{dist.get_rank() if dist.is_initialized() else 0}.json").write_text(
        json.dumps(out))


def _launch(world: int | None, spec: dict, log: Path) -> str:
    """This file's rank code on ``world`` ranks (None: one plain process): :func:`worker_launch.launch_worker`."""
    return launch_worker(__file__, world, spec, log)


def _per_step(records: list[dict]) -> dict[int, dict]:
    """{step: {"items": sorted (index, T, crop) over ranks, "lr", "lr_factor", "global_batch"}}."""
    out: dict[int, dict] = {}
    for rec in records:
        for s, r in rec["steps"].items():
            e = out.setdefault(int(s), {"items": [], "lr": r["lr"], "lr_factor": r["lr_factor"],
                                        "global_batch": r["global_batch"]})
            e["items"] += [tuple(x) for x in r["items"]]
    for e in out.values():
        e["items"].sort()
    return out


@pytest.mark.slow
def test_multigrid_run_trains_evaluates_and_resumes_mid_cycle_on_another_world_size(tmp_path):
    from tsm_ds.engine.loop.multigrid import build_schedule

    sched = build_schedule(frames=T, crop=CROP, global_batch=GLOBAL, epochs=4, lr_steps=[2], mode="long+short")
    epoch_clips = N_CLIPS
    total = sched.total_steps(epoch_clips)
    assert total == 18 and sched.epochs == 6

    ref_out = _launch(None, {"run_dir": str(tmp_path / "ref"), "out": str(tmp_path), "phase": "ref"},
                      tmp_path / "ref.log")
    run = tmp_path / "run"
    _launch(2, {"run_dir": str(run), "out": str(tmp_path), "phase": "two", "max_steps": 12}, tmp_path / "two.log")
    _launch(None, {"run_dir": str(run), "out": str(tmp_path), "phase": "one", "resume": "auto"},
            tmp_path / "one.log")
    ref = json.loads((tmp_path / "ref_rank0.json").read_text())
    two = [json.loads((tmp_path / f"two_rank{r}.json").read_text()) for r in (0, 1)]
    one = json.loads((tmp_path / "one_rank0.json").read_text())
    assert ref["total_steps"] == one["total_steps"] == total and ref["final_step"] == one["final_step"] == total
    assert (two[0]["world"], two[0]["accum"], one["world"], one["accum"]) == (2, 2, 1, 4)

    # every step of the reference trains on the schedule's shape, batch, lr factor and clips: the
    # next global-batch positions of DistributedSampler's permutation of its epoch
    want = _per_step([ref])
    assert sorted(want) == list(range(1, total + 1))
    for s, got in want.items():
        pos = sched.locate(s - 1, epoch_clips)
        perm = torch.randperm(N_CLIPS, generator=torch.Generator().manual_seed(SEED + pos.epoch)).tolist()
        clips = perm[pos.clips_before:pos.clips_before + pos.shape.global_batch]
        assert got["items"] == sorted((i, pos.shape.frames, pos.shape.crop) for i in clips), f"step {s}"
        assert got["global_batch"] == pos.shape.global_batch and got["lr_factor"] == pos.lr_factor, f"step {s}"
        assert got["lr"] == pytest.approx(0.1 * pos.lr_factor), f"step {s}"
    assert {(x[1], x[2]) for e in want.values() for x in e["items"]} == \
        {(2, 16), (2, 24), (4, 16), (4, 24), (4, 32)}   # long and short cycles both ran

    # 2 ranks for steps 1-12 (epoch 4 stopped two steps into its short cycle), then 1 rank: the same
    # items, shapes, batches and lrs step by step as the uninterrupted run
    got = _per_step(two + [one])
    assert sorted(_per_step(two)) == list(range(1, 13)) and sorted(_per_step([one])) == list(range(13, total + 1))
    assert got == want
    meta = json.loads((run / "checkpoints" / "step00000012" / "complete.json").read_text())
    assert (meta["epoch"], meta["samples_in_epoch"]) == (4, 16 + 8)   # two steps of epoch 4: 16 + 8 clips

    # evaluation at the base shape after precise BatchNorm over 3 base-shape micro-batches
    assert len(re.findall(r"precise BatchNorm at step \d+: statistics of 3 base-shape micro-batches", ref_out)) >= 6
    hist = json.loads((tmp_path / "ref" / "result.json").read_text())["history"]
    assert [h["epoch"] for h in hist] == list(range(6)) and all(h["val_clips"] == 6 for h in hist)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    _rank_main(json.loads(ap.parse_args().spec))
