"""Engine JSON resolved for a run: every ``"auto"`` of a recipe filled (:func:`resolve_config`).

The recipe format and the ``tsm_ds`` block: :mod:`tsm_ds.engine.config.recipes` (which also finds and reads
recipes); the check of the result: :func:`tsm_ds.engine.config.checks.validate_config`; the run's
record: :mod:`tsm_ds.engine.config.provenance`.

Filling rules (every filled value is returned in ``filled`` and logged by the trainer):

- batch sizes: ``train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x
  world size``; a recipe fixes the micro-batch and the global batch and the accumulation is derived;
  an uneven division is an error naming the numbers. With only the global batch known, the
  micro-batch is the largest divisor of the clips per rank up to 8 (the official 8 per GPU).
- lr (``"auto"``): ``--lr`` if given, else the optimizer's scaling rule applied to the global batch:
  linear for SGD / LARS (Goyal et al. 2017, "Accurate, Large Minibatch SGD", Sec. 2.1; the official
  TSM recipe is 0.02 per 128 clips), square root for LAMB / Adam (You et al. 2020, "Large Batch
  Optimization for Deep Learning", Sec. 4: "square root LR scaling"). ``base_lr`` is the lr at
  ``base_batch`` clips.
- scheduler steps: ``total_num_steps`` = optimizer steps per epoch x epochs (or ``--max-steps``);
  ``warmup_num_steps`` / ``warmup_steps`` from ``--warmup-steps`` (default 0; DeepSpeed needs >= 1).
- warm-up of ``tsm_ds.lr_schedule`` (``warmup_steps: "auto"``): ``--warmup-steps`` if given; else
  ``--warmup-epochs`` or the recipe's ``warmup_epochs`` (epochs x optimizer steps per epoch); else,
  whenever a scaling rule multiplies the lr (global batch > ``base_batch``), the gradual warm-up of
  Goyal et al. 2017 (Sec. 2.2: 5 epochs, linear), capped at :data:`WARMUP_MAX_FRACTION` of the
  run's steps for a short run (the log says so); else none.
- per-group lrs: DeepSpeed's WarmupLR / WarmupDecayLR / OneCycle / LRRangeTest write one lr into
  every param group when given a scalar; ``"auto"`` becomes a per-group list (lr x lr_mult) and a
  non-zero scalar with unequal lr multipliers is an error (it would erase fc x5 / bias x10).

JSON values win: a command-line flag for a key the JSON fixes (not ``"auto"``) is an error.
"""
from __future__ import annotations

import copy
import json
import math
from typing import Any

from tsm_ds.engine.config.recipes import AUTO, ConfigError, optimizer_kind

__all__ = ["DEFAULTS", "FLAG_KEYS", "CLIENT_OPTIMIZERS", "SCALING_DEFAULT", "WARMUP_MAX_FRACTION", "scaled_lr",
           "warmup_steps_for", "resolve_config"]

# Official TSM Kinetics defaults (main.py / opts.py of mit-han-lab/temporal-shift-module).
DEFAULTS = {
    "micro_batch_size": 8,        # 64 clips on 8 GPUs
    "base_lr": 0.02,              # per 128 clips
    "base_batch": 128,
    "weight_decay": 1e-4,
    "clip_grad": 20.0,
    "lr_steps": [20, 40],
    "gamma": 0.1,
    "warmup_steps": 0,
    "warmup_epochs": 5.0,         # Goyal et al. 2017, Sec. 2.2, when a rule scales the lr up
    "momentum": 0.9,
}
#: an automatic warm-up takes at most this share of a run's optimizer steps (a short run's)
WARMUP_MAX_FRACTION = 0.25

# flag name (train.py dest) -> JSON path it fills; each must be "auto" in the JSON to be given.
FLAG_KEYS = {
    "batch_size": "train_batch_size",
    "micro_batch_size": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
    "clip_grad": "gradient_clipping",
    "lr": "<optimizer>.params.lr",
    "weight_decay": "<optimizer>.params.weight_decay",
    "warmup_steps": "<scheduler>.warmup steps",
    "warmup_epochs": "tsm_ds.lr_schedule.warmup_epochs",
    "lr_steps": "tsm_ds.lr_schedule.decay_epochs",
}

