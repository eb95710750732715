"""Multi-process engine behaviour with the real Trainer on a tiny model (CPU, gloo, fp32).

- gradient accumulation x world size: 1 rank x batch 2B == 2 ranks x B == 1 rank x B x accumulation 2
  (dropout 0, BatchNorm frozen, augmentation a pure function of (seed, index));
- parameters identical across ranks after training steps, BN running stats too after the sync;
- per-group lrs inside the DeepSpeed engine follow the client schedule at every step;
- resume after a SIGKILL in the middle of an epoch ends with the same weights as an
  uninterrupted run (dropout on, DataLoader worker, saves every 3 steps in both runs);
- ``gather_predictions`` counts every validation clip once with 1 and 2 ranks.

The worker half of this file runs as ``python tests/engine/test_engine_dist.py SCENARIOS.json`` with
RANK / WORLD_SIZE / MASTER_* set, one process per rank.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tsm_ds.utils.node import free_port

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "ds_configs" / "cpu_fp32.json"
B = 2


class Tiny(nn.Module):
    """(N, T, 3, 8, 8) -> (N, classes): conv, BN, ReLU, average, dropout, fc head (``new_fc``)."""

    def __init__(self, classes=3, dropout=0.0, frozen_bn=True):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(dropout)
        self.new_fc = nn.Linear(4, classes)
        self.frozen_bn = frozen_bn
        self.config = {"arch": "tiny", "num_classes": classes}
        if frozen_bn:
            for p in self.bn.parameters():
                p.requires_grad_(False)

    def train(self, mode=True):
        super().train(mode)
        if self.frozen_bn:
            self.bn.eval()
        return self

    def forward(self, x):
        n, t = x.shape[:2]
        y = self.bn(self.conv(x.flatten(0, 1))).relu().mean((2, 3))
        return self.new_fc(self.drop(y)).view(n, t, -1).mean(1)


class Clips(torch.utils.data.Dataset):
    """Items in VideoClipDataset's format; the clip depends on (seed, epoch, index) only."""

    def __init__(self, n, seed=0):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + i)
        x = torch.randn(2, 3, 8, 8, generator=g)
        label = i % 3
        x[:, label] += 1.0
        return {"clip": x, "label": label, "index": i, "bad": 0}


def tiny_groups(m, weight_decay):
    """fc x5 / bias x10 like the official recipe; BN frozen parameters left out."""
    gs = [{"params": [m.conv.weight], "weight_decay": weight_decay, "lr_mult": 1.0, "name": "weight"},
          {"params": [m.conv.bias], "weight_decay": 0.0, "lr_mult": 2.0, "name": "bias"},
          {"params": [p for p in m.bn.parameters() if p.requires_grad], "weight_decay": 0.0, "lr_mult": 1.0,
           "name": "bn"},
          {"params": [m.new_fc.weight], "weight_decay": weight_decay, "lr_mult": 5.0, "name": "fc_weight"},
          {"params": [m.new_fc.bias], "weight_decay": 0.0, "lr_mult": 10.0, "name": "fc_bias"}]
    return [g for g in gs if g["params"]]


