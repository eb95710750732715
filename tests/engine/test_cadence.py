"""Validation cadence (--eval-every) and the capped validation subset (--eval-max-clips): the
points of each form, the subset (size, the same indices at every pass, seeded), the flags' errors,
and two real tiny runs whose result.json history says at which steps evaluation ran on how many
clips (intermediate: the subset; the run's end: the whole set)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from tsm_ds.config import Config, parse, tree_with
from tsm_ds.config.cadence import parse_eval_every
from tsm_ds.config.commands import TRAIN
from tsm_ds.engine.loop.cadence import EvalCadence, subset_indices, val_subset
from tsm_ds.engine.loop.hooks import Hooks, TrainHook
from tsm_ds.engine.loop.settings import TrainSettings


def _points(every: str, steps_per_epoch: int, epochs: int) -> list[int]:
    """The global steps after which EvalCadence validates (the run's end excluded: always)."""
    c = EvalCadence(every)
    return [e * steps_per_epoch + k for e in range(epochs) for k in range(1, steps_per_epoch + 1)
            if c.validation_due(e * steps_per_epoch + k, k, steps_per_epoch)]


def test_the_three_forms_and_their_points():
    assert _points("epoch", 5, 3) == [5, 10, 15]                       # today's behaviour
    assert _points("4", 5, 3) == [4, 8, 12]                            # global steps, not epoch ends
    assert _points("0.5", 5, 2) == [3, 5, 8, 10]                       # >= half done (2.5 -> step 3), end
    assert _points("0.25", 8, 1) == [2, 4, 6, 8]
    assert _points("0.3", 10, 1) == [3, 6, 9, 10]                      # 0.3 exact (no float rounding)
    assert _points("0.1", 4, 1) == [1, 2, 3, 4]                        # more points than steps: every step
    assert parse_eval_every(" Epoch ") == ("epoch", None)


@pytest.mark.parametrize("bad", ["0", "1.0", "2.5", "-1", "abc", "0.0", "1/4", ""])
def test_bad_eval_every_names_the_flag(bad, capsys):
    with pytest.raises(ValueError, match="--eval-every"):
        parse_eval_every(bad)
    with pytest.raises(SystemExit):
        parse(TRAIN, Config, ["--eval-every", bad])
    err = capsys.readouterr().err
    assert f"--eval-every {bad!r}: give an integer number of optimizer steps" in err and "'epoch'" in err
    with pytest.raises(ValueError, match="--eval-every"):
        TrainSettings(run_dir="r", config=tree_with({"schedule.eval_every": bad}))
    with pytest.raises(ValueError, match="--eval-max-clips"):
        TrainSettings(run_dir="r", config=tree_with({"schedule.eval_max_clips": 0}))
    with pytest.raises(ValueError, match="--eval-batch-size"):
        TrainSettings(run_dir="r", config=tree_with({"schedule.eval_batch_size": 0}))


def test_flags_parse_and_default_keeps_every_epoch():
    cfg, _ = parse(TRAIN, Config, ["--eval-every", "0.25", "--eval-max-clips", "16"])
    assert (cfg.schedule.eval_every, cfg.schedule.eval_max_clips) == ("0.25", 16)
    cfg, _ = parse(TRAIN, Config, [])
    assert (cfg.schedule.eval_every, cfg.schedule.eval_max_clips) == ("epoch", None)
    # hooks without a cadence of their own: every epoch's end, as before
    h = Hooks([TrainHook()])
    assert [h.validation_due(s, s, 3) for s in (1, 2, 3)] == [False, False, True]


class _Items(torch.utils.data.Dataset):
    normalization = ((0.5,) * 3, (0.25,) * 3)

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"clip": torch.zeros(1, 3, 2, 2, dtype=torch.uint8), "label": i % 3, "index": i}


def test_subset_is_seeded_fixed_and_its_loader_yields_exactly_it():
    a = subset_indices(50, 7, seed=0)
    assert len(a) == len(set(a)) == 7 and a == sorted(a) and all(0 <= i < 50 for i in a)
    assert subset_indices(50, 7, seed=0) == a and subset_indices(50, 7, seed=1) != a
    state = torch.random.get_rng_state()
    sub = val_subset(_Items(50), 7, seed=0, world=1, rank=0, batch_size=3, num_workers=0)
    assert torch.equal(state, torch.random.get_rng_state())            # the global RNG untouched
    seen = [[int(i) for b in sub.loader for i in b["index"]] for _ in range(2)]
    assert sub.indices == a and seen == [a, a]                         # the same clips at every pass
    assert sub.loader.dataset.normalization == _Items.normalization
    assert val_subset(_Items(5), 7, seed=0, world=1, rank=0, batch_size=3, num_workers=0) is None   # cap >= set
    assert val_subset(_Items(5), None, seed=0, world=1, rank=0, batch_size=3, num_workers=0) is None
    # two ranks share the subset: each clip once
    parts = [[int(i) for b in val_subset(_Items(50), 7, seed=0, world=2, rank=r, batch_size=2,
                                          num_workers=0).loader for i in b["index"]] for r in (0, 1)]
    assert sorted(set(parts[0] + parts[1])) == a