CLIENT_OPTIMIZERS = {"timm.lamb", "timm.lars", "torch.sgd", "torch.adamw"}
SCALING_DEFAULT = {"sgd": "linear", "timm.lars": "linear", "torch.sgd": "linear",
                   "lamb": "sqrt", "timm.lamb": "sqrt", "adam": "sqrt", "adamw": "sqrt",
                   "torch.adamw": "sqrt"}


def _strip_comments(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_comments(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, list):
        return [_strip_comments(v) for v in obj]
    return obj


def scaled_lr(rule: str, base_lr: float, base_batch: int, global_batch: int) -> float:
    """lr for ``global_batch`` clips from ``base_lr`` at ``base_batch`` clips.

    ``linear``: base_lr x B / base_batch (Goyal et al. 2017, Sec. 2.1; SGD and LARS).
    ``sqrt``: base_lr x sqrt(B / base_batch) (You et al. 2020, LAMB, Sec. 4). ``none``: base_lr.

    Raises:
        ConfigError: unknown rule.
    """
    if rule == "linear":
        return base_lr * global_batch / base_batch
    if rule == "sqrt":
        return base_lr * math.sqrt(global_batch / base_batch)
    if rule == "none":
        return base_lr
    raise ConfigError(f"tsm_ds.lr_scaling.rule = {rule!r}: use \"linear\", \"sqrt\" or \"none\"")


def warmup_steps_for(*, flag_steps: int | None, flag_epochs: float | None, recipe_epochs: float | None,
                     lr_factor: float, steps_per_epoch: int, total_steps: int) -> tuple[int, str]:
    """Optimizer steps of the linear warm-up of ``tsm_ds.lr_schedule`` (module docstring) and why.

    Args:
        flag_steps: ``--warmup-steps`` (wins, exact); flag_epochs: ``--warmup-epochs`` (exact);
        recipe_epochs: the recipe's ``warmup_epochs`` (capped for a short run), None: not given;
        lr_factor: the scaling rule's multiplier (scaled lr / base lr; 1 without a rule or with
            ``--lr``): above 1, :data:`DEFAULTS` ``warmup_epochs`` (5, Goyal et al.), capped;
        steps_per_epoch, total_steps: the run's optimizer steps.

    Returns:
        (steps >= 0, a note for the log). The cap is :data:`WARMUP_MAX_FRACTION` of ``total_steps``.

    Raises:
        ConfigError: negative epochs.
    """
    if flag_steps is not None:
        return int(flag_steps), f"{int(flag_steps)} (--warmup-steps)"
    if flag_epochs is not None:
        if float(flag_epochs) < 0:
            raise ConfigError(f"--warmup-epochs {flag_epochs}: give epochs >= 0")
        n = int(round(float(flag_epochs) * steps_per_epoch))
        return n, f"{n} (--warmup-epochs {float(flag_epochs):g} x {steps_per_epoch} steps)"
    if recipe_epochs is not None:
        if float(recipe_epochs) < 0:
            raise ConfigError(f"tsm_ds.lr_schedule.warmup_epochs = {recipe_epochs}: give epochs >= 0")
        epochs, src = float(recipe_epochs), "the recipe's warmup_epochs"
    elif lr_factor > 1.0:
        epochs = float(DEFAULTS["warmup_epochs"])
        src = f"the scaling rule multiplies the lr by {lr_factor:g}: Goyal et al.'s gradual warm-up"
    else:
        return int(DEFAULTS["warmup_steps"]), "0 (no scaling rule raises the lr)"
    want = int(round(epochs * steps_per_epoch))
    n = min(want, int(WARMUP_MAX_FRACTION * total_steps))
    why = f"{n} ({src}, {epochs:g} epochs x {steps_per_epoch} steps"
    return n, why + (f", capped at {WARMUP_MAX_FRACTION:g} of this run's {total_steps} steps)" if n < want else ")")


def _check_flag(flags: dict, name: str, key: str, value: Any) -> Any:
    """The flag's value when the JSON says "auto"; error when the JSON fixes the key."""
    given = flags.get(name)
    if given is None:
        return None
    if value != AUTO:
        raise ConfigError(f"--{name.replace('_', '-')} {given} conflicts with the engine JSON, which "
                          f"fixes `{key}` = {json.dumps(value)}: set `{key}` to \"auto\" in the JSON "
                          f"or drop the flag (JSON values win)")
    return given


#: above this many ranks, fp16 gradients summed without a pre-division are refused (validate_config)
FP16_SUM_MAX_RANKS = 64


def predivide_factor(cfg: dict, world_size: int) -> float:
    """``gradient_predivide_factor`` for ``"auto"``: sqrt(world size) when the gradients are summed
    in fp16 (``fp16.enabled`` and ``communication_data_type`` not fp32), else 1.0.

    DeepSpeed (``runtime/engine.py``, ``allreduce_bucket``) divides by this factor before the
    all-reduce and by world size / factor after it. With 1.0 it sums the loss-scaled fp16
    gradients of every rank first: at 1,536 ranks a sum can exceed fp16's 65,504, the step is
    skipped and the loss scale falls until small gradients underflow; dividing by the whole world
    size first underflows instead. sqrt(world size) splits the range between both (our choice;
    DeepSpeed's config docs: the pre-division "helps avoid fp16 overflow"); fp32 communication
    (``communication_data_type: fp32``) avoids both at twice the bytes.
    """
    import math

    fp16 = bool((cfg.get("fp16") or {}).get("enabled"))
    comm = str(cfg.get("communication_data_type") or ("fp16" if fp16 else "fp32")).lower()
    if not fp16 or comm in ("fp32", "float32", "float"):
        return 1.0
    return round(math.sqrt(max(1, int(world_size))), 4)


def _batch_sizes(cfg: dict, flags: dict, filled: dict, W: int):
    """Fill the three batch sizes of ``cfg`` in place (module docstring); returns (global, micro,
    accumulation)."""
    g = cfg.get("train_batch_size", AUTO)
    m = cfg.get("train_micro_batch_size_per_gpu", AUTO)
    a = cfg.get("gradient_accumulation_steps", AUTO)
    g = _check_flag(flags, "batch_size", "train_batch_size", g) or g
    m = _check_flag(flags, "micro_batch_size", "train_micro_batch_size_per_gpu", m) or m
    a = _check_flag(flags, "grad_accum", "gradient_accumulation_steps", a) or a
    for key, v in (("train_batch_size", g), ("train_micro_batch_size_per_gpu", m),
                   ("gradient_accumulation_steps", a)):
        if v != AUTO and (not isinstance(v, int) or v < 1):
            raise ConfigError(f"`{key}` = {json.dumps(v)}: must be a positive integer or \"auto\"")
    if m == AUTO:
        if g != AUTO and a != AUTO:
            if g % (a * W):
                raise ConfigError(f"train_batch_size {g} is not divisible by gradient_accumulation_steps "
                                  f"{a} x world size {W} = {a * W}: change `train_batch_size`")
            m = g // (a * W)
        elif g != AUTO:
            if g % W:
                raise ConfigError(f"train_batch_size {g} is not divisible by the world size {W}: change "
                                  f"`train_batch_size` or the number of ranks")
            # the largest micro-batch <= 8 (official per GPU) that divides the clips per rank
            per_rank = g // W
            m = max(d for d in range(1, min(DEFAULTS["micro_batch_size"], per_rank) + 1) if per_rank % d == 0)
        else:
            m = DEFAULTS["micro_batch_size"]
        filled["train_micro_batch_size_per_gpu"] = m
    if a == AUTO:
        if g == AUTO:
            a = 1
        elif g % (m * W):
            raise ConfigError(f"train_batch_size {g} is not divisible by train_micro_batch_size_per_gpu {m} "
                              f"x world size {W} = {m * W}: gradient accumulation would be "
                              f"{g / (m * W):.3g}; change `train_batch_size`, the micro-batch or the "
                              f"number of ranks")
        else:
            a = g // (m * W)
        filled["gradient_accumulation_steps"] = a
    if g == AUTO:
        g = m * a * W
        filled["train_batch_size"] = g
    if g != m * a * W:
        raise ConfigError(f"inconsistent batch sizes: train_batch_size {g} != train_micro_batch_size_per_gpu "
                          f"{m} x gradient_accumulation_steps {a} x world size {W} = {m * a * W}; set "
                          f"`gradient_accumulation_steps` to \"auto\" or fix one of the three")
    cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"] = g, m, a
    return g, m, a


def _clip_and_predivide(cfg: dict, flags: dict, filled: dict, W: int):
    """``gradient_clipping`` (never implicit) and an ``"auto"`` ``gradient_predivide_factor``, in place."""
    # ---- gradient clipping (DeepSpeed's default became 1.0 in 0.19.3: never leave it implicit)
    if "gradient_clipping" not in cfg:
        raise ConfigError("`gradient_clipping` is missing: DeepSpeed >= 0.19.3 then clips at 1.0; set it "
                          "(20 is the official TSM value, 0 turns clipping off, \"auto\" takes --clip-grad)")
    clip = _check_flag(flags, "clip_grad", "gradient_clipping", cfg["gradient_clipping"])
    if cfg["gradient_clipping"] == AUTO:
        cfg["gradient_clipping"] = float(clip if clip is not None else DEFAULTS["clip_grad"])
        filled["gradient_clipping"] = cfg["gradient_clipping"]

    # ---- fp16 gradients over many ranks: "auto" pre-divides by sqrt(world size)
    if cfg.get("gradient_predivide_factor") == AUTO:
        cfg["gradient_predivide_factor"] = predivide_factor(cfg, W)
        filled["gradient_predivide_factor"] = (f"{cfg['gradient_predivide_factor']:g} (sqrt of {W} ranks: fp16 "
                                               "sums stay in range)" if cfg["gradient_predivide_factor"] != 1.0
                                               else "1.0 (not fp16 gradient sums)")


def _optimizer(cfg: dict, tsm: dict, flags: dict, filled: dict, g: int):
    """The optimizer's lr (by its scaling rule) and weight decay, in place; returns (lr or None, the
    rule's lr multiplier)."""
    # ---- optimizer lr / weight decay
    src, otype, oblock = optimizer_kind({**cfg, "tsm_ds": tsm})
    if src == "client" and otype not in CLIENT_OPTIMIZERS:
        raise ConfigError(f"tsm_ds.optimizer.type = {oblock.get('type')!r}: use one of "
                          f"{sorted(CLIENT_OPTIMIZERS)}")
    okey = "optimizer" if src == "deepspeed" else "tsm_ds.optimizer"
    lr, lr_factor = None, 1.0
    if src != "none":
        params = oblock.setdefault("params", {})
        flag_lr = _check_flag(flags, "lr", f"{okey}.params.lr", params.get("lr", AUTO))
        if params.get("lr", AUTO) == AUTO:
            scaling = dict(tsm.get("lr_scaling", {}))
            rule = scaling.get("rule", SCALING_DEFAULT.get(otype, "linear"))
            if flag_lr is not None:
                params["lr"] = float(flag_lr)
                filled[f"{okey}.params.lr"] = f"{params['lr']:g} (--lr)"
            else:
                base_lr = float(scaling.get("base_lr", DEFAULTS["base_lr"]))
                base_batch = int(scaling.get("base_batch", DEFAULTS["base_batch"]))
                params["lr"] = scaled_lr(rule, base_lr, base_batch, g)
                lr_factor = params["lr"] / base_lr if base_lr > 0 else 1.0
                filled[f"{okey}.params.lr"] = (f"{params['lr']:g} ({rule} rule: base {base_lr:g} per "
                                               f"{base_batch} clips, global batch {g})")
        wd = _check_flag(flags, "weight_decay", f"{okey}.params.weight_decay",
                         params.get("weight_decay", AUTO))
        if params.get("weight_decay", AUTO) == AUTO:
            params["weight_decay"] = float(wd if wd is not None else DEFAULTS["weight_decay"])
            filled[f"{okey}.params.weight_decay"] = params["weight_decay"]
        lr = float(params["lr"])
    else:
        for name in ("lr", "weight_decay"):
            if flags.get(name) is not None:
                raise ConfigError(f"--{name.replace('_', '-')} given but the engine JSON has no `optimizer` "
                                  f"or `tsm_ds.optimizer` block to apply it to")
    return lr, lr_factor


def _deepspeed_scheduler(cfg: dict, tsm: dict, flags: dict, filled: dict, lr, lr_mults: list, total_steps: int):
    """DeepSpeed's ``scheduler`` block's ``"auto"`` values, in place; returns whether
    ``--warmup-steps`` was used."""
    warm_flag_used = False
    if cfg.get("scheduler") and tsm.get("lr_schedule"):
        raise ConfigError("engine JSON has both `scheduler` and `tsm_ds.lr_schedule`: keep one")
    if cfg.get("scheduler"):
        sched = cfg["scheduler"]
        stype = sched.get("type", "")
        sp = sched.setdefault("params", {})
        if stype in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR") and "warmup_type" not in sp:
            raise ConfigError(f"scheduler.params.warmup_type is missing for {stype}: DeepSpeed then warms up "
                              f"logarithmically; set \"linear\" (or \"log\" if that is what you want)")
        if sp.get("total_num_steps") == AUTO:
            sp["total_num_steps"] = total_steps
            filled["scheduler.params.total_num_steps"] = total_steps
        if "warmup_num_steps" in sp:
            w = _check_flag(flags, "warmup_steps", "scheduler.params.warmup_num_steps", sp["warmup_num_steps"])
            warm_flag_used = w is not None
            if sp["warmup_num_steps"] == AUTO:
                sp["warmup_num_steps"] = max(1, int(w if w is not None else DEFAULTS["warmup_steps"]))
                filled["scheduler.params.warmup_num_steps"] = sp["warmup_num_steps"]
        lr_keys = {"WarmupLR": ("warmup_min_lr", "warmup_max_lr"),
                   "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr"),
                   "OneCycle": ("cycle_min_lr", "cycle_max_lr"),
                   "LRRangeTest": ("lr_range_test_min_lr",)}.get(stype, ())
        for k in lr_keys:
            v = sp.get(k, AUTO if k.endswith("max_lr") else 0.0)
            if v == AUTO:
                if lr is None:
                    raise ConfigError(f"scheduler.params.{k} = \"auto\" needs an optimizer lr to scale from")
                frac = 0.0 if k.endswith("min_lr") and k != "lr_range_test_min_lr" else 1.0
                if k == "cycle_min_lr":
                    frac = 0.1
                sp[k] = [lr * frac * mu for mu in lr_mults]
                filled[f"scheduler.params.{k}"] = [round(x, 10) for x in sp[k]]
            elif isinstance(v, (int, float)) and v != 0 and len(set(lr_mults)) > 1:
                raise ConfigError(f"scheduler.params.{k} = {v} is a scalar: DeepSpeed's {stype} writes it into "
                                  f"all {len(lr_mults)} param groups, erasing the lr multipliers {lr_mults} "
                                  f"(fc x5 / bias x10); set it to \"auto\" or a list of {len(lr_mults)} "
                                  f"per-group values")
            elif isinstance(v, list) and len(v) != len(lr_mults):
                raise ConfigError(f"scheduler.params.{k} has {len(v)} values for {len(lr_mults)} param groups")
    return warm_flag_used


