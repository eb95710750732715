"""Resuming on another world size (:mod:`tsm_ds.engine.checkpoint.reshard`).

- the resumable sampler: at an unchanged world size the order is ``DistributedSampler``'s own (minus
  the skipped prefix); across world sizes (2 -> 1, 1 -> 2, 2 -> 3) known indices, and every clip of
  an epoch exactly once when the remainder divides evenly;
- the engine JSON of a resume on another world size: the checkpoint's global batch and micro-batch
  kept, the accumulation derived; clear errors when it cannot be kept, for a sharded optimizer state
  (ZeRO), and for older checkpoints the fall-back to the run's config.json;
- end to end (the deepspeed launcher, 2 ranks, cpu_fp32, a tiny model on synthetic clips): save in
  the middle of an epoch, resume on 1 rank: the run goes on from the right step with the same global
  batch, every optimizer step trains on the clips it would have trained on at 2 ranks, and each clip
  is seen exactly once per epoch.

The worker half runs as ``deepspeed --num_gpus W tests/engine/test_reshard.py --spec JSON``.
"""
from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from worker_launch import launch_worker  # tests/engine on sys.path (the test's folder)

REPO = Path(__file__).resolve().parents[2]
N_CLIPS, GLOBAL, SEED = 24, 4, 3   # 24 clips, 4 per step: 6 steps per epoch at every world size


# ---------------------------------------------------------------- sampler
def _sampler(n, world, rank, *, skip=0, shuffle=True, seed=0, epoch=0):
    from tsm_ds.engine.loop.loaders import ResumableDistributedSampler
    s = ResumableDistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
    s.set_epoch(epoch)
    s.skip = skip
    return s


def test_unchanged_world_is_distributed_sampler_order():
    """skip k at the same world size == torch's DistributedSampler order without its first k (as before)."""
    from torch.utils.data import DistributedSampler
    checked = 0
    for n, world, seed, epoch in itertools.product([1, 2, 5, 7, 16, 17], [1, 2, 3, 4, 8], [0, 5], [0, 3]):
        for skip in range(math.ceil(n / world) + 1):
            for rank in range(world):
                ref = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
                ref.set_epoch(epoch)
                s = _sampler(n, world, rank, skip=skip, seed=seed, epoch=epoch)
                got = list(s)
                assert got == list(ref)[skip:], (n, world, rank, skip)
                assert len(s) == len(got)
                checked += 1
    assert checked > 1000


def test_known_indices_across_world_sizes():
    """shuffle off: the epoch order is 0..N-1, so the expected shards can be written down."""
    # 2 -> 1: 10 clips, 2 per rank consumed at 2 ranks = the prefix 0..3; 1 rank goes on at 4
    assert [list(_sampler(10, 2, r, shuffle=False))[:2] for r in (0, 1)] == [[0, 2], [1, 3]]
    assert list(_sampler(10, 1, 0, skip=4, shuffle=False)) == [4, 5, 6, 7, 8, 9]
    # 1 -> 2: 7 clips, 4 consumed; the rest 4..6 is padded to 4 with the epoch's first clip, 0
    assert [list(_sampler(7, 2, r, skip=2, shuffle=False)) for r in (0, 1)] == [[4, 6], [5, 0]]
    # 2 -> 3: 11 clips, 3 per rank at 2 ranks = 6 consumed; 3 ranks share 6..10 padded with 0
    assert [list(_sampler(11, 3, r, skip=2, shuffle=False)) for r in (0, 1, 2)] == [[6, 9], [7, 10], [8, 0]]
    # the same with shuffling: positions of the epoch's permutation (DistributedSampler's: seed + epoch)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(4 + 2)).tolist()
    got = [list(_sampler(11, 3, r, skip=2, seed=4, epoch=2)) for r in (0, 1, 2)]
    assert got == [[perm[6], perm[9]], [perm[7], perm[10]], [perm[8], perm[0]]]


