"""``tsm-ds config``: the engine JSON a training run would use, resolved, without launching it.

    tsm-ds config --deepspeed_config gpu_kinetics_1536 --world-size 1536 --train-samples 240000 --device cuda
    tsm-ds config --deepspeed_config cpu_fp32 --world-size 2 --train-samples 96 --batch-size 8 --lr 0.01

Prints the recipe with every ``"auto"`` filled for that world size and training-set size (exactly
what the trainer would pass to ``deepspeed.initialize``, plus the ``tsm_ds`` block), what each
``"auto"`` became, the batch layout, optimizer steps per epoch and in all, the lr schedule, and the
lr of every parameter group (fc x5, bias x10: ``tsm_ds.models.groups.parameter_groups`` of the model
the model flags build). The training flags are train's (:func:`tsm_ds.cli._common.add_training_args`)
and follow the same rule: a flag only where the JSON says "auto". ``--resume-from RUN`` shows what
``--resume auto`` of that run would resolve on ``--world-size`` ranks (global batch kept,
:mod:`tsm_ds.engine.reshard`). Exit status 2 with the error message for a combination that cannot
work (the trainer's own :func:`~tsm_ds.engine.config.resolve_config` and
:func:`~tsm_ds.engine.config.validate_config`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds config`` argument parser."""
    from tsm_ds.cli._common import add_training_args

    p = argparse.ArgumentParser(prog="tsm-ds config", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r = p.add_argument_group("run")
    r.add_argument("--deepspeed_config", required=True, help="engine JSON: a path or a shipped recipe name (cpu_fp32)")
    r.add_argument("--world-size", type=int, required=True, help="data-parallel ranks (nodes x ranks per node)")
    r.add_argument("--train-samples", type=int, required=True, help="clips in the training set (Kinetics-400: ~240000)")
    r.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="device to validate the recipe for (fp16 is GPU-only); default $DS_ACCELERATOR, else cuda "
                        "when a GPU is visible, else cpu")
    r.add_argument("--resume-from", metavar="RUN_DIR",
                   help="resolve as --resume auto of this run would on --world-size ranks (its checkpoint's global "
                        "batch kept)")
    r.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    m = p.add_argument_group("model (for the parameter groups)")
    m.add_argument("--arch", default="resnet50", help="as train's --arch")
    m.add_argument("--num-classes", type=int, default=400)
    m.add_argument("--num-segments", type=int, default=8)
    m.add_argument("--shift", default="bidirectional", choices=["bidirectional", "online", "none"])
    m.add_argument("--shift-div", type=int, default=8)
    m.add_argument("--shift-place", default="blockres", choices=["blockres", "block"])
    m.add_argument("--temporal-pool", action="store_true")
    m.add_argument("--dropout", type=float, default=0.5)
    m.add_argument("--partial-bn", action="store_true")
    add_training_args(p)
    return p