def _tsm_schedule(tsm: dict, flags: dict, filled: dict, lr_factor: float, steps_per_epoch: int, total_steps: int,
                  warm_flag_used: bool):
    """``tsm_ds.lr_schedule``'s ``"auto"`` values (warm-up, decay epochs) and the flags' checks, in
    place; returns (the block or None, whether a warm-up flag was used)."""
    ls = tsm.get("lr_schedule")
    if ls:
        ls = tsm["lr_schedule"] = dict(ls)
        if ls.get("type") not in ("step", "cosine", "constant"):
            raise ConfigError(f"tsm_ds.lr_schedule.type = {ls.get('type')!r}: use \"step\", \"cosine\" "
                              f"or \"constant\"")
        w = _check_flag(flags, "warmup_steps", "tsm_ds.lr_schedule.warmup_steps", ls.get("warmup_steps", AUTO))
        we = _check_flag(flags, "warmup_epochs", "tsm_ds.lr_schedule.warmup_epochs", ls.get("warmup_epochs", AUTO))
        warm_flag_used = warm_flag_used or w is not None or we is not None
        if ls.get("warmup_steps", AUTO) == AUTO:
            recipe_epochs = None if ls.get("warmup_epochs", AUTO) in (AUTO, None) else ls["warmup_epochs"]
            ls["warmup_steps"], why = warmup_steps_for(flag_steps=w, flag_epochs=we, recipe_epochs=recipe_epochs,
                                                       lr_factor=lr_factor, steps_per_epoch=steps_per_epoch,
                                                       total_steps=total_steps)
            filled["tsm_ds.lr_schedule.warmup_steps"] = why
        elif we is not None or ls.get("warmup_epochs", AUTO) not in (AUTO, None):
            raise ConfigError("tsm_ds.lr_schedule gives warmup_steps, so a warm-up in epochs (--warmup-epochs or "
                              "warmup_epochs) cannot apply: set warmup_steps to \"auto\"")
        ls.pop("warmup_epochs", None)
        if ls["type"] == "step":
            d = _check_flag(flags, "lr_steps", "tsm_ds.lr_schedule.decay_epochs", ls.get("decay_epochs", AUTO))
            if ls.get("decay_epochs", AUTO) == AUTO:
                ls["decay_epochs"] = list(d if d is not None else DEFAULTS["lr_steps"])
                filled["tsm_ds.lr_schedule.decay_epochs"] = ls["decay_epochs"]
            ls.setdefault("gamma", DEFAULTS["gamma"])
        ls["steps_per_epoch"] = steps_per_epoch
        ls["total_steps"] = total_steps
    if flags.get("warmup_steps") is not None and not warm_flag_used:
        raise ConfigError("--warmup-steps given but the engine JSON has no scheduler with warmup steps")
    if flags.get("warmup_epochs") is not None and not ls:
        raise ConfigError("--warmup-epochs given but the engine JSON has no `tsm_ds.lr_schedule` to warm up")
    if flags.get("lr_steps") is not None and not (ls and ls.get("type") == "step"):
        raise ConfigError("--lr-steps given but the engine JSON has no `tsm_ds.lr_schedule` of type \"step\"")
    return ls, warm_flag_used


