"""``tsm-ds config``: the engine JSON a training run would use, resolved, without launching it.

    tsm-ds config --deepspeed_config gpu_kinetics_1536 --world-size 1536 --train-samples 240000 --device cuda
    tsm-ds config --deepspeed_config cpu_fp32 --world-size 2 --train-samples 96 --batch-size 8 --lr 0.01

Prints the recipe with every ``"auto"`` filled for that world size and training-set size (exactly
what the trainer would pass to ``deepspeed.initialize``, plus the ``tsm_ds`` block), what each
``"auto"`` became, the batch layout, optimizer steps per epoch and in all, the lr schedule, and the
lr of every parameter group (fc x5, bias x10: ``tsm_ds.models.groups.parameter_groups`` of the model
the model flags build). The training flags are train's (the schedule section of the configuration tree)
and follow the same rule: a flag only where the JSON says "auto". ``--resume-from RUN`` shows what
``--resume auto`` of that run would resolve on ``--world-size`` ranks (global batch kept,
:mod:`tsm_ds.engine.checkpoint.reshard`). Exit status 2 with the error message for a combination that cannot
work (the trainer's own :func:`~tsm_ds.engine.config.resolve.resolve_config` and
:func:`~tsm_ds.engine.config.checks.validate_config`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.commands import PLAN
from tsm_ds.config.fields import build_parser as build_parser_for

#: the fields this command uses
COMMAND = PLAN


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds config`` argument parser (generated: :data:`tsm_ds.config.commands.PLAN`)."""
    return build_parser_for(COMMAND, Config)


def recipe_device(ds_config: dict, tsm: dict, recipe: str) -> tuple[str, str]:
    """The device a recipe is meant for, and why: ``cuda`` for fp16, a CUDA-only DeepSpeed optimizer
    (FusedLamb / FusedLion) or a ``gpu_*`` recipe name; else ``$DS_ACCELERATOR`` when it names
    cpu / cuda, else cuda when a GPU is visible, else cpu. Jobs are planned where they do not run:
    a GPU recipe is checked for the GPU, whatever this machine has.
    """
    from tsm_ds.engine.config.recipes import recipe_needs_cuda

    why = recipe_needs_cuda({**ds_config, "tsm_ds": tsm}, recipe)
    if why:
        return "cuda", why
    if os.environ.get("DS_ACCELERATOR") in ("cpu", "cuda"):
        return os.environ["DS_ACCELERATOR"], "$DS_ACCELERATOR"
    import torch
    return ("cuda", "a GPU is visible") if torch.cuda.is_available() else ("cpu", "this machine has no GPU")


