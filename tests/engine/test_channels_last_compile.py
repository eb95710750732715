"""``--channels-last`` and ``--compile`` through the real Trainer, 2 ranks (CPU, gloo), tiny TSM model.

- a model handed over in channels_last (which used to crash ``deepspeed.initialize`` in
  ``_broadcast_model``) trains under cpu_fp32, cpu_bf16 and cpu_zero1 with channels-last inputs:
  the shifted convolution sees channels-last activations, the weights change after the steps
  and stay identical across ranks (bf16 / ZeRO keep their parameters as views of a flat buffer:
  re-formatting them would have frozen training), and under cpu_fp32 they match the default
  layout's run within float tolerance;
- a model wrapped by ``torch.compile`` is unwrapped and compiled through DeepSpeed's
  ``engine.compile()`` (backend ``aot_eager`` here: the same dynamo + AOTAutograd capture without
  minutes of C++ code generation; the README measures inductor): it trains, ranks agree, and the
  checkpoint and ``best_model.pt`` carry clean keys (no ``_orig_mod.``);
- ``data/bad_videos`` counts distinct unreadable files over both ranks (encounters apart), and only
  rank 0 warns, once per file (the default-layout run's items name replaced files).

The worker half of this file runs as ``python tests/engine/test_channels_last_compile.py SCENARIOS.json``
with RANK / WORLD_SIZE / MASTER_* set, one process per rank.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tsm_ds.utils.node import free_port

REPO = Path(__file__).resolve().parents[2]
RECIPES = ["cpu_fp32", "cpu_bf16", "cpu_zero1"]


class TinyTSM(nn.Module):
    """(N, 2, 3, 8, 8) -> (N, 3): conv, BN, ReLU, a fused shift conv (T=2), BN, ReLU, mean, fc."""

    def __init__(self):
        super().__init__()
        from tsm_ds.models.shift import ShiftConv2d

        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.sconv = ShiftConv2d(8, 8, 3, padding=1, bias=False, num_segments=2, shift_div=4)
        self.bn2 = nn.BatchNorm2d(8)
        self.new_fc = nn.Linear(8, 3)
        self.config = {"arch": "tiny", "num_classes": 3}

    def forward(self, x):
        n, t = x.shape[:2]
        y = self.bn(self.conv(x.flatten(0, 1))).relu()
        y = self.bn2(self.sconv(y)).relu().mean((2, 3))
        return self.new_fc(y).view(n, t, -1).mean(1)


def groups(m, weight_decay):
    """One group per kind, as the official recipe's names (all parameters trained)."""
    bn = list(m.bn.parameters()) + list(m.bn2.parameters())
    return [{"params": [m.conv.weight, m.sconv.weight], "weight_decay": weight_decay, "lr_mult": 1.0, "name": "weight"},
            {"params": [m.conv.bias], "weight_decay": 0.0, "lr_mult": 2.0, "name": "bias"},
            {"params": bn, "weight_decay": 0.0, "lr_mult": 1.0, "name": "bn"},
            {"params": [m.new_fc.weight], "weight_decay": weight_decay, "lr_mult": 5.0, "name": "fc_weight"},
            {"params": [m.new_fc.bias], "weight_decay": 0.0, "lr_mult": 10.0, "name": "fc_bias"}]


class Clips(torch.utils.data.Dataset):
    """Items in VideoClipDataset's format; the clip depends on (seed, epoch, index) only."""

    def __init__(self, n, seed=0, bad=False):
        self.n, self.seed, self.epoch = n, seed, 0
        self.bad = "bad" if bad is True else bad   # the bad files' stem (False: none)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + i)
        x = torch.randn(2, 3, 8, 8, generator=g)
        x[:, i % 3] += 1.0
        # with ``bad``: even items replaced an unreadable file: /data/bad0, bad2, bad1, bad0 for items 0, 2, 4, 6
        bad = bool(self.bad) and i % 2 == 0
        return {"clip": x, "label": i % 3, "index": i, "bad": int(bad),
                "bad_files": json.dumps([[f"/data/{self.bad}{i % 3}.mp4", "cannot open: test"]]) if bad else ""}