def resolve_config(raw: dict, *, world_size: int, train_samples: int, epochs: int,
                   max_steps: int | None = None, lr_mults: list[float] | None = None,
                   flags: dict | None = None) -> tuple[dict, dict, dict, int]:
    """Fill every ``"auto"`` of a recipe for this run.

    Args:
        raw: the recipe as loaded (not modified).
        world_size: data-parallel ranks.
        train_samples: clips in the training set.
        epochs: planned epochs.
        max_steps: stop after this many optimizer steps (caps ``total_num_steps``).
        lr_mults: one lr multiplier per param group, in the order the groups reach the optimizer.
        flags: command-line values by ``FLAG_KEYS`` name (None = not given).

    Returns:
        (ds_config for ``deepspeed.initialize`` without the ``tsm_ds`` block, the resolved
        ``tsm_ds`` block, ``filled`` {json key: value} for the log, optimizer steps per epoch).

    Raises:
        ConfigError: inconsistent or uneven batch sizes, a flag for a fixed key, an epoch shorter
        than one global batch, a scalar scheduler lr that would erase the per-group multipliers,
        an unknown lr scaling rule, an ``"auto"`` this function cannot fill.
    """
    flags = dict(flags or {})
    lr_mults = list(lr_mults or [1.0])
    cfg = _strip_comments(copy.deepcopy(raw))
    filled: dict[str, Any] = {}
    W = int(world_size)

    g, m, a = _batch_sizes(cfg, flags, filled, W)
    # optimizer steps per epoch: DistributedSampler gives ceil(N / W) clips per rank; drop_last
    per_rank = math.ceil(train_samples / W)
    steps_per_epoch = per_rank // (m * a)
    if steps_per_epoch < 1:
        raise ConfigError(f"the training set has {train_samples} clips, {per_rank} per rank: fewer than one "
                          f"optimizer step of micro-batch {m} x accumulation {a} per rank (global batch {g}); "
                          f"lower `train_batch_size` / `train_micro_batch_size_per_gpu` or add data")
    total_steps = steps_per_epoch * epochs
    if max_steps is not None:
        total_steps = min(total_steps, int(max_steps))
    total_steps = max(total_steps, 1)

    _clip_and_predivide(cfg, flags, filled, W)
    tsm = cfg.pop("tsm_ds", {}) or {}
    lr, lr_factor = _optimizer(cfg, tsm, flags, filled, g)
    warm_flag_used = _deepspeed_scheduler(cfg, tsm, flags, filled, lr, lr_mults, total_steps)
    ls, warm_flag_used = _tsm_schedule(tsm, flags, filled, lr_factor, steps_per_epoch, total_steps, warm_flag_used)
    # ---- monitor output paths
    for mon in ("tensorboard", "csv_monitor"):
        if isinstance(cfg.get(mon), dict) and cfg[mon].get("output_path") == AUTO:
            filled[f"{mon}.output_path"] = "<run dir>/tensorboard"  # the trainer sets the path

    left = [k for k, v in _walk(cfg) if v == AUTO and not k.endswith("output_path")]
    left += [f"tsm_ds.{k}" for k, v in _walk(tsm) if v == AUTO]
    if left:
        raise ConfigError(f"cannot fill \"auto\" for {', '.join(left)}: give the value in the JSON")
    return cfg, tsm, filled, steps_per_epoch


def _walk(obj: Any, prefix: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, obj