@pytest.mark.parametrize("n,w0,per_rank0,w1", [(24, 2, 4, 1), (24, 1, 8, 2), (24, 2, 6, 3), (30, 3, 4, 2)])
def test_prefix_then_rest_covers_epoch_once(n, w0, per_rank0, w1):
    """W0 ranks take per_rank0 clips each, W1 ranks the rest of the epoch: each clip exactly once."""
    first = [i for r in range(w0) for i in list(_sampler(n, w0, r, seed=7, epoch=1))[:per_rank0]]
    consumed = per_rank0 * w0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(7 + 1)).tolist()
    assert sorted(first) == sorted(perm[:consumed])   # the prefix of the permutation, as claimed
    rest = [i for r in range(w1) for i in _sampler(n, w1, r, skip=consumed // w1, seed=7, epoch=1)]
    assert sorted(first + rest) == list(range(n))


def test_remaining_shard_edges():
    from tsm_ds.engine.checkpoint.reshard import remaining_shard
    assert remaining_shard([3, 1, 2], 3, 0, 2) == [] == remaining_shard([3, 1, 2], 5, 1, 2)
    # 2 clips left for 4 ranks: padded by cycling the permutation's start
    assert [remaining_shard([3, 1, 2], 1, r, 4) for r in range(4)] == [[1], [2], [3], [1]]


# ---------------------------------------------------------------- engine JSON of a resume
def _fake_run(tmp: Path, *, world=2, g=8, m=2, a=2, consumed=16, meta=True, files=()):
    tag = tmp / "checkpoints" / "step00000008"
    tag.mkdir(parents=True)
    rec = {"step": 8, "world_size": world, "files": {}}
    if meta:
        rec.update(global_batch=g, micro_batch=m, accumulation=a, epoch=1, micro_in_epoch=consumed // (m * world),
                   samples_in_epoch=consumed)
    (tag / "complete.json").write_text(json.dumps(rec))
    (tmp / "checkpoints" / "latest").write_text(tag.name)
    for f in files:
        (tag / f).write_bytes(b"x")
    return tag


def _resolve(tmp, raw, world, flags, samples=64):
    from tsm_ds.engine.checkpoint.reshard import annotate_filled, resume_engine_inputs
    from tsm_ds.engine.config import resolve as cfgmod
    raw2, flags2, plan = resume_engine_inputs(raw, flags, run_dir=tmp, resume="auto", world=world)
    ds, tsm, filled, spe = cfgmod.resolve_config(raw2, world_size=world, train_samples=samples, epochs=2,
                                                 lr_mults=[1.0, 5.0], flags=flags2)
    annotate_filled(filled, plan)
    return ds, filled, plan, spe


def _flags(**kw):
    from tsm_ds.engine.config.resolve import FLAG_KEYS
    return {**{k: None for k in FLAG_KEYS}, **kw}


def test_resume_keeps_global_batch_by_accumulation(tmp_path):
    from tsm_ds.engine.config.recipes import load_config
    _fake_run(tmp_path)   # 2 ranks: global 8 = micro 2 x accumulation 2 x 2
    raw = load_config("cpu_fp32")
    same = _flags(batch_size=8, micro_batch_size=2, lr=0.1)
    for world, accum in ((1, 4), (4, 1)):
        ds, filled, plan, _ = _resolve(tmp_path, raw, world, same)
        assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) \
            == (8, 2, accum)
        assert plan.accumulation == accum and "kept from step00000008" in filled["train_batch_size"]
    # the same command line on the checkpoint's world size: nothing changes (and no plan)
    ds, filled, plan, _ = _resolve(tmp_path, raw, 2, same)
    assert plan is None and ds["gradient_accumulation_steps"] == 2 and "train_batch_size" not in filled
    # no batch flags at all: the checkpoint's batch anyway, lr by the scaling rule for 8 clips
    ds, _, _, _ = _resolve(tmp_path, raw, 1, _flags())
    assert ds["train_batch_size"] == 8 and ds["optimizer"]["params"]["lr"] == pytest.approx(0.02 * 8 / 128)
    # --grad-accum of the old world size is overridden, --micro-batch-size is honoured
    ds, _, _, _ = _resolve(tmp_path, raw, 1, _flags(grad_accum=2, micro_batch_size=1))
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (1, 8)


def test_resume_batch_that_cannot_be_kept(tmp_path):
    from tsm_ds.engine.config.recipes import ConfigError, load_config
    _fake_run(tmp_path)
    raw = load_config("cpu_fp32")
    with pytest.raises(ConfigError) as e:
        _resolve(tmp_path, raw, 3, _flags(batch_size=8, micro_batch_size=2))
    msg = str(e.value)
    assert "global batch 8 is not divisible by micro-batch 2 x 3 ranks = 6" in msg
    assert "divides 4 (1, 2, 4)" in msg and "--tune-from" in msg
    with pytest.raises(ConfigError, match="--batch-size 16 differs"):
        _resolve(tmp_path, raw, 1, _flags(batch_size=16))
    fixed = dict(raw, train_batch_size=16)
    with pytest.raises(ConfigError, match="fixes `train_batch_size` = 16, the checkpoint was trained with 8"):
        _resolve(tmp_path, fixed, 1, _flags())


def test_recipe_with_fixed_global_batch_and_accumulation(tmp_path):
    """gpu_kinetics_1536 (global 12288, micro 8 fixed) written by 1536 ranks, resumed on 768: accumulation 2.
    A recipe fixing micro-batch and accumulation: the accumulation is derived anyway."""
    from tsm_ds.engine.config.recipes import load_config
    _fake_run(tmp_path / "k", world=1536, g=12288, m=8, a=1, consumed=0)
    ds, _, plan, _ = _resolve(tmp_path / "k", load_config("gpu_kinetics_1536"), 768, _flags(), samples=240_000)
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"], plan.micro) == (12288, 2, 8)
    assert ds["optimizer"]["params"]["lr"] == pytest.approx(0.02 * 12288 / 128)
    _fake_run(tmp_path / "f", world=2, g=8, m=2, a=2)
    raw = dict(load_config("cpu_fp32"), train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2)
    ds, _, _, _ = _resolve(tmp_path / "f", raw, 1, _flags())
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (8, 4)


def test_older_checkpoint_layout_from_config_json(tmp_path):
    from tsm_ds.engine.checkpoint.reshard import read_layout
    from tsm_ds.engine.config.recipes import ConfigError, load_config
    tag = _fake_run(tmp_path, meta=False)
    with pytest.raises(ConfigError, match="does not record its batch layout.*resume on 2 ranks"):
        read_layout(tag)
    with pytest.raises(ConfigError, match="does not record its batch layout"):
        _resolve(tmp_path, load_config("cpu_fp32"), 1, _flags())
    # on its own world size nothing is read: resolved from the flags as before
    ds, _, plan, _ = _resolve(tmp_path, load_config("cpu_fp32"), 2, _flags(batch_size=8, micro_batch_size=2))
    assert plan is None and ds["gradient_accumulation_steps"] == 2
    (tmp_path / "config.json").write_text(json.dumps({"resolved_ds_config": {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}}))
    lay = read_layout(tag)
    assert (lay.world_size, lay.global_batch, lay.micro_batch, lay.samples_in_epoch) == (2, 8, 2, None)
    ds, _, _, _ = _resolve(tmp_path, load_config("cpu_fp32"), 1, _flags())
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (8, 4)


def test_damaged_manifest_left_to_the_resume_checks(tmp_path):
    """An unreadable complete.json changes nothing here: --resume auto skips the tag later."""
    from tsm_ds.engine.config.recipes import load_config
    tag = _fake_run(tmp_path)
    (tag / "complete.json").write_text("{trunc")
    ds, _, plan, _ = _resolve(tmp_path, load_config("cpu_fp32"), 1, _flags(batch_size=8, micro_batch_size=2))
    assert plan is None and ds["gradient_accumulation_steps"] == 4   # 8 / (2 x 1) from the flags


def test_sharded_optimizer_state_refused(tmp_path):
    from tsm_ds.engine.config.recipes import ConfigError, load_config
    _fake_run(tmp_path, files=["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                               "zero_pp_rank_1_mp_rank_00_optim_states.pt"])
    raw = load_config("cpu_zero1")
    with pytest.raises(ConfigError) as e:
        _resolve(tmp_path, raw, 1, _flags())
    msg = str(e.value)
    assert "ZeRO" in msg and "2 files" in msg and "Resume on 2 ranks" in msg and "--tune-from" in msg
    _resolve(tmp_path, raw, 2, _flags(batch_size=8, micro_batch_size=2))   # its own world size: fine


# ---------------------------------------------------------------- end to end (worker side)
class Tiny(nn.Module):
    """(N, T, 3, 8, 8) -> (N, 3): conv, frozen BN, average, fc head (``new_fc``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.new_fc = nn.Linear(4, 3)
        self.config = {"arch": "tiny", "num_classes": 3}

    def forward(self, x):
        n, t = x.shape[:2]
        return self.new_fc(self.conv(x.flatten(0, 1)).relu().mean((2, 3))).view(n, t, -1).mean(1)


class Clips(torch.utils.data.Dataset):
    """Synthetic clips, a function of (epoch, index); records the indices it is asked for."""

    def __init__(self, n):
        self.n, self.epoch, self.seen = n, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.seen.append(int(i))
        g = torch.Generator().manual_seed(self.epoch * 10_007 + i)
        x = torch.randn(2, 3, 8, 8, generator=g)
        x[:, i % 3] += 1.0
        return {"clip": x, "label": i % 3, "index": i, "bad": 0}


def _groups(m, weight_decay):
    return [{"params": [m.conv.weight], "weight_decay": weight_decay, "lr_mult": 1.0, "name": "weight"},
            {"params": [m.conv.bias], "weight_decay": 0.0, "lr_mult": 2.0, "name": "bias"},
            {"params": [m.new_fc.weight], "weight_decay": weight_decay, "lr_mult": 5.0, "name": "fc_weight"},
            {"params": [m.new_fc.bias], "weight_decay": 0.0, "lr_mult": 10.0, "name": "fc_bias"}]


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
    steps: dict[int, list[int]] = {}

    def record(step, info):   # the clips this rank loaded for this optimizer step
        steps[step], data.seen[:] = list(data.seen), []

    config = tree_with({"schedule.epochs": 2, "schedule.max_steps": spec.get("max_steps"), "schedule.seed": SEED,
                        "data.num_workers": 0, "output.resume": spec.get("resume"), "output.save_every_steps": 2,
                        "output.keep_last": 10, "schedule.batch_size": GLOBAL, "schedule.micro_batch_size": 1,
                        "schedule.lr": 0.1, "schedule.lr_steps": [1], "logging.progress": False})
    settings = TrainSettings(run_dir=Path(spec["run_dir"]), config=config, class_names=["a", "b", "c"],
                             step_callback=record)
    tr = Trainer(Tiny(), data, None, load_config(spec.get("recipe", "cpu_fp32")), settings, param_groups=_groups)
    tr.fit()
    lay = tr.parts.layout
    out = {"steps": steps, "world": lay.world, "accum": lay.accum, "global_batch": lay.global_batch,
           "final_step": tr.state.step}
    Path(spec["out"], f"{spec['phase']}_rank{dist.get_rank()}.json").write_text(json.dumps(out))


# ---------------------------------------------------------------- end to end (test side)
def _launch(world: int | None, spec: dict, log: Path) -> str:
    """This file's rank code on ``world`` ranks (None: one plain process): :func:`worker_launch.launch_worker`."""
    return launch_worker(__file__, world, spec, log)


@pytest.mark.slow
def test_save_on_two_ranks_resume_on_one(tmp_path):
    run = tmp_path / "run"
    common = {"run_dir": str(run), "out": str(tmp_path)}
    _launch(2, dict(common, phase="two", max_steps=8), tmp_path / "two.log")   # stops at step 8: epoch 1, step 2 of 6
    out = _launch(None, dict(common, phase="one", resume="auto"), tmp_path / "one.log")   # plain python: 1 rank
    two = [json.loads((tmp_path / f"two_rank{r}.json").read_text()) for r in (0, 1)]
    one = json.loads((tmp_path / "one_rank0.json").read_text())

    # the checkpoint records its batch layout and the global position in the epoch
    meta = json.loads((run / "checkpoints" / "step00000008" / "complete.json").read_text())
    assert {k: meta[k] for k in ("world_size", "global_batch", "micro_batch", "accumulation", "epoch",
                                 "samples_in_epoch")} == {"world_size": 2, "global_batch": GLOBAL, "micro_batch": 1,
                                                          "accumulation": 2, "epoch": 1, "samples_in_epoch": 8}
    # the resumed run: 1 rank, the same global batch by accumulation 4, steps 9..12
    assert (two[0]["world"], two[0]["accum"], one["world"], one["accum"]) == (2, 2, 1, 4)
    assert one["global_batch"] == two[0]["global_batch"] == GLOBAL
    assert sorted(map(int, one["steps"])) == list(range(9, 13)) and one["final_step"] == 12
    first = json.loads((run / "config.json").read_text())
    resumed = [json.loads(p.read_text()) for p in run.glob("config.resumed-*.json")]
    assert len(resumed) == 1 and resumed[0]["world_size"] == 1 and first["world_size"] == 2
    assert resumed[0]["resolved_ds_config"]["train_batch_size"] == first["resolved_ds_config"]["train_batch_size"] \
        == GLOBAL
    assert resumed[0]["resolved_ds_config"]["gradient_accumulation_steps"] == 4
    assert out.count("written by 2 ranks, on 1 ranks: global batch 4 kept") == 1

    # every step trained on the clips DistributedSampler's order gives it at any world size ...
    per_step: dict[int, list[int]] = {}
    for rec in two + [one]:
        for s, idx in rec["steps"].items():
            per_step.setdefault(int(s), []).extend(idx)
    assert sorted(per_step) == list(range(1, 13))
    spe = N_CLIPS // GLOBAL
    for s, idx in per_step.items():
        epoch, k = divmod(s - 1, spe)
        perm = torch.randperm(N_CLIPS, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()
        assert sorted(idx) == sorted(perm[k * GLOBAL:(k + 1) * GLOBAL]), f"step {s}"
    # ... so each clip is seen exactly once per epoch, across the change of world size
    for epoch in (0, 1):
        seen = [i for s in range(epoch * spe + 1, (epoch + 1) * spe + 1) for i in per_step[s]]
        assert sorted(seen) == list(range(N_CLIPS)), f"epoch {epoch}"
    assert json.loads((run / "result.json").read_text())["steps"] == 12


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    _rank_main(json.loads(ap.parse_args().spec))