# ---------------------------------------------------------------- worker side
def _run_scenario(sc: dict) -> None:
    import torch.distributed as dist

    from tsm_ds.config import tree_with
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.engine.loop.model_prep import is_channels_last
    from tsm_ds.engine.loop.trainer import Trainer, TrainSettings

    torch.manual_seed(0)
    model = TinyTSM()
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    seen = []
    model.sconv.register_forward_pre_hook(lambda m, a: seen.append(is_channels_last(a[0])))
    if sc.get("cl_model"):
        model = model.to(memory_format=torch.channels_last)   # what crashed deepspeed.initialize
    if sc.get("wrap_compile"):
        model = torch.compile(model)                           # unwrapped by the trainer
    config = tree_with({"schedule.epochs": 1, "schedule.max_steps": 2, "data.num_workers": 0,
                        "schedule.batch_size": 4, "schedule.micro_batch_size": 2, "schedule.lr": 0.2,
                        "schedule.lr_steps": [1], "logging.progress": False,
                        "model.channels_last": sc.get("channels_last", False),
                        "data.max_bad_fraction": sc.get("max_bad_fraction", 0.01)})
    config.model.compile = sc.get("compile", False)   # a backend name (aot_eager) as well: prepare_model takes it
    settings = TrainSettings(run_dir=Path(sc["run_dir"]), config=config, class_names=list("abc"))
    tr = Trainer(model, Clips(8, bad=sc.get("bad", False)), Clips(4, seed=9),
                 load_config(REPO / "ds_configs" / f"{sc['recipe']}.json"),
                 settings, param_groups=groups)
    from tsm_ds.data.bad_videos import DataLossError
    try:
        tr.fit()
    except DataLossError as e:   # the data-loss budget: what each rank decided
        torch.save({"data_loss": {"step": e.step, "split": e.split, "files": sorted(e.report["files"]),
                                  "fraction": e.report["fraction"]}},
                   Path(sc["out"]) / f"{sc['name']}_rank{dist.get_rank()}.pt")
        return
    mod = tr.parts.engine.module
    torch.save({"params": {k: v.detach().float().clone() for k, v in mod.named_parameters()},
                "init": {k: v.float() for k, v in init.items()}, "seen_cl": seen,
                "compiled": bool(tr.parts.engine.is_compiled),
                "bare": type(mod).__name__, "step": tr.state.step, "bad": tr.parts.bad.state_dict(),
                "bad_metrics": [tr.state.last_metrics["data/bad_videos"],
                                tr.state.last_metrics["data/bad_video_encounters"]]},
               Path(sc["out"]) / f"{sc['name']}_rank{dist.get_rank()}.pt")


def _worker_main(path: str) -> None:
    for sc in json.loads(Path(path).read_text()):
        _run_scenario(sc)