# ---------------------------------------------------------------- worker side
def _run_scenario(sc: dict) -> None:
    import torch.distributed as dist

    from tsm_ds.config import tree_with
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.engine.loop.evaluate import gather_predictions
    from tsm_ds.engine.loop.trainer import Trainer, TrainSettings
    out = Path(sc["out"])
    if sc["kind"] == "eval":
        from torch.utils.data import DataLoader, DistributedSampler
        torch.manual_seed(0)
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        model = Tiny()
        ds = Clips(sc["n"], seed=5)
        loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, dist.get_world_size(), dist.get_rank(),
                                                                         shuffle=False))
        idx, scores, labels = gather_predictions(model, loader)
        torch.save({"idx": idx, "scores": scores, "labels": labels, "state": model.state_dict()},
                   out / f"eval_rank{dist.get_rank()}.pt")
        return
    torch.manual_seed(sc.get("seed", 0))
    model = Tiny(dropout=sc.get("dropout", 0.0), frozen_bn=sc.get("frozen_bn", True))
    lrs = []

    def cb(step, info):
        lrs.append([step] + list(info["lrs"]))
        if step == sc.get("kill_at_step"):
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill: no cleanup, no save

    config = tree_with({"schedule.epochs": sc["epochs"], "schedule.max_steps": sc.get("max_steps"),
                        "schedule.seed": sc.get("seed", 0), "data.num_workers": sc.get("num_workers", 0),
                        "output.resume": sc.get("resume"), "output.save_every_steps": sc.get("save_every_steps", 0),
                        "logging.progress": False, **{f"schedule.{k}": v for k, v in sc["flags"].items()}})
    settings = TrainSettings(run_dir=Path(sc["run_dir"]), config=config, class_names=["a", "b", "c"], step_callback=cb)
    recipe = REPO / "ds_configs" / sc["recipe"] if "recipe" in sc else RECIPE
    from tsm_ds.engine.config import resolve as cfgmod
    calls = []
    real_resolve = cfgmod.resolve_config
    cfgmod.resolve_config = lambda *a, **k: calls.append(1) or real_resolve(*a, **k)   # count the config passes
    tr = Trainer(model, Clips(sc["n"]), Clips(5, seed=9), load_config(recipe), settings, param_groups=tiny_groups)
    tr.fit()
    cfgmod.resolve_config = real_resolve
    rank = dist.get_rank()
    torch.save({"params": {k: v.detach().clone() for k, v in tr.parts.engine.module.named_parameters()},
                "buffers": {k: v.clone() for k, v in tr.parts.engine.module.named_buffers()},
                "lrs": lrs, "names": tr.parts.group_names, "step": tr.state.step, "resolve_calls": len(calls)},
               out / f"{sc['name']}_rank{rank}.pt")


def _worker_main(path: str) -> None:
    for sc in json.loads(Path(path).read_text()):
        _run_scenario(sc)


# ---------------------------------------------------------------- test side
def _launch(scenarios: list[dict], world: int, tmp: Path, tag: str) -> list[subprocess.Popen]:
    spec = tmp / f"{tag}.json"
    spec.write_text(json.dumps(scenarios))
    port = str(free_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(REPO))
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__)), str(spec)], env=env, cwd=str(tmp),
                                      stdout=open(tmp / f"{tag}_rank{r}.log", "w"), stderr=subprocess.STDOUT))
        procs[-1].master_port = port
    return procs


