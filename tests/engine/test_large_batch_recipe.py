"""The large-batch recipe of the literature, piece by piece: warm-up in epochs on whenever a rule
raises the lr, the official head multipliers only for a head on pretrained weights, LARS adapting
every group, LAMB clipped once, zero-gamma residual blocks, ghost BatchNorm equal to accumulation."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tsm_ds.engine.config.recipes import ConfigError, load_config
from tsm_ds.engine.config.resolve import WARMUP_MAX_FRACTION, resolve_config, warmup_steps_for


def _resolve(name, batch, samples=2048, epochs=10, **flags):
    return resolve_config(load_config(name), world_size=1, train_samples=samples, epochs=epochs,
                          flags={"batch_size": batch, "micro_batch_size": 8, **flags})


# ---------------------------------------------------------------- warm-up
def test_warmup_on_whenever_the_rule_raises_the_lr():
    # batch 8 of a base of 128: the rule lowers the lr, no warm-up (as before)
    _, tsm, filled, _ = _resolve("cpu_sgd_large_batch", 8)
    assert tsm["lr_schedule"]["warmup_steps"] == 0 and filled["tsm_ds.lr_schedule.warmup_steps"].startswith("0 ")
    # 50 epochs at batch 256 (x2 the base): 5 epochs of 8 steps
    _, tsm, filled, spe = _resolve("cpu_sgd_large_batch", 256, epochs=50)
    assert spe == 8 and tsm["lr_schedule"]["warmup_steps"] == 40
    assert "Goyal" in filled["tsm_ds.lr_schedule.warmup_steps"]
    # 10 epochs: 5 would be half the run: capped at a quarter, and the log says so
    _, tsm, filled, _ = _resolve("cpu_sgd_large_batch", 256, epochs=10)
    assert tsm["lr_schedule"]["warmup_steps"] == int(WARMUP_MAX_FRACTION * 80) == 20
    assert "capped at 0.25 of this run's 80 steps" in filled["tsm_ds.lr_schedule.warmup_steps"]
    # flags: exact, steps win over epochs
    assert _resolve("cpu_sgd_large_batch", 256, warmup_epochs=1.5)[1]["lr_schedule"]["warmup_steps"] == 12
    assert _resolve("cpu_sgd_large_batch", 256, warmup_steps=3, warmup_epochs=2)[1]["lr_schedule"]["warmup_steps"] == 3
    # --lr skips the rule: no automatic warm-up
    assert _resolve("cpu_sgd_large_batch", 256, lr=0.5)[1]["lr_schedule"]["warmup_steps"] == 0
    with pytest.raises(ConfigError, match="--warmup-epochs -1"):
        warmup_steps_for(flag_steps=None, flag_epochs=-1, recipe_epochs=None, lr_factor=2, steps_per_epoch=4,
                         total_steps=40)


def test_warmup_epochs_flag_needs_a_schedule_to_warm_up():
    with pytest.raises(ConfigError, match="--warmup-epochs given but"):
        _resolve("cpu_fp32_warmup_cosine", 256, warmup_epochs=1)   # a DeepSpeed scheduler: steps only


# ---------------------------------------------------------------- head multipliers
def test_head_multipliers_only_for_a_head_on_pretrained_weights():
    from tsm_ds.models import build_model
    from tsm_ds.models.groups import head_mults_on, parameter_groups

    assert head_mults_on("auto", pretrained=False, tune_from=None) is False
    assert head_mults_on("auto", pretrained=True, tune_from=None) is True
    assert head_mults_on("auto", pretrained=False, tune_from="run/best_model.pt") is True
    assert head_mults_on("on", pretrained=False, tune_from=None) and not head_mults_on("off", pretrained=True,
                                                                                        tune_from=None)
    m = build_model("resnet18", 5, num_segments=2)
    on = {g["name"]: g["lr_mult"] for g in parameter_groups(m, head_mults=True)}
    off = {g["name"]: g["lr_mult"] for g in parameter_groups(m, head_mults=False)}
    assert (on["fc_weight"], on["fc_bias"]) == (5.0, 10.0)
    assert (off["fc_weight"], off["fc_bias"]) == (1.0, 2.0) and off["weight"] == on["weight"] == 1.0


# ---------------------------------------------------------------- LARS, LAMB
def test_lars_adapts_every_group_and_states_its_lr_at_a_large_batch():
    from tsm_ds.engine.loop.optim import build_client_optimizer

    raw = load_config("cpu_lars")
    assert raw["tsm_ds"]["lr_scaling"]["base_batch"] >= 4096
    ds, tsm, _, _ = resolve_config(raw, world_size=1, train_samples=4096, epochs=2,
                                   flags={"batch_size": 4096, "micro_batch_size": 8})
    assert tsm["optimizer"]["params"]["lr"] == pytest.approx(0.64)
    w = torch.nn.Parameter(torch.ones(10))     # a BatchNorm gamma: weight decay 0
    opt = build_client_optimizer(tsm["optimizer"], [{"params": [w], "weight_decay": 0.0, "lr": 0.64}])
    assert opt.param_groups[0]["always_adapt"] and opt.param_groups[0]["trust_clip"]
    w.grad = torch.full((10,), 100.0)          # a large gradient: the raw lr would move w by 64
    opt.step()
    # adapted: the step is trust_coeff x |w| / |g| x |g| = 0.001 x |w|, not lr x g
    assert float((1.0 - w.detach()).abs().max()) == pytest.approx(0.001, rel=1e-3)


def test_lamb_is_clipped_once():
    raw = load_config("cpu_lamb")
    assert raw["gradient_clipping"] == 0.0 and raw["tsm_ds"]["optimizer"]["params"]["max_grad_norm"] == 1.0


# ---------------------------------------------------------------- zero gamma
@pytest.mark.parametrize("arch", ["resnet18", "resnet50", "mobilenet_v2"])
def test_zero_gamma_makes_every_residual_block_the_identity(arch):
    from torchvision.models.mobilenetv2 import InvertedResidual
    from torchvision.models.resnet import BasicBlock, Bottleneck

    from tsm_ds.models import build_model
    from tsm_ds.models.large_batch import zero_init_residual

    torch.manual_seed(0)
    m = build_model(arch, 4, num_segments=2, shift=None).eval()
    n = zero_init_residual(m)
    blocks = [b for b in m.modules() if isinstance(b, (BasicBlock, Bottleneck))
              or (isinstance(b, InvertedResidual) and b.use_res_connect)]
    assert n == len(blocks) > 0
    for b in blocks:
        if getattr(b, "downsample", None) is not None:
            continue
        c = b.conv1.in_channels if hasattr(b, "conv1") else b.conv[0][0].in_channels
        x = torch.rand(2, c, 6, 6)   # non-negative: what a block receives after a ReLU
        assert torch.equal(b(x), x)


# ---------------------------------------------------------------- ghost BatchNorm
def test_ghost_batchnorm_equals_micro_batches_with_accumulation():
    """Micro-batch of 4 clips with ghost groups of 2 == 2 micro-batches of 2 clips, gradients
    accumulated: outputs, gradients and running statistics."""
    from tsm_ds.models import build_model
    from tsm_ds.models.large_batch import GhostBatchNorm2d, use_ghost_bn

    torch.manual_seed(0)
    a = build_model("resnet18", 3, num_segments=4, dropout=0.0)
    b = copy.deepcopy(a)
    assert use_ghost_bn(a, 2) == sum(isinstance(x, torch.nn.BatchNorm2d) for x in b.modules())
    assert all(type(x) is GhostBatchNorm2d for x in a.modules() if isinstance(x, torch.nn.BatchNorm2d))
    assert a.state_dict().keys() == b.state_dict().keys()
    a.train(), b.train()
    x, y = torch.randn(4, 4, 3, 32, 32), torch.tensor([0, 1, 2, 1])
    out_a = a(x)
    F.cross_entropy(out_a, y).backward()
    outs = []
    for k in range(2):
        o = b(x[2 * k:2 * k + 2])
        (F.cross_entropy(o, y[2 * k:2 * k + 2]) / 2).backward()
        outs.append(o)
    torch.testing.assert_close(out_a, torch.cat(outs), rtol=1e-5, atol=1e-5)
    ga, gb = dict(a.named_parameters()), dict(b.named_parameters())
    for k in ga:
        torch.testing.assert_close(ga[k].grad, gb[k].grad, rtol=1e-4, atol=1e-6, msg=k)
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        if "running" in k or "num_batches" in k:
            torch.testing.assert_close(sa[k], sb[k], rtol=1e-5, atol=1e-6, msg=k)
    a.eval(), b.eval()
    torch.testing.assert_close(a(x), b(x))   # eval: plain BatchNorm with the same statistics
    a.train()
    with pytest.raises(ValueError, match="groups of 2 clips"):
        a(torch.randn(3, 4, 3, 32, 32))