# ---------------------------------------------------------------- test side
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cl_compile")
    scenarios = [dict(name=f"cl_{r}", recipe=r, cl_model=True, channels_last=True) for r in RECIPES]
    scenarios += [dict(name="default_cpu_fp32", recipe="cpu_fp32", bad=True, max_bad_fraction=0.5),
                  dict(name="over_budget", recipe="cpu_fp32", bad="lost"),   # the default budget, 1 %
                  dict(name="compiled", recipe="cpu_fp32", wrap_compile=True, compile="aot_eager")]
    for sc in scenarios:
        sc.update(out=str(tmp), run_dir=str(tmp / sc["name"]))
    spec = tmp / "scenarios.json"
    spec.write_text(json.dumps(scenarios))
    port = str(free_port())
    procs = []
    try:
        for r in range(2):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
                       PYTHONPATH=str(REPO))
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__)), str(spec)], env=env, cwd=str(tmp),
                                          stdout=open(tmp / f"rank{r}.log", "w"), stderr=subprocess.STDOUT))
        for r, p in enumerate(procs):
            if p.wait(timeout=600) != 0:
                raise AssertionError(f"rank {r} exited {p.returncode}:\n" + (tmp / f"rank{r}.log").read_text()[-4000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
            f.unlink(missing_ok=True)
    return tmp


def _load(tmp, name, rank):
    return torch.load(tmp / f"{name}_rank{rank}.pt", weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_channels_last_trains_and_ranks_agree(runs, recipe):
    r0, r1 = _load(runs, f"cl_{recipe}", 0), _load(runs, f"cl_{recipe}", 1)
    assert r0["step"] == 2 and r0["seen_cl"] and all(r0["seen_cl"]) and all(r1["seen_cl"])
    for k, v in r0["params"].items():
        assert torch.equal(v, r1["params"][k]), k                     # identical on both ranks
    moved = {k for k, v in r0["params"].items() if not torch.equal(v, r0["init"][k])}
    assert {"conv.weight", "sconv.weight", "new_fc.weight"} <= moved, moved   # training happened
    if recipe == "cpu_fp32":
        ref = _load(runs, "default_cpu_fp32", 0)
        assert not any(ref["seen_cl"])
        for k, v in ref["params"].items():
            torch.testing.assert_close(r0["params"][k], v, rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_bad_videos_are_distinct_files_over_ranks_warned_once(runs):
    # 8 clips, 2 ranks, 2 steps: every item once; items 0, 2, 4, 6 replaced /data/bad0, bad2, bad1, bad0
    for rank in (0, 1):
        r = _load(runs, "default_cpu_fp32", rank)
        assert sorted(r["bad"]["files"]) == ["/data/bad0.mp4", "/data/bad1.mp4", "/data/bad2.mp4"]
        assert r["bad"]["encounters"] == 4 and r["bad_metrics"] == [3, 4]
    res = json.loads((runs / "default_cpu_fp32" / "result.json").read_text())
    assert res["status"] == "completed_with_data_loss"   # within --max-bad-fraction 0.5: 3 of 8 files
    assert res["data_lost"]["train"]["count"] == 3 and res["data_lost"]["train"]["total"] == 8
    assert sorted(res["data_lost"]["train"]["files"]) == ["/data/bad0.mp4", "/data/bad1.mp4", "/data/bad2.mp4"]
    assert res["data_lost"]["val"]["count"] == 0 and res["data_lost"]["val"]["total"] == 4
    logs = [(runs / f"rank{k}.log").read_text() for k in (0, 1)]
    assert logs[1].count("unreadable video") == 0
    assert [logs[0].count(f"sample (warned once per run; {k} distinct so far): /data/bad")
            for k in (1, 2, 3)] == [1, 1, 1]


@pytest.mark.slow
def test_compiled_through_the_engine_with_clean_keys(runs):
    r0, r1 = _load(runs, "compiled", 0), _load(runs, "compiled", 1)
    assert r0["compiled"] and r0["bare"] == "TinyTSM" and r0["step"] == 2
    for k, v in r0["params"].items():
        assert torch.equal(v, r1["params"][k]), k
        assert not k.startswith("_orig_mod")
    assert not torch.equal(r0["params"]["new_fc.weight"], r0["init"]["new_fc.weight"])
    run = runs / "compiled"
    best = torch.load(run / "best_model.pt", weights_only=True)
    states = next((run / "checkpoints").glob("step*/mp_rank_00_model_states.pt"))
    ds_keys = torch.load(states, weights_only=False)["module"]
    for keys in (best["state_dict"], ds_keys):
        assert keys and not any("_orig_mod" in k for k in keys), sorted(keys)[:3]
    torch.testing.assert_close(best["state_dict"]["new_fc.weight"], r0["params"]["new_fc.weight"])


if __name__ == "__main__":
    _worker_main(sys.argv[1])


@pytest.mark.slow
def test_data_loss_over_the_budget_stops_every_rank_at_the_same_step(runs):
    """Items 0, 2, 4, 6 replace unreadable files: at the default budget (1 %) both ranks stop at
    step 1, from the same exchanged file list, and result.json says data_loss, not completed."""
    r0, r1 = _load(runs, "over_budget", 0), _load(runs, "over_budget", 1)
    assert r0["data_loss"] == r1["data_loss"]
    assert r0["data_loss"]["step"] == 1 and r0["data_loss"]["split"] == "train"
    assert r0["data_loss"]["files"] and set(r0["data_loss"]["files"]) <= {f"/data/lost{k}.mp4" for k in range(3)}
    assert r0["data_loss"]["fraction"] == len(r0["data_loss"]["files"]) / 8
    res = json.loads((runs / "over_budget" / "result.json").read_text())
    assert res["status"] == "data_loss" and res["step"] == 1 and res["max_bad_fraction"] == 0.01
    assert "--max-bad-fraction" in res["report"] and res["data_lost"]["train"]["count"] == len(r0["data_loss"]["files"])
