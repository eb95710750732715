"""Everything the training loop runs on, built from its parts: the engine JSON resolved and
validated for this world size, the process group, ``deepspeed.initialize`` (client optimizer and
schedule, channels-last / compile), the gradient compressor, the data loaders, the checkpoint
manager, the divergence guard, and ``<run>/config.json``.

:func:`build_engine` returns them in one :class:`EngineParts`; the loop
(:mod:`tsm_ds.engine.loop.trainer`) only uses them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from tsm_ds.data.bad_videos import BadVideoTracker
from tsm_ds.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_batch
from tsm_ds.engine.checkpoint import reshard
from tsm_ds.engine.checkpoint.manager import CheckpointManager
from tsm_ds.engine.comm.dist import device as current_device
from tsm_ds.engine.comm.dist import hosts, init_distributed
from tsm_ds.engine.comm.rendezvous import collective_timeout_s, dist_timeout_s
from tsm_ds.engine.config import resolve as cfgmod  # called through the module: tests count the resolutions
from tsm_ds.engine.config.checks import validate_config
from tsm_ds.engine.config.recipes import AUTO, optimizer_kind
from tsm_ds.engine.guards.divergence import DivergenceGuard, EngineGuard, GuardSettings, lr_warmup_steps
from tsm_ds.engine.loop.cadence import ValSubset, val_subset
from tsm_ds.engine.loop.loaders import build_loaders, default_num_workers
from tsm_ds.engine.loop.model_prep import compile_engine, has_batchnorm, prepare_model
from tsm_ds.engine.loop.optim import apply_group_lrs, build_client_optimizer, client_scheduler_factory
from tsm_ds.engine.loop.result import save_config_record
from tsm_ds.engine.loop.settings import TrainSettings
from tsm_ds.engine.loop.state import Layout
from tsm_ds.utils.node import usable_cores

__all__ = ["EngineParts", "build_engine", "make_reduce"]

log = logging.getLogger("tsm_ds.train")


@dataclass
class EngineParts:
    """What :func:`build_engine` built (see the module docstring).

    Attributes:
        engine: the DeepSpeed engine; layout: the batch layout (:class:`~tsm_ds.engine.loop.state.Layout`).
        device: where batches go; input_dtype: the engine's input dtype (fp32, bf16 or fp16).
        ds_config, tsm: the resolved DeepSpeed config and ``tsm_ds`` block.
        group_names: the optimizer's parameter groups, in order.
        compressor: the 1-bit compressor or None; manual_comm: the loop all-reduces the gradient
            itself (ZeRO 0 without DeepSpeed's bf16 optimizer, or the compressor).
        skip_reduce: the loop's DeepSpeed all-reduce would be the identity, so it is skipped: one
            data-parallel rank, no compressor and no ``gradient_predivide_factor`` (DeepSpeed's
            ``allreduce_bucket`` then sums one rank and divides by 1). It flattened and copied
            back every gradient each step: ~39 ms of a ~230 ms single-core step of ResNet-18 at
            32 px (cProfile of the large-batch study's run).
        sampler, loader_gen, loader, val_loader: :func:`tsm_ds.engine.loop.loaders.build_loaders`.
        val_subset: the capped validation subset of intermediate evaluations
            (:func:`tsm_ds.engine.loop.cadence.val_subset`), None without ``--eval-max-clips``.
        bn_loader: with a multigrid schedule (or ``--precise-bn-batches`` given for a one-shape run),
            training micro-batches at the base shape (a plain shuffled loader) whose forward passes
            recompute BatchNorm's statistics before each evaluation
            (:func:`tsm_ds.engine.loop.evaluate.precise_bn_stats`); else None.
        ckpt: the checkpoint manager; guard: the divergence guard; bad: the bad-file tracker.
        reduce: ``f([floats]) -> [sums over ranks]``.
        to_device: ``f(clip) -> input``: a batch's uint8 (N, T, 3, H, W) clips moved to ``device``,
            normalised there in float32 with the train set's mean/std
            (:func:`tsm_ds.data.transforms.normalize_batch`), then cast to ``input_dtype``.
    """

    engine: Any
    layout: Layout
    device: torch.device
    input_dtype: torch.dtype
    ds_config: dict
    tsm: dict
    group_names: list
    compressor: Any
    manual_comm: bool
    sampler: Any
    loader_gen: torch.Generator
    loader: Any
    val_loader: Any
    ckpt: CheckpointManager
    guard: EngineGuard
    bad: BadVideoTracker
    reduce: Callable[[list], list]
    to_device: Callable[[torch.Tensor], torch.Tensor]
    val_subset: ValSubset | None = None
    skip_reduce: bool = False
    bn_loader: Any = None


def make_reduce(world: int, dev: torch.device) -> Callable[[list[float]], list[float]]:
    """``f(values) -> sums over ranks`` (float64 all-reduce; identity for one rank)."""
    def reduce(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if world > 1:
            if dist.get_backend() == "nccl":
                t = t.to(dev)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()
    return reduce


def _resolve(model, train_set, raw: dict, s: TrainSettings, param_groups, world: int, dev_name: str):
    """Resolve (``"auto"``) and validate the engine JSON for ``world`` ranks; returns
    ``(resolved, reshard plan)``. Raises ConfigError."""
    probe = [g for g in param_groups(model, 0.0) if len(list(g["params"]))]
    sch = s.config.schedule
    raw, flags, plan = reshard.resume_engine_inputs(   # another world size: batch kept
        raw, sch.engine_flags(), run_dir=s.run_dir, resume=s.config.output.resume, world=world)
    resolved = cfgmod.resolve_config(raw, world_size=world, train_samples=len(train_set), epochs=sch.epochs,
                                     max_steps=sch.max_steps, lr_mults=[float(g.get("lr_mult", 1.0)) for g in probe],
                                     flags=flags)
    reshard.annotate_filled(resolved[2], plan)
    validate_config(resolved[0], resolved[1], device=dev_name, has_batchnorm=has_batchnorm(model))
    return resolved


def build_engine(model, train_set, val_set, raw: dict, s: TrainSettings, *, param_groups: Callable) -> EngineParts:
    """Build the run's parts (see the module docstring) and write ``<run>/config.json`` on rank 0.

    Args:
        model: the recognizer (prepared here for channels-last / compile).
        train_set, val_set: the datasets (``val_set`` may be None).
        raw: the engine JSON as loaded (``"auto"`` values); s: the trainer's settings.
        param_groups: ``f(model, weight_decay) -> [param group dicts with "lr_mult", "name"]``.

    Raises:
        ConfigError: a recipe that cannot work here, before DeepSpeed starts its backend.
        RendezvousError: not every rank joined within ``--dist-timeout``.
    """
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    c = s.config
    d, sch, dist_cfg = c.data, c.schedule, c.distributed
    model, compile = prepare_model(model, channels_last=c.model.channels_last, compile=c.model.compile)
    # before DeepSpeed starts its communication backend (which may JIT-compile ops for minutes): a
    # recipe that cannot work on this device stops at once; the world size is the launcher's
    world0 = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    resolved = _resolve(model, train_set, raw, s, param_groups, world0, get_accelerator().device_name())
    collective = collective_timeout_s(dist_cfg.dist_timeout, dist_cfg.step_timeout,
                                      dist_cfg.startup_timeout)   # watchdog first
    rank, world = init_distributed(timeout_s=dist_cfg.dist_timeout, hosts=list(dist_cfg.hosts) or None,
                                   collective_s=collective)
    dev = current_device()
    if rank == 0:
        Path(s.run_dir).mkdir(parents=True, exist_ok=True)
    if world != world0:   # WORLD_SIZE unset (e.g. an MPI launch): the real world size
        resolved = _resolve(model, train_set, raw, s, param_groups, world, dev.type)
    ds_cfg, tsm, filled, spe = resolved
    src, otype, oblock = optimizer_kind({**ds_cfg, "tsm_ds": tsm})
    for mon in ("tensorboard", "csv_monitor"):
        if isinstance(ds_cfg.get(mon), dict) and ds_cfg[mon].get("output_path") == AUTO:
            ds_cfg[mon]["output_path"] = str(Path(s.run_dir) / "tensorboard")
    micro, accum = ds_cfg["train_micro_batch_size_per_gpu"], ds_cfg["gradient_accumulation_steps"]
    schedule = multigrid_schedule(c, model, train_set, ds_cfg, tsm)   # None: one shape
    epoch_clips = -(-len(train_set) // world) * world
    try:
        planned = schedule.total_steps(epoch_clips) if schedule is not None else spe * sch.epochs
    except ValueError as e:   # a stage whose step needs more clips than an epoch has
        from tsm_ds.engine.config.recipes import ConfigError
        raise ConfigError(f"--multigrid {sch.multigrid}: {e}") from None
    total = planned if sch.max_steps is None else min(planned, sch.max_steps)
    layout = Layout(rank=rank, world=world, micro=micro, accum=accum, global_batch=ds_cfg["train_batch_size"],
                    steps_per_epoch=spe, total_steps=total, epochs=schedule.epochs if schedule else sch.epochs,
                    schedule=schedule, epoch_clips=epoch_clips)
    if schedule is not None:
        from tsm_ds.models.large_batch import GhostBatchNorm2d, use_ghost_bn
        if not any(isinstance(m, GhostBatchNorm2d) for m in model.modules()):
            use_ghost_bn(model, micro)   # BatchNorm over the base micro-batch's clips at every shape

    params = oblock["params"]
    groups = [g for g in param_groups(model, float(params["weight_decay"])) if len(list(g["params"]))]
    groups = apply_group_lrs(groups, float(params["lr"]))
    names = [g.get("name", f"group{i}") for i, g in enumerate(groups)]
    client_opt = build_client_optimizer(oblock, groups) if src == "client" else None
    sched = client_scheduler_factory(tsm["lr_schedule"]) if tsm.get("lr_schedule") else None
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=None if client_opt else groups,
                                        optimizer=client_opt, lr_scheduler=sched, config=ds_cfg)
    input_dtype = torch.bfloat16 if eng.bfloat16_enabled() else (torch.float16 if eng.fp16_enabled() else torch.float32)
    compressor = None
    comp_cfg = tsm.get("compression")
    if comp_cfg and comp_cfg != "none" and not (isinstance(comp_cfg, dict) and comp_cfg.get("type") == "none"):
        from tsm_ds.engine.comm.compression import build_compressor
        compressor = build_compressor(comp_cfg, eng)
    manual_comm = compressor is not None or not isinstance(eng.optimizer, ZeROOptimizer)
    if manual_comm:
        eng.enable_backward_allreduce = False
    skip_reduce = (manual_comm and compressor is None and eng.dp_world_size == 1
                   and eng.gradient_predivide_factor() == 1.0)

    cuda = dev.type == "cuda"
    local = int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 1)
    workers = default_num_workers(d.num_workers, cuda=cuda, cores=usable_cores(), local_ranks=local)
    if cuda:   # every training clip has the same shape: let cuDNN pick its fastest kernels once
        torch.backends.cudnn.benchmark = True
    sampler, loader_gen, loader, val_loader = build_loaders(
        train_set, val_set, micro=micro, world=world, rank=rank, seed=sch.seed, num_workers=workers,
        eval_batch_size=sch.eval_batch_size, cuda=cuda, schedule=schedule, accum=accum)
    bn_loader = None
    if sch.precise_bn() > 0:   # base-shape batches for precise BatchNorm (with --multigrid, or asked for)
        bn_loader = build_loaders(train_set, None, micro=micro, world=world, rank=rank, seed=sch.seed + 1,
                                  num_workers=workers, cuda=cuda)[2]
    subset = val_subset(val_set, sch.eval_max_clips, seed=sch.seed, world=world, rank=rank,
                        batch_size=sch.eval_batch_size or micro, num_workers=workers, cuda=cuda)
    ckpt = CheckpointManager(Path(s.run_dir) / "checkpoints", keep_last=c.output.keep_last, rank=rank,
                             world_size=world, trust=c.checkpoint.trust_checkpoint)
    bad = BadVideoTracker(train_set, rank=rank, world_size=world)   # distinct files, once
    reduce = make_reduce(world, dev)
    num_classes = len(s.class_names) or int((getattr(model, "config", None) or {}).get("num_classes", 2))

    def last_good() -> str | None:
        tag = ckpt.latest_tag()
        return str(ckpt.dir / tag) if tag else None
    rules = DivergenceGuard(GuardSettings.from_config(c.guard), num_classes,
                            warmup_steps=lr_warmup_steps(ds_cfg, tsm))
    guard = EngineGuard(eng, rules, manual_comm=manual_comm, reduce=reduce,
                        last_good=last_good)

    run_hosts = hosts()   # a collective: every rank
    if rank == 0:
        for k, v in filled.items():
            log.info("engine JSON auto: %s = %s", k, v)
        log.info("timeouts: ranks join within %.0f s; collectives %.0f s, above the hang watchdog's step %.0f s / "
                 "start-up %.0f s, so the watchdog fires first (stacks, exit 6)", dist_timeout_s(dist_cfg.dist_timeout),
                 collective, dist_cfg.step_timeout, dist_cfg.startup_timeout)
        log.info("data loaders: %d worker(s) per rank%s", workers, ", pinned memory, persistent workers, prefetch 4, "
                 "cudnn.benchmark" if cuda else "")
        log.info("world size %d, micro-batch %d, accumulation %d, global batch %d, %d optimizer steps per epoch, "
                 "%d steps planned; gradient all-reduce %s", world, micro, accum, layout.global_batch, spe, total,
                 "skipped (one data-parallel rank: the identity)" if skip_reduce else
                 "timed separately" if manual_comm else "inside DeepSpeed's ZeRO/bf16 optimizer (time/comm_s not "
                 "logged)")
        if schedule is not None:
            log.info("multigrid %s (base shape T=%d, crop %d, global batch %d; the steps per epoch above are the base "
                     "shape's): %d epochs, %d optimizer steps; stages (epochs: T x crop x global batch, lr factor): %s",
                     sch.multigrid, schedule.base_frames, schedule.base_crop, schedule.base_batch, schedule.epochs,
                     total, "; ".join(f"{r['epochs']}: {r['frames']}x{r['crop']}x{r['global_batch']}, "
                                      f"x{r['lr_factor']:g}" for r in schedule.table(epoch_clips)))
        save_config_record(s, raw, ds_cfg, tsm, filled, world=world, steps_per_epoch=spe, total_steps=total,
                           groups=list(zip(names, groups)), hosts=run_hosts)
    compile_engine(eng, compile)
    mean, std = getattr(train_set, "normalization", (IMAGENET_MEAN, IMAGENET_STD))

    def to_device(clip: torch.Tensor) -> torch.Tensor:
        return normalize_batch(clip, mean, std, dev, input_dtype)
    return EngineParts(engine=eng, layout=layout, device=dev, input_dtype=input_dtype, ds_config=ds_cfg, tsm=tsm,
                       group_names=names, compressor=compressor, manual_comm=manual_comm, sampler=sampler,
                       loader_gen=loader_gen, loader=loader, val_loader=val_loader, ckpt=ckpt, guard=guard, bad=bad,
                       reduce=reduce, to_device=to_device, val_subset=subset, skip_reduce=skip_reduce,
                       bn_loader=bn_loader)


def multigrid_schedule(c, model, train_set, ds_cfg: dict, tsm: dict):
    """The run's multigrid shape schedule (``--multigrid``; :func:`tsm_ds.engine.loop.multigrid.build_schedule`
    from the train set's T and crop, the global batch, ``--epochs`` and the recipe's stepwise lr), or
    None for ``--multigrid none``. The schedule's lr factors then make the lr's decay, so the recipe's
    ``tsm_ds.lr_schedule.decay_epochs`` is emptied in ``tsm`` (its warm-up stays, in optimizer steps).

    Raises:
        ConfigError: a schedule with a recipe whose lr is not stepwise (PySlowFast and mmaction2's
            multigrid need one), or a value the schedule refuses (the message names the flag).
    """
    sch = c.schedule
    if sch.multigrid == "none":
        return None
    from tsm_ds.engine.config.recipes import ConfigError
    from tsm_ds.engine.loop.multigrid import build_schedule

    ls = tsm.get("lr_schedule")
    if not ls or ls.get("type") != "step":
        raise ConfigError(f"--multigrid {sch.multigrid} needs a stepwise lr (tsm_ds.lr_schedule type \"step\" with "
                          f"decay_epochs, as PySlowFast and mmaction2's multigrid); this recipe's is "
                          f"{(ls or {}).get('type', 'none')}")
    temporal_pool = bool((getattr(model, "config", None) or {}).get("temporal_pool"))
    try:
        schedule = build_schedule(frames=int(train_set.num_segments), crop=int(train_set.img_size),
                                  global_batch=int(ds_cfg["train_batch_size"]), epochs=int(sch.epochs),
                                  lr_steps=ls.get("decay_epochs") or (), gamma=float(ls.get("gamma", 0.1)),
                                  even_frames=temporal_pool, **sch.multigrid_options())
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tsm["lr_schedule"] = {**ls, "decay_epochs": []}   # the stages' lr factors decay it
    return schedule