def _default_device() -> str:
    if os.environ.get("DS_ACCELERATOR") in ("cpu", "cuda"):
        return os.environ["DS_ACCELERATOR"]
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _schedule(tsm: dict, ds: dict, steps_per_epoch: int, total: int) -> list[str]:
    """Lines describing the lr schedule (factor of each group's peak lr at its turning points)."""
    ls = tsm.get("lr_schedule")
    if not ls:
        sched = ds.get("scheduler")
        return [f"DeepSpeed scheduler {sched['type']}: {json.dumps(sched.get('params', {}))}"] if sched else \
            ["constant lr (no scheduler)"]
    import torch

    from tsm_ds.engine.optim import client_scheduler_factory
    sch = client_scheduler_factory(ls)(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
    marks = {0, max(0, ls.get("warmup_steps", 0) - 1), total - 1}
    marks |= {int(e * steps_per_epoch) for e in ls.get("decay_epochs", []) if e * steps_per_epoch < total}
    head = f"{ls['type']} schedule, warmup {ls.get('warmup_steps', 0)} steps" + (
        f", x{ls.get('gamma', 0.1):g} at epochs {', '.join(f'{e:g}' for e in ls['decay_epochs'])}"
        if ls["type"] == "step" else "")
    return [head + "; lr factor at optimizer step: "
            + ", ".join(f"{s + 1}: {sch.factor(s):.4g}" for s in sorted(m for m in marks if 0 <= m < total))]


def main(argv: list[str] | None = None) -> int:
    """``tsm-ds config``: print the resolved configuration; 0, or 2 with the reason on a bad combination."""
    args = build_parser().parse_args(argv)
    import torch

    from tsm_ds.cli._common import engine_flags
    from tsm_ds.engine import config as cfgmod
    from tsm_ds.engine import reshard
    from tsm_ds.engine.optim import apply_group_lrs
    from tsm_ds.models import build_model
    from tsm_ds.models.groups import parameter_groups

    device = args.device or _default_device()
    if args.world_size < 1 or args.train_samples < 1:
        print("tsm-ds config: --world-size and --train-samples must be >= 1", file=sys.stderr)
        return 2
    try:
        path = cfgmod.resolve_recipe(args.deepspeed_config)
        raw = cfgmod.load_config(path)
        model = build_model(args.arch, args.num_classes, num_segments=args.num_segments,
                            shift=None if args.shift == "none" else args.shift, shift_div=args.shift_div,
                            shift_place=args.shift_place, temporal_pool=args.temporal_pool, dropout=args.dropout,
                            partial_bn=args.partial_bn)
        flags, plan = engine_flags(args), None
        if args.resume_from:
            raw, flags, plan = reshard.resume_engine_inputs(raw, flags, run_dir=args.resume_from, resume="auto",
                                                            world=args.world_size)
        probe = [g for g in parameter_groups(model, weight_decay=0.0) if g["params"]]
        ds, tsm, filled, spe = cfgmod.resolve_config(
            raw, world_size=args.world_size, train_samples=args.train_samples, epochs=args.epochs,
            max_steps=args.max_steps, lr_mults=[float(g["lr_mult"]) for g in probe], flags=flags)
        reshard.annotate_filled(filled, plan)
        cfgmod.validate_config(ds, tsm, device=device, has_batchnorm=any(
            isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) for mod in model.modules()))
    except cfgmod.ConfigError as e:
        print(f"tsm-ds config: {e} (checked for --device {device}, {args.world_size} ranks)", file=sys.stderr)
        return 2
    except (KeyError, ValueError) as e:   # an unknown --arch, a bad model option
        print(f"tsm-ds config: {e}", file=sys.stderr)
        return 2
    _, _, oblock = cfgmod.optimizer_kind({**ds, "tsm_ds": tsm})
    params = oblock["params"]
    groups = apply_group_lrs([g for g in parameter_groups(model, weight_decay=float(params["weight_decay"]))
                              if g["params"]], float(params["lr"]))
    total = spe * args.epochs if args.max_steps is None else min(spe * args.epochs, args.max_steps)
    rows = [{"group": g["name"], "lr_mult": g["lr_mult"], "lr": g["lr"], "weight_decay": g["weight_decay"],
             "parameters": sum(p.numel() for p in g["params"])} for g in groups]
    g, m, a = ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    if args.json:
        print(json.dumps({"engine_json": str(path), "device": device, "ds_config": ds, "tsm_ds": tsm,
                          "auto_filled": filled, "world_size": args.world_size, "global_batch": g, "micro_batch": m,
                          "accumulation": a, "train_samples": args.train_samples, "steps_per_epoch": spe,
                          "epochs": args.epochs, "total_steps": total, "param_groups": rows}, indent=2, default=str))
        return 0
    from tsm_ds.utils.io import markdown_table
    print(f"engine JSON {path}, resolved for {args.world_size} ranks and {args.train_samples} training clips "
          f"(validated for {device}):")
    print(json.dumps({**ds, "tsm_ds": tsm}, indent=2))
    print("\n\"auto\" filled:")
    for k, v in filled.items():
        print(f"  {k} = {v}")
    print(f"\nglobal batch {g} = micro-batch {m} x accumulation {a} x {args.world_size} ranks")
    print(f"{spe} optimizer steps per epoch x {args.epochs} epochs"
          + (f", stopped at --max-steps {args.max_steps}" if args.max_steps is not None else "")
          + f": {total} optimizer steps")
    for line in _schedule(tsm, ds, spe, total):
        print(line)
    print(f"\nparameter groups of {args.arch} ({args.num_classes} classes), peak lr:")
    print(markdown_table(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