def _schedule(tsm: dict, ds: dict, steps_per_epoch: int, total: int) -> list[str]:
    """Lines describing the lr schedule (factor of each group's peak lr at its turning points)."""
    ls = tsm.get("lr_schedule")
    if not ls:
        sched = ds.get("scheduler")
        return [f"DeepSpeed scheduler {sched['type']}: {json.dumps(sched.get('params', {}))}"] if sched else \
            ["constant lr (no scheduler)"]
    import torch

    from tsm_ds.engine.loop.optim import client_scheduler_factory
    sch = client_scheduler_factory(ls)(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
    marks = {0, max(0, ls.get("warmup_steps", 0) - 1), total - 1}
    marks |= {int(e * steps_per_epoch) for e in ls.get("decay_epochs", []) if e * steps_per_epoch < total}
    head = f"{ls['type']} schedule, warmup {ls.get('warmup_steps', 0)} steps" + (
        f", x{ls.get('gamma', 0.1):g} at epochs {', '.join(f'{e:g}' for e in ls['decay_epochs'])}"
        if ls["type"] == "step" else "")
    return [head + "; lr factor at optimizer step: "
            + ", ".join(f"{s + 1}: {sch.factor(s):.4g}" for s in sorted(m for m in marks if 0 <= m < total))]


def _multigrid(cfg: Config, tsm: dict, *, g: int) -> dict | None:
    """The multigrid schedule of the planned run (``--multigrid``): ``{"epochs", "total_steps", "stages":
    [rows of MultigridSchedule.table]}``, or None for ``--multigrid none``; as the trainer
    (:func:`tsm_ds.engine.loop.build.multigrid_schedule`), ``tsm``'s ``lr_schedule.decay_epochs`` is emptied.
    Raises ValueError (names the flag)."""
    sch, plan = cfg.schedule, cfg.plan
    if sch.multigrid == "none":
        return None
    from tsm_ds.engine.loop.multigrid import build_schedule

    ls = tsm.get("lr_schedule") or {}
    if ls.get("type") != "step":
        raise ValueError(f"--multigrid {sch.multigrid} needs a stepwise lr (tsm_ds.lr_schedule type \"step\"); "
                         f"this recipe's is {ls.get('type', 'none')}")
    s = build_schedule(frames=int(cfg.model.num_segments), crop=int(cfg.data.img_size), global_batch=int(g),
                       epochs=int(sch.epochs), lr_steps=ls.get("decay_epochs") or (), gamma=float(ls.get("gamma", 0.1)),
                       even_frames=bool(cfg.model.temporal_pool), **sch.multigrid_options())
    tsm["lr_schedule"] = {**ls, "decay_epochs": []}   # as the trainer: the stages' lr factors decay the lr
    epoch_clips = -(-plan.train_samples // plan.world_size) * plan.world_size
    return {"epochs": s.epochs, "total_steps": s.total_steps(epoch_clips), "stages": s.table(epoch_clips)}


def main(argv: list[str] | None = None) -> int:
    """``tsm-ds config``: print the resolved configuration; 0, or 2 with the reason on a bad combination."""
    cfg, _ = parse(COMMAND, Config, argv)
    plan, m, sch = cfg.plan, cfg.model, cfg.schedule
    import torch

    from tsm_ds.engine.checkpoint import reshard
    from tsm_ds.engine.comm.rendezvous import collective_timeout_s, dist_timeout_s
    from tsm_ds.engine.config.checks import validate_config
    from tsm_ds.engine.config.recipes import ConfigError, load_config, optimizer_kind, resolve_recipe
    from tsm_ds.engine.config.resolve import resolve_config
    from tsm_ds.engine.loop.optim import apply_group_lrs
    from tsm_ds.models import build_model
    from tsm_ds.models.groups import head_mults_on, parameter_groups

    if plan.world_size < 1 or plan.train_samples < 1:
        print("tsm-ds config: --world-size and --train-samples must be >= 1", file=sys.stderr)
        return 2
    device, why = plan.device, "--device"
    try:
        path = resolve_recipe(cfg.engine.deepspeed_config)
        raw = load_config(path)
        model = build_model(m.arch, m.num_classes, **m.build_options())
        flags, plan_note = sch.engine_flags(), None
        if plan.resume_from:
            raw, flags, plan_note = reshard.resume_engine_inputs(raw, flags, run_dir=plan.resume_from,
                                                                 resume="auto", world=plan.world_size)
        head = head_mults_on(sch.head_lr_mults, pretrained=bool(m.pretrained), tune_from=None)
        probe = [g for g in parameter_groups(model, weight_decay=0.0, head_mults=head) if g["params"]]
        ds, tsm, filled, spe = resolve_config(
            raw, world_size=plan.world_size, train_samples=plan.train_samples, epochs=sch.epochs,
            max_steps=sch.max_steps, lr_mults=[float(g["lr_mult"]) for g in probe], flags=flags)
        reshard.annotate_filled(filled, plan_note)
        if device is None:
            device, why = recipe_device(ds, tsm, str(path))
        validate_config(ds, tsm, device=device, has_batchnorm=any(
            isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) for mod in model.modules()))
    except ConfigError as e:
        print(f"tsm-ds config: {e} (checked for --device {device or 'auto'}, {plan.world_size} ranks)",
              file=sys.stderr)
        return 2
    except (KeyError, ValueError) as e:   # an unknown --arch, a bad model option
        print(f"tsm-ds config: {e}", file=sys.stderr)
        return 2
    _, _, oblock = optimizer_kind({**ds, "tsm_ds": tsm})
    params = oblock["params"]
    groups = apply_group_lrs([g for g in parameter_groups(model, weight_decay=float(params["weight_decay"]),
                                                          head_mults=head)
                              if g["params"]], float(params["lr"]))
    try:
        mg = _multigrid(cfg, tsm, g=ds["train_batch_size"])
    except ValueError as e:
        print(f"tsm-ds config: {e}", file=sys.stderr)
        return 2
    planned = mg["total_steps"] if mg else spe * sch.epochs
    total = planned if sch.max_steps is None else min(planned, sch.max_steps)
    rows = [{"group": g["name"], "lr_mult": g["lr_mult"], "lr": g["lr"], "weight_decay": g["weight_decay"],
             "parameters": sum(p.numel() for p in g["params"])} for g in groups]
    g, m, a = ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    dc = cfg.distributed
    timeouts = {"join_s": dist_timeout_s(dc.dist_timeout), "step_s": dc.step_timeout, "startup_s": dc.startup_timeout,
                "collective_s": collective_timeout_s(dc.dist_timeout, dc.step_timeout, dc.startup_timeout)}
    if plan.json:
        print(json.dumps({"engine_json": str(path), "device": device, "ds_config": ds, "tsm_ds": tsm,
                          "auto_filled": filled, "world_size": plan.world_size, "global_batch": g, "micro_batch": m,
                          "accumulation": a, "train_samples": plan.train_samples, "steps_per_epoch": spe,
                          "epochs": sch.epochs, "total_steps": total, "param_groups": rows, "timeouts": timeouts,
                          "multigrid": mg},
                         indent=2, default=str))
        return 0
    from tsm_ds.utils.io import markdown_table
    print(f"engine JSON {path}, resolved for {plan.world_size} ranks and {plan.train_samples} training clips "
          f"(validated for {device}: {why}):")
    print(json.dumps({**ds, "tsm_ds": tsm}, indent=2))
    print("\n\"auto\" filled:")
    for k, v in filled.items():
        print(f"  {k} = {v}")
    print(f"\nglobal batch {g} = micro-batch {m} x accumulation {a} x {plan.world_size} ranks")
    print(f"{spe} optimizer steps per epoch x {sch.epochs} epochs"
          + (f", stopped at --max-steps {sch.max_steps}" if sch.max_steps is not None else "")
          + f": {total} optimizer steps")
    for line in _schedule(tsm, ds, spe, total):
        print(line)
    if mg:
        print(f"\nmultigrid {sch.multigrid} (docs/multigrid.md): {mg['epochs']} epochs, {mg['total_steps']} optimizer "
              f"steps; the lr decays by the stages' lr factors (x the warm-up), not by decay_epochs:")
        print(markdown_table(mg["stages"]), end="")
    print(f"\ntimeouts: ranks join within {timeouts['join_s']:.0f} s (--dist-timeout); collectives "
          f"{timeouts['collective_s']:.0f} s, above the hang watchdog's --step-timeout {dc.step_timeout:.0f} s and "
          f"--startup-timeout {dc.startup_timeout:.0f} s: the watchdog fires first (stacks, exit 6)")
    print(f"\nparameter groups of {cfg.model.arch} ({cfg.model.num_classes} classes), peak lr:")
    print(markdown_table(rows), end="")
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
