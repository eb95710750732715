"""Per-group learning rates survive every schedule: every group's lr checked at several steps.

The DeepSpeed schedulers are DeepSpeed's own classes (deepspeed.runtime.lr_schedules) built from
the params ``resolve_config`` fills, on an optimizer whose groups carry fc x5 / bias x10.
"""
from __future__ import annotations

import pytest
import torch

from tsm_ds.engine.config.recipes import ConfigError
from tsm_ds.engine.config.resolve import resolve_config
from tsm_ds.engine.loop.optim import WarmupStepLR, apply_group_lrs, client_scheduler_factory

MULTS = [1.0, 2.0, 1.0, 5.0, 10.0]
LR = 0.1


def make_opt():
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr_mult": m, "name": f"g{i}"}
              for i, m in enumerate(MULTS)]
    return torch.optim.SGD(apply_group_lrs(groups, LR), lr=LR, momentum=0.9)


def lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def step_n(opt, sched, n):
    for _ in range(n):
        opt.step()
        sched.step()


def test_apply_group_lrs():
    opt = make_opt()
    assert lrs(opt) == pytest.approx([LR * m for m in MULTS])


def test_client_step_schedule_with_warmup_keeps_ratios():
    opt = make_opt()
    block = {"type": "step", "steps_per_epoch": 10, "total_steps": 50, "warmup_steps": 4,
             "decay_epochs": [2, 4], "gamma": 0.1}
    s = client_scheduler_factory(block)(opt)
    expect = {0: 0.25, 1: 0.5, 3: 1.0, 19: 1.0, 20: 0.1, 39: 0.1, 40: 0.01}
    done = 0
    for step, f in sorted(expect.items()):
        step_n(opt, s, step - done)
        done = step
        assert lrs(opt) == pytest.approx([LR * f * m for m in MULTS]), f"step {step}"


def test_client_cosine_schedule():
    opt = make_opt()
    s = WarmupStepLR(opt, kind="cosine", steps_per_epoch=5, total_steps=20, warmup_steps=0)
    step_n(opt, s, 10)
    assert lrs(opt) == pytest.approx([LR * 0.5 * m for m in MULTS])  # half-way: cos(pi/2) = 0
    step_n(opt, s, 10)
    assert lrs(opt) == pytest.approx([0.0] * 5, abs=1e-12)


def test_client_schedule_state_round_trip():
    opt = make_opt()
    block = {"type": "step", "steps_per_epoch": 3, "total_steps": 30, "warmup_steps": 2, "decay_epochs": [1]}
    s = client_scheduler_factory(block)(opt)
    step_n(opt, s, 4)
    sd = s.state_dict()
    opt2 = make_opt()
    s2 = client_scheduler_factory(block)(opt2)
    s2.load_state_dict(sd)
    opt2.step()
    s2.step()
    opt.step()
    s.step()
    assert lrs(opt2) == lrs(opt) == pytest.approx([LR * 0.1 * m for m in MULTS])


def _ds_sched(sched_block, **flags):
    cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
           "optimizer": {"type": "SGD", "params": {"lr": LR, "weight_decay": 0.0}}, "scheduler": sched_block}
    ds, *_ = resolve_config(cfg, world_size=1, train_samples=40, epochs=5, lr_mults=MULTS, flags=flags)
    from deepspeed.runtime import lr_schedules
    opt = make_opt()
    return opt, getattr(lr_schedules, ds["scheduler"]["type"])(opt, **ds["scheduler"]["params"])


def test_deepspeed_warmup_decay_lr_per_group_lists():
    opt, s = _ds_sched({"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": "auto",
                                                            "total_num_steps": "auto", "warmup_type": "linear"}},
                       warmup_steps=4)
    # total = 40 / 4 x 5 = 50 steps; linear warmup over 4 steps, then linear decay to 0 at step 50
    for target, f in ((2, 0.5), (4, 1.0), (27, 23 / 46)):
        while s.last_batch_iteration < target:
            opt.step()
            s.step()
        assert lrs(opt) == pytest.approx([LR * f * m for m in MULTS]), f"step {target}"


def test_deepspeed_warmup_cosine_keeps_ratios():
    opt, s = _ds_sched({"type": "WarmupCosineLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto",
                                                             "warmup_min_ratio": 0.0, "cos_min_ratio": 0.0,
                                                             "warmup_type": "linear"}}, warmup_steps=5)
    for _ in range(3):
        opt.step()
        s.step()
    r = lrs(opt)
    assert 0 < r[0] < LR
    assert [x / r[0] for x in r] == pytest.approx(MULTS)
    for _ in range(24):
        opt.step()
        s.step()
    r = lrs(opt)
    assert [x / r[0] for x in r] == pytest.approx(MULTS)


def test_deepspeed_onecycle_per_group_lists():
    opt, s = _ds_sched({"type": "OneCycle", "params": {"cycle_min_lr": "auto", "cycle_max_lr": "auto",
                                                       "cycle_first_step_size": 10}})
    first = []
    for step in range(20):
        r = lrs(opt)
        assert [x / r[0] for x in r] == pytest.approx(MULTS), f"step {step}"
        first.append(r[0])
        opt.step()
        s.step()
    # the cycle runs from "auto" cycle_min_lr (0.1 x lr) up to the resolved lr and back
    assert first[0] == pytest.approx(0.1 * LR) and max(first) == pytest.approx(LR)


def test_scalar_deepspeed_warmup_lr_refused():
    # what the check prevents: DeepSpeed given a scalar writes one lr into all groups
    from deepspeed.runtime.lr_schedules import WarmupLR
    opt = make_opt()
    s = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=LR, warmup_num_steps=2, warmup_type="linear")
    for _ in range(3):
        opt.step()
        s.step()
    assert len(set(lrs(opt))) == 1
    with pytest.raises(ConfigError, match="erasing the lr multipliers"):
        _ds_sched({"type": "WarmupLR", "params": {"warmup_max_lr": LR, "warmup_num_steps": 2,
                                                  "warmup_type": "linear"}})