def _wait(procs, tmp, tag, expect_rc=0):
    for r, p in enumerate(procs):
        rc = p.wait(timeout=600)
        if expect_rc is not None and rc != expect_rc:
            raise AssertionError(f"{tag} rank {r} exited {rc}:\n" + (tmp / f"{tag}_rank{r}.log").read_text()[-4000:])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All worker processes of this module, started together (2 cores: ~1 min in all)."""
    tmp = tmp_path_factory.mktemp("engine_dist")
    # same global batch 2B, 3 optimizer steps, 24 clips: every step sees the same clips in every layout
    common = {"out": str(tmp), "n": 24, "epochs": 1, "max_steps": 3, "dropout": 0.0}
    one = [dict(common, kind="train", name="w1_b2B", run_dir=str(tmp / "w1_b2B"),
                flags={"batch_size": 2 * B, "micro_batch_size": 2 * B, "lr": 0.2, "lr_steps": [1]}),
           dict(common, kind="train", name="w1_accum2", run_dir=str(tmp / "w1_accum2"),
                flags={"batch_size": 2 * B, "micro_batch_size": B, "lr": 0.2, "lr_steps": [1]}),
           # the uninterrupted reference for the resume test: 16 clips / micro 2 = 8 steps per epoch
           dict(kind="train", out=str(tmp), name="uninterrupted", run_dir=str(tmp / "uninterrupted"), n=16,
                epochs=2, dropout=0.5, frozen_bn=False, num_workers=1, save_every_steps=3,
                flags={"batch_size": 2, "micro_batch_size": 2, "lr": 0.1, "lr_steps": [1]}),
           {"kind": "eval", "out": str(tmp / "eval1"), "n": 7}]
    (tmp / "eval1").mkdir()
    (tmp / "eval2").mkdir()
    two = [dict(common, kind="train", name="w2_bB", run_dir=str(tmp / "w2_bB"),
                flags={"batch_size": 2 * B, "micro_batch_size": B, "lr": 0.2, "lr_steps": [1]}),
           dict(common, kind="train", name="w2_bn", run_dir=str(tmp / "w2_bn"), frozen_bn=False,
                flags={"batch_size": 2 * B, "micro_batch_size": B, "lr": 0.2, "lr_steps": [1]}),
           {"kind": "eval", "out": str(tmp / "eval2"), "n": 7}]
    # the CPU recipes, 2 ranks, 2 steps each (BN trained: bf16 buffers must work)
    for recipe in RECIPES_2RANK:
        flags = {"batch_size": 2 * B, "micro_batch_size": B}
        # LARS scales each layer's step by trust_coeff x |w| / |g| (0.001): it needs a large lr
        flags.update({"cpu_lamb.json": {"warmup_steps": 1, "lr": 0.05},
                      "cpu_lars.json": {"warmup_steps": 1, "lr": 2.0}}.get(recipe, {"lr": 0.2, "lr_steps": [1]}))
        two.append(dict(common, kind="train", name=recipe, run_dir=str(tmp / recipe), frozen_bn=False, max_steps=2,
                        recipe=recipe, flags=flags))
    # gradient compression through the trainer (the compression helper's recipe, all values fixed)
    two.append(dict(common, kind="train", name="cpu_fp32_onebit.json", run_dir=str(tmp / "onebit"), n=64,
                    frozen_bn=False, max_steps=2, recipe="cpu_fp32_onebit.json", flags={}))
    killed = [dict(one[2], name="killed", run_dir=str(tmp / "resumed"), kill_at_step=11)]
    p1 = _launch(one, 1, tmp, "one")
    p2 = _launch(two, 2, tmp, "two")
    pk = _launch(killed, 1, tmp, "killed")
    _wait(pk, tmp, "killed", expect_rc=-signal.SIGKILL)
    # a SIGKILLed rank cannot remove DeepSpeed's 69 MB /dev/shm all-reduce buffer: the test does
    for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{pk[0].master_port}_*"):
        f.unlink(missing_ok=True)
    resumed = [dict(one[2], name="resumed", run_dir=str(tmp / "resumed"), resume="auto")]
    pr = _launch(resumed, 1, tmp, "resumed")
    for procs, tag in ((p1, "one"), (p2, "two"), (pr, "resumed")):
        _wait(procs, tmp, tag)
    return tmp


def _load(tmp, name, rank=0):
    return torch.load(tmp / f"{name}_rank{rank}.pt", weights_only=False)


@pytest.mark.slow
def test_accumulation_and_world_size_equivalence(runs):
    ref = _load(runs, "w1_b2B")
    assert ref["step"] == 3
    for other in ("w1_accum2", "w2_bB"):
        o = _load(runs, other)
        assert o["step"] == 3
        for k, v in ref["params"].items():
            torch.testing.assert_close(o["params"][k], v, atol=2e-6, rtol=1e-5, msg=f"{other}: {k}")
    # training moved the weights (the comparison is not of untouched initial values)
    torch.manual_seed(0)
    init = dict(Tiny().named_parameters())
    assert (ref["params"]["new_fc.weight"] - init["new_fc.weight"]).abs().max() > 1e-3


@pytest.mark.slow
def test_config_resolved_once_and_run_files(runs):
    """One config pass per start (1 and 2 ranks); result.json and the provenance in config.json."""
    import socket as _socket

    for name, world in (("w1_b2B", 1), ("w2_bB", 2), ("cpu_zero1.json", 2)):
        for rank in range(world):
            assert _load(runs, name, rank)["resolve_calls"] == 1, (name, rank)
    run = runs / "w2_bB"
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "completed" and result["steps"] == 3 and result["run_dir"] == str(run)
    assert result["val_clips"] == 5 and result["rollbacks"] == 0 and len(result["history"]) == 1
    prov = json.loads((run / "config.json").read_text())["provenance"]
    assert prov["hosts"] == [_socket.gethostname()] * 2
    assert torch.__version__.startswith(prov["packages"]["torch"]) and prov["packages"]["deepspeed"] == "0.19.8"
    assert prov["git_commit"] is None or len(prov["git_commit"]) == 40


@pytest.mark.slow
def test_parameters_and_bn_stats_identical_across_ranks(runs):
    for name in ("w2_bB", "w2_bn"):
        r0, r1 = _load(runs, name, 0), _load(runs, name, 1)
        for k in r0["params"]:
            assert torch.equal(r0["params"][k], r1["params"][k]), f"{name}: {k} differs across ranks"
    b0, b1 = _load(runs, "w2_bn", 0)["buffers"], _load(runs, "w2_bn", 1)["buffers"]
    assert torch.equal(b0["bn.running_mean"], b1["bn.running_mean"])
    assert torch.equal(b0["bn.running_var"], b1["bn.running_var"])
    assert not torch.equal(b0["bn.running_mean"], torch.zeros(4))  # BN did train


RECIPES_2RANK = ["cpu_bf16.json", "cpu_bf16_autocast.json", "cpu_zero1.json", "cpu_comm_bf16.json",
                 "cpu_lamb.json", "cpu_lars.json", "cpu_fp32_onebit.json"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES_2RANK)
def test_cpu_recipes_two_ranks(runs, recipe):
    r0, r1 = _load(runs, recipe, 0), _load(runs, recipe, 1)
    assert r0["step"] == 2
    torch.manual_seed(0)
    init = dict(Tiny(frozen_bn=False).named_parameters())
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), f"{recipe}: {k} differs across ranks"
        assert torch.isfinite(r0["params"][k].float()).all()
    moved = (r0["params"]["new_fc.weight"].float() - init["new_fc.weight"]).abs().max()
    assert moved > 1e-4, f"{recipe}: the fc weight did not move"
    if recipe == "cpu_bf16.json":
        assert r0["params"]["conv.weight"].dtype == torch.bfloat16
        assert r0["buffers"]["bn.running_mean"].dtype == torch.bfloat16  # data_types.buffer_dtype
    if recipe == "cpu_fp32_onebit.json":  # the compressor's state is in every rank's checkpoint file
        for r in (0, 1):
            st = torch.load(runs / "onebit" / "checkpoints" / "step00000002" / f"rank{r:05d}.pt", weights_only=False)
            assert "compressor" in st and st["rank"] == r
    if recipe == "cpu_bf16_autocast.json":
        assert r0["params"]["conv.weight"].dtype == torch.float32


@pytest.mark.slow
def test_per_group_lr_inside_engine(runs):
    r = _load(runs, "w1_accum2")
    mults = {"weight": 1.0, "bias": 2.0, "fc_weight": 5.0, "fc_bias": 10.0}
    assert r["names"] == list(mults)
    # 24 clips / global 4 = 6 steps per epoch; decay at "epoch 1" = step 6: lr 0.2 for steps 1..3
    # get_lr after step s is the lr of step s+1; all three within the first epoch
    assert [row[0] for row in r["lrs"]] == [1, 2, 3]
    for row in r["lrs"]:
        assert row[1:] == pytest.approx([0.2 * m for m in mults.values()])
    u = _load(runs, "uninterrupted")
    # 8 steps per epoch, decay x0.1 from step 8 on (epoch 1)
    for row in u["lrs"]:
        f = 0.1 if row[0] >= 8 else 1.0
        assert row[1:] == pytest.approx([0.1 * f * m for m in (1.0, 2.0, 1.0, 5.0, 10.0)])


@pytest.mark.slow
def test_resume_after_mid_epoch_kill_matches_uninterrupted(runs):
    u, r = _load(runs, "uninterrupted"), _load(runs, "resumed")
    assert u["step"] == r["step"] == 16
    # the resumed process started from step 9 (saved before the kill at step 11)
    assert [row[0] for row in r["lrs"]] == list(range(10, 17))
    tags = sorted(p.name for p in (runs / "resumed" / "checkpoints").iterdir() if p.is_dir())
    assert "step00000016" in tags
    for k, v in u["params"].items():
        assert torch.equal(r["params"][k], v), f"{k} differs after resume"
    for k, v in u["buffers"].items():
        assert torch.equal(r["buffers"][k], v), f"{k} differs after resume"


@pytest.mark.slow
def test_eval_counts_every_sample_once(runs):
    e1 = torch.load(runs / "eval1" / "eval_rank0.pt", weights_only=False)
    e2 = [torch.load(runs / "eval2" / f"eval_rank{r}.pt", weights_only=False) for r in (0, 1)]
    # 7 clips, 2 ranks: DistributedSampler pads rank 1 with clip 0; it must not be counted twice
    assert e1["idx"].tolist() == list(range(7))
    for e in e2:
        assert e["idx"].tolist() == list(range(7))
        assert e["labels"].tolist() == [i % 3 for i in range(7)]
        torch.testing.assert_close(e["scores"], e1["scores"])
    # the scores are the model's, sample by sample
    m = Tiny()
    m.load_state_dict(e1["state"])
    m.eval()
    ds = Clips(7, seed=5)
    with torch.no_grad():
        direct = torch.cat([m(ds[i]["clip"][None]) for i in range(7)])
    torch.testing.assert_close(e1["scores"], direct)


def test_topk_accuracy_and_single_process_gather():
    from tsm_ds.engine.loop.evaluate import gather_predictions, topk_accuracy
    scores = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.15, 0.05], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    labels = torch.tensor([1, 1, 0, 2])
    acc = topk_accuracy(scores, labels, ks=(1, 2))
    # top-1: row 0 only; top-2 adds row 1 (label 1 second); rows 2, 3 miss
    assert acc == {"count": 4, "top1": 25.0, "top2": 50.0}
    assert topk_accuracy(scores, labels, ks=(5,))["top5"] == 100.0  # k > classes: all
    # no process group: world of one; a loader whose batches repeat index 2 (padding) counts it once
    batches = [{"clip": torch.zeros(2, 2, 3, 8, 8), "label": torch.tensor([0, 1]), "index": torch.tensor([0, 2])},
               {"clip": torch.ones(2, 2, 3, 8, 8), "label": torch.tensor([2, 0]), "index": torch.tensor([1, 2])}]
    idx, sc, lab = gather_predictions(Tiny(), batches)
    assert idx.tolist() == [0, 1, 2] and lab.tolist() == [0, 2, 1] and sc.shape == (3, 3)
    with pytest.raises(KeyError, match="index"):
        gather_predictions(Tiny(), [{"clip": torch.zeros(1, 2, 3, 8, 8), "label": torch.tensor([0])}])


class _MeanPerChannel(nn.Module):
    """(N, T, 3, H, W) -> (N, 3): the mean of each channel, so the scores are the model's input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x.mean((1, 3, 4)) * self.w


