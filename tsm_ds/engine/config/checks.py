"""The one validator of an engine configuration: refuse, before the first step, what cannot work.

:func:`validate_config` takes what :func:`tsm_ds.engine.config.resolve.resolve_config` returns and names
the key and the fix of everything that would fail later (fp16 on CPU, bf16 BatchNorm buffers,
CUDA-only or removed optimizers, ZeRO with an untested optimizer, 1-bit compression with ZeRO or a
DeepSpeed precision). The trainer and the tools call it once per start.
"""
from __future__ import annotations

from tsm_ds.engine.config.recipes import CUDA_ONLY_OPTIMIZERS, ConfigError, optimizer_kind

__all__ = ["REMOVED_OPTIMIZERS", "CUDA_ONLY_OPTIMIZERS", "ZERO_TESTED_TYPES", "validate_config"]

REMOVED_OPTIMIZERS = {"onebitadam", "onebitlamb", "zerooneadam"}
# DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS as built from a JSON "optimizer" block (runtime/zero/utils.py)
ZERO_TESTED_TYPES = {"adam", "adamw", "adagrad", "lamb", "lion", "cpuadam"}


def validate_config(ds_config: dict, tsm: dict, *, device: str, has_batchnorm: bool) -> None:
    """Refuse, before the first step, a resolved configuration that cannot work.

    Args:
        ds_config: the resolved DeepSpeed config (``resolve_config``'s first value).
        tsm: the resolved ``tsm_ds`` block.
        device: ``"cpu"`` or the accelerator name (``"cuda"``).
        has_batchnorm: the model holds BatchNorm layers (TSM's ResNets and MobileNetV2 do).

    Raises:
        ConfigError naming the key and the fix: fp16 on CPU; bf16 with BatchNorm but no
        ``data_types.buffer_dtype``; FusedLamb / FusedLion on CPU; the 1-bit optimizers removed
        in DeepSpeed 0.19.7; ZeRO with an optimizer DeepSpeed has not tested and no
        ``zero_allow_untested_optimizer``; compression with ZeRO or DeepSpeed's bf16 optimizer,
        or an invalid ``tsm_ds.compression`` block; no optimizer at all; fp16 gradients summed
        over more than 64 ranks without ``gradient_predivide_factor`` or fp32 communication. The only validator: the
        trainer and the tools call it once per start.
    """
    fp16 = bool(ds_config.get("fp16", {}).get("enabled", False))
    bf16 = bool(ds_config.get("bf16", {}).get("enabled", False))
    if fp16 and bf16:
        raise ConfigError("`fp16.enabled` and `bf16.enabled` are both true: enable one")
    if fp16 and device == "cpu":
        raise ConfigError("`fp16.enabled` = true, but DeepSpeed has no fp16 training on this device (cpu): "
                          "use ds_configs/cpu_bf16.json (`bf16` + `data_types.buffer_dtype`) or "
                          "ds_configs/cpu_fp32.json")
    if bf16 and has_batchnorm and "buffer_dtype" not in ds_config.get("data_types", {}):
        raise ConfigError("`bf16.enabled` = true on a model with BatchNorm but no `data_types.buffer_dtype`: "
                          "DeepSpeed keeps the BN running stats fp32 and fails in the first forward "
                          "(expected scalar type BFloat16 but found Float); add "
                          "\"data_types\": {\"buffer_dtype\": \"bf16\"} or use `torch_autocast` instead")
    _check_fp16_sums(ds_config, fp16)
    src, otype, _ = optimizer_kind({**ds_config, "tsm_ds": tsm})
    if src == "none":
        raise ConfigError("the engine JSON has no `optimizer` or `tsm_ds.optimizer` block: add one "
                          "(see ds_configs/cpu_fp32.json)")
    if otype in REMOVED_OPTIMIZERS:
        raise ConfigError(f"optimizer.type = {otype!r}: OneBitAdam/OneBitLamb/ZeroOneAdam were removed from "
                          f"DeepSpeed 0.19.7; use the `tsm_ds.compression` block of the engine JSON, "
                          f"see docs/training.md")
    if src == "deepspeed" and otype in CUDA_ONLY_OPTIMIZERS and device == "cpu":
        raise ConfigError(f"optimizer.type = {otype!r} builds DeepSpeed's {CUDA_ONLY_OPTIMIZERS[otype]}, "
                          f"which is CUDA-only; on CPU use the client optimizer "
                          f"\"tsm_ds\": {{\"optimizer\": {{\"type\": \"timm.Lamb\"}}}} "
                          f"(ds_configs/cpu_lamb.json)")
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0) or 0)
    if stage >= 1 and src != "none" and not ds_config.get("zero_allow_untested_optimizer", False):
        tested = src == "deepspeed" and otype in ZERO_TESTED_TYPES
        if not tested:
            name = ds_config.get("optimizer", {}).get("type") if src == "deepspeed" else tsm["optimizer"]["type"]
            raise ConfigError(f"ZeRO stage {stage} with optimizer {name!r}, which DeepSpeed has not tested with "
                              f"ZeRO: set \"zero_allow_untested_optimizer\": true (it works here, see "
                              f"ds_configs/cpu_zero1.json) or use Adam/AdamW")
    from tsm_ds.engine.comm.compression import parse_compression_block
    try:
        active = parse_compression_block(tsm.get("compression")) is not None
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if active and (stage >= 1 or bf16 or fp16):
        raise ConfigError("`tsm_ds.compression` needs ZeRO stage 0 with fp32 or `torch_autocast` (the "
                          "compressor averages the module's gradients itself); remove `zero_optimization` "
                          "/ `bf16` / `fp16` or the compression block")


def _check_fp16_sums(ds_config: dict, fp16: bool) -> None:
    """fp16 gradient sums over many ranks need a pre-division or fp32 communication
    (:func:`tsm_ds.engine.config.resolve.predivide_factor` says why); refuse them above
    :data:`tsm_ds.engine.config.resolve.FP16_SUM_MAX_RANKS` ranks."""
    from tsm_ds.engine.config.resolve import FP16_SUM_MAX_RANKS

    comm = str(ds_config.get("communication_data_type") or ("fp16" if fp16 else "fp32")).lower()
    if not fp16 or comm in ("fp32", "float32", "float"):
        return
    g, m = ds_config.get("train_batch_size"), ds_config.get("train_micro_batch_size_per_gpu")
    a = ds_config.get("gradient_accumulation_steps") or 1
    if not all(isinstance(v, int) and v > 0 for v in (g, m, a)):
        return
    world = g // (m * a)
    pre = float(ds_config.get("gradient_predivide_factor") or 1.0)
    if world > FP16_SUM_MAX_RANKS and pre == 1.0:
        raise ConfigError(f"fp16 gradients summed over {world} ranks with `gradient_predivide_factor` 1: the sum of "
                          "loss-scaled fp16 gradients can overflow (65,504), skipped steps then lower the loss scale "
                          "until small gradients underflow; set \"gradient_predivide_factor\": \"auto\" (sqrt of the "
                          "world size) or \"communication_data_type\": \"fp32\"")
