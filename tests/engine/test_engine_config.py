"""Engine JSON: "auto" filling, JSON-wins rule, validation errors, every shipped recipe resolves."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tsm_ds.engine.config.checks import validate_config
from tsm_ds.engine.config.recipes import ConfigError, load_config
from tsm_ds.engine.config.resolve import resolve_config, scaled_lr

REPO = Path(__file__).resolve().parents[2]
MULTS = [1.0, 2.0, 1.0, 5.0, 10.0]  # weight, bias, bn, fc_weight, fc_bias (official TSM)


def base(**over):
    cfg = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
           "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
           "optimizer": {"type": "SGD", "params": {"lr": "auto", "momentum": 0.9, "weight_decay": "auto"}},
           "tsm_ds": {"lr_schedule": {"type": "step", "decay_epochs": "auto", "warmup_steps": "auto"}}}
    cfg.update(over)
    return cfg


def resolve(cfg, world=2, n=100, epochs=5, **flags):
    return resolve_config(cfg, world_size=world, train_samples=n, epochs=epochs, lr_mults=MULTS, flags=flags)


def test_auto_fills_official_defaults_and_linear_lr():
    ds, tsm, filled, spe = resolve(base(), world=2, n=100, epochs=5)
    # micro 8 (official per GPU), accumulation 1, global 16
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"],
            ds["train_batch_size"]) == (8, 1, 16)
    assert ds["optimizer"]["params"]["lr"] == pytest.approx(0.02 * 16 / 128)
    assert ds["optimizer"]["params"]["weight_decay"] == 1e-4
    assert ds["gradient_clipping"] == 20.0
    assert tsm["lr_schedule"]["decay_epochs"] == [20, 40] and tsm["lr_schedule"]["warmup_steps"] == 0
    # 100 clips / 2 ranks = 50 per rank, // 8 = 6 steps per epoch
    assert spe == 6 and tsm["lr_schedule"]["total_steps"] == 30
    assert "tsm_ds" not in ds
    assert filled["gradient_accumulation_steps"] == 1 and "optimizer.params.lr" in filled


def test_accumulation_from_global_and_micro():
    ds, *_ = resolve(base(train_batch_size=64, train_micro_batch_size_per_gpu=4), world=2, n=1000)
    assert ds["gradient_accumulation_steps"] == 8
    ds, *_ = resolve(base(train_batch_size=64, gradient_accumulation_steps=2), world=4, n=1000)
    assert ds["train_micro_batch_size_per_gpu"] == 8


def test_micro_batch_from_global_only():
    ds, *_ = resolve(base(), world=1, n=100, batch_size=2)
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (2, 1)
    ds, *_ = resolve(base(), world=2, n=100, batch_size=36)  # 18 per rank = 6 x 3
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (6, 3)
    with pytest.raises(ConfigError, match="train_batch_size 5 is not divisible by the world size 2"):
        resolve(base(), world=2, n=100, batch_size=5)


def test_uneven_accumulation_names_the_numbers():
    with pytest.raises(ConfigError, match=r"train_batch_size 64 is not divisible by "
                                          r"train_micro_batch_size_per_gpu 8 x world size 3 = 24"):
        resolve(base(train_batch_size=64, train_micro_batch_size_per_gpu=8), world=3, n=1000)


def test_inconsistent_fixed_batch_sizes():
    with pytest.raises(ConfigError,
                       match=r"inconsistent batch sizes: train_batch_size 32 != .* 4 x .* 2 x world size 2 = 16"):
        resolve(base(train_batch_size=32, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2), world=2)


def test_flag_for_fixed_key_is_an_error_and_fills_auto():
    with pytest.raises(ConfigError, match=r"--batch-size 32 conflicts .* `train_batch_size` = 64"):
        resolve(base(train_batch_size=64), batch_size=32)
    with pytest.raises(ConfigError, match=r"gradient_clipping"):
        resolve(base(gradient_clipping=1.0), clip_grad=5.0)
    ds, tsm, filled, _ = resolve(base(), batch_size=32, micro_batch_size=4, lr=0.5, clip_grad=5.0,
                                 lr_steps=[3], warmup_steps=7)
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (32, 4)
    assert ds["optimizer"]["params"]["lr"] == 0.5 and ds["gradient_clipping"] == 5.0
    assert tsm["lr_schedule"]["decay_epochs"] == [3] and tsm["lr_schedule"]["warmup_steps"] == 7


def test_missing_gradient_clipping_is_an_error():
    cfg = base()
    del cfg["gradient_clipping"]
    with pytest.raises(ConfigError, match="gradient_clipping.*1.0"):
        resolve(cfg)


def test_epoch_shorter_than_a_global_batch():
    with pytest.raises(ConfigError, match="12 clips, 6 per rank: fewer than one optimizer step"):
        resolve(base(train_batch_size=16), world=2, n=12)


def test_scaling_rules():
    assert scaled_lr("linear", 0.02, 128, 12288) == pytest.approx(1.92)
    assert scaled_lr("sqrt", 0.002, 128, 512) == pytest.approx(0.004)
    assert scaled_lr("none", 0.1, 128, 4096) == 0.1
    with pytest.raises(ConfigError, match="lr_scaling.rule"):
        scaled_lr("cubic", 0.1, 1, 2)


def test_deepspeed_scheduler_gets_per_group_lists():
    cfg = base(scheduler={"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "warmup_min_lr": "auto",
                                                              "warmup_num_steps": "auto", "total_num_steps": "auto",
                                                              "warmup_type": "linear"}})
    del cfg["tsm_ds"]
    ds, _, _, spe = resolve(cfg, world=1, n=64, epochs=2, lr=0.1, warmup_steps=3)
    p = ds["scheduler"]["params"]
    assert p["warmup_max_lr"] == pytest.approx([0.1 * m for m in MULTS])
    assert p["warmup_min_lr"] == [0.0] * 5
    assert p["warmup_num_steps"] == 3 and p["total_num_steps"] == spe * 2 == 16


def test_scalar_scheduler_lr_would_erase_multipliers():
    cfg = base(scheduler={"type": "WarmupLR", "params": {"warmup_max_lr": 0.1, "warmup_num_steps": 5,
                                                         "warmup_type": "linear"}})
    del cfg["tsm_ds"]
    with pytest.raises(ConfigError, match=r"warmup_max_lr = 0.1 is a scalar.*5 param groups.*\"auto\""):
        resolve(cfg)


def test_scheduler_without_warmup_type():
    cfg = base(scheduler={"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 5}})
    del cfg["tsm_ds"]
    with pytest.raises(ConfigError, match="warmup_type.*logarithmically"):
        resolve(cfg)


def test_both_schedulers_or_both_optimizers():
    cfg = base(scheduler={"type": "WarmupLR", "params": {"warmup_type": "linear"}})
    with pytest.raises(ConfigError, match="both `scheduler` and `tsm_ds.lr_schedule`"):
        resolve(cfg)
    cfg = base()
    cfg["tsm_ds"]["optimizer"] = {"type": "timm.Lamb"}
    with pytest.raises(ConfigError, match="both `optimizer` and `tsm_ds.optimizer`"):
        resolve(cfg)


def _validate(over, device="cpu", bn=True):
    ds, tsm, *_ = resolve(base(**over), world=1, n=64)
    validate_config(ds, tsm, device=device, has_batchnorm=bn)


def test_fp16_on_cpu_refused():
    with pytest.raises(ConfigError, match=r"`fp16.enabled` = true.*\(cpu\).*cpu_bf16.json"):
        _validate({"fp16": {"enabled": True}})
    _validate({"fp16": {"enabled": True}}, device="cuda")


def test_bf16_with_batchnorm_needs_buffer_dtype():
    with pytest.raises(ConfigError, match=r"data_types.*buffer_dtype.*bf16"):
        _validate({"bf16": {"enabled": True}})
    _validate({"bf16": {"enabled": True}}, bn=False)
    _validate({"bf16": {"enabled": True}, "data_types": {"buffer_dtype": "bf16"}})


def test_fused_lamb_on_cpu_refused():
    with pytest.raises(ConfigError, match=r"FusedLamb.*CUDA-only.*timm.Lamb"):
        _validate({"optimizer": {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.0}}})
    _validate({"optimizer": {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.0}}}, device="cuda")


def test_zero_with_untested_optimizer():
    with pytest.raises(ConfigError, match=r"ZeRO stage 1 with optimizer 'SGD'.*zero_allow_untested_optimizer"):
        _validate({"zero_optimization": {"stage": 1}})
    _validate({"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True})
    _validate({"zero_optimization": {"stage": 2},
               "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0, "torch_adam": True}}})


@pytest.mark.parametrize("name", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam"])
def test_removed_one_bit_optimizers(name):
    with pytest.raises(ConfigError, match=r"removed from DeepSpeed 0.19.7; use the `tsm_ds.compression` block"):
        _validate({"optimizer": {"type": name, "params": {"lr": 0.01, "weight_decay": 0.0}}})


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{ \"a\": 1,, }")
    with pytest.raises(ConfigError, match="bad.json: not valid JSON"):
        load_config(tmp_path / "bad.json")


def test_recipe_by_name_or_path(tmp_path, monkeypatch):
    from tsm_ds.engine.config.recipes import recipe_names, resolve_recipe

    shipped = REPO / "ds_configs" / "cpu_fp32.json"
    monkeypatch.chdir(tmp_path)                       # names work from any directory
    assert resolve_recipe("cpu_fp32").resolve() == shipped
    assert resolve_recipe("cpu_fp32.json").resolve() == shipped
    assert load_config("cpu_fp32") == json.loads(shipped.read_text())
    assert set(recipe_names()) == {p.stem for p in (REPO / "ds_configs").glob("*.json")}
    (tmp_path / "cpu_fp32.json").write_text("{}")     # an existing file wins over the shipped name
    assert resolve_recipe("cpu_fp32.json").resolve() == tmp_path / "cpu_fp32.json"
    with pytest.raises(ConfigError, match=r"cpu_fp3: engine JSON not found; .*cpu_fp32, "):
        resolve_recipe("cpu_fp3")
    with pytest.raises(ConfigError, match="not found"):   # a path is never looked up by name
        resolve_recipe("sub/cpu_fp32.json")


RECIPE_DEVICE = {"gpu": "cuda", "cpu": "cpu"}


@pytest.mark.parametrize("path", sorted((REPO / "ds_configs").glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_recipe_resolves_and_validates(path):
    raw = load_config(path)
    world = 1536 if "1536" in path.stem else 2
    flags = {}
    auto = json.dumps(raw)
    if '"decay_epochs": "auto"' in auto:
        flags["lr_steps"] = [20, 40]
    ds, tsm, filled, spe = resolve_config(raw, world_size=world, train_samples=240_000, epochs=50,
                                          lr_mults=MULTS, flags=flags)
    validate_config(ds, tsm, device=RECIPE_DEVICE[path.stem.split("_")[0]], has_batchnorm=True)
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world
    assert isinstance(ds["gradient_clipping"], float)
    if "1536" in path.stem:
        assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) \
            == (12288, 8, 1)
        assert ds["optimizer"]["params"]["lr"] == pytest.approx(1.92)
        assert spe == math.ceil(240_000 / 1536) // 8 == 19