def test_gather_predictions_normalises_uint8_batches_with_the_datasets_values():
    from torch.utils.data import DataLoader

    from tsm_ds.data.transforms import normalize_batch
    from tsm_ds.engine.loop.evaluate import gather_predictions, validate

    class U8:   # a dataset of uint8 items with its own normalisation
        normalization = ((0.5, 0.25, 0.0), (0.5, 0.5, 1.0))

        def __len__(self):
            return 3

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"clip": torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8, generator=g), "label": i,
                    "index": i}

    ds = U8()
    loader = DataLoader(ds, batch_size=2)
    _, sc, _ = gather_predictions(_MeanPerChannel(), loader)
    want = torch.stack([normalize_batch(ds[i]["clip"], *ds.normalization).mean((0, 2, 3)) for i in range(3)])
    assert torch.equal(sc, want)
    # and not with ImageNet's: the dataset's values are the ones used
    assert not torch.allclose(sc, torch.stack([normalize_batch(ds[i]["clip"]).mean((0, 2, 3)) for i in range(3)]))
    # validate passes the dataset's normalisation through the progress wrapper (a generator)
    res = validate(_MeanPerChannel(), loader, ds, progress=lambda items: (b for b in items))
    assert res["count"] == 3 and res["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(
        want, torch.arange(3))))


if __name__ == "__main__":
    _worker_main(sys.argv[1])