def test_validate_selects_best_on_the_subset():
    from tsm_ds.engine.loop.evaluate import validate

    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, clip):   # predicts class 0 for every clip: right on labels 0 only
            return torch.tensor([[1.0, 0.0, 0.0]]).repeat(clip.shape[0], 1) + 0 * self.w

    ds = _Items(6)   # labels 0 1 2 0 1 2
    loader = torch.utils.data.DataLoader(ds, batch_size=2)
    full = validate(Lin(), loader, ds)
    assert full["count"] == 6 and full["select_top1"] == pytest.approx(100 / 3)
    sub = validate(Lin(), loader, ds, select=[0, 3, 4])
    assert sub["top1"] == pytest.approx(100 / 3) and sub["select_top1"] == pytest.approx(200 / 3)


# ------------------------------------------------------------------ through the real trainer

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo data: 24 training clips (4 classes), 8 validation clips."""
    from tsm_ds.data.synthetic import make_demo_dataset
    return make_demo_dataset(tmp_path_factory.mktemp("demo") / "d", seed=0, train_per_class=6, val_per_class=2)


def _run(demo, out, args: list[str]) -> dict:
    """A 12-step run (batch 4: 6 steps per epoch, 2 epochs); its result.json."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tsm_ds.train", "--deepspeed_config", "cpu_demo_adamw",
           "--train-list", demo["train_list"], "--val-list", demo["val_list"], "--arch", "resnet18",
           "--img-size", "32", "--num-segments", "2", "--no-flip", "--batch-size", "4", "--micro-batch-size", "4",
           "--epochs", "2", "--num-workers", "0", "--no-progress", "--seed", "0", "--output-dir", str(out),
           "--run-name", "r", *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return json.loads((out / "r" / "result.json").read_text())


@pytest.mark.slow
def test_every_4_steps_with_a_cap_of_3_clips(demo, tmp_path):
    rec = _run(demo, tmp_path, ["--eval-every", "4", "--eval-max-clips", "3"])
    assert [(h["step"], h["val_clips"]) for h in rec["history"]] == [(4, 3), (8, 3), (12, 8)]   # end: all 8
    assert rec["val_clips"] == 8 and rec["steps"] == 12


@pytest.mark.slow
def test_half_epochs_on_the_whole_set(demo, tmp_path):
    rec = _run(demo, tmp_path, ["--eval-every", "0.5"])
    assert [(h["step"], h["val_clips"]) for h in rec["history"]] == [(3, 8), (6, 8), (9, 8), (12, 8)]


def test_checkpoint_cadence_and_best_model_decide_for_themselves():
    """--save-every-steps 3 with 4 steps per epoch: steps 3, 6, 9 inside epochs and every epoch's end;
    0: epoch ends only; without the hook the default is the epoch's end. best_model.pt: a strictly
    higher top-1 only (the official ``prec1 > best_prec1``)."""
    from tsm_ds.engine.loop.hooks import BestModel, CheckpointCadence

    def saved(hooks, steps=12, per=4):
        return [s for s in range(1, steps + 1) if hooks.checkpoint_due(s, (s - 1) % per + 1, per)]
    assert saved(Hooks([CheckpointCadence(3)])) == [3, 4, 6, 8, 9, 12]
    assert saved(Hooks([CheckpointCadence(0)])) == saved(Hooks([])) == [4, 8, 12]
    with pytest.raises(ValueError, match="--save-every-steps"):
        CheckpointCadence(-1)

    class Never(TrainHook):   # a hook that decides first wins
        def checkpoint_due(self, step, epoch_step, steps_per_epoch):
            return False
    assert saved(Hooks([Never(), CheckpointCadence(3)])) == []
    best = Hooks([BestModel()])
    assert [best.best_due(t, b) for t, b in ((50.0, -1.0), (50.0, 50.0), (50.1, 50.0), (49.0, 50.0))] == \
        [True, False, True, False]
