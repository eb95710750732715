"""``tsm_ds.train``: train TSM with DeepSpeed; what the ``deepspeed`` launcher runs on every rank.

    deepspeed --num_gpus 2 tsm_ds/train.py --deepspeed_config cpu_fp32 \\
        --data ../shared/data/videos --arch resnet18 --img-size 112 --epochs 3
    deepspeed --num_gpus 2 --module tsm_ds.train ...            # the same, as a module
    deepspeed --hostfile launch/hostfile.example tsm_ds/train.py ...   # several machines

``tsm_ds/train.py`` is a shim that calls :func:`main` here. Defaults are the official TSM Kinetics
recipe (mit-han-lab/temporal-shift-module, opts.py and the paper, Sec. 4.1/Appendix): resnet50, 8
segments, shift_div 8, blockres, dropout 0.5, SGD momentum 0.9, lr 0.02 per 128 clips (linear
scaling), weight decay 1e-4, gradient clip 20, 50 epochs with x0.1 steps at epochs 20 and 40.
Run-dependent values of the engine JSON may be "auto" (see :mod:`tsm_ds.engine.config`); the
resolved configuration (flags + engine JSON) is written to ``<output dir>/config.json``. The engine
JSON is given by path or by the name of a shipped recipe (``--deepspeed_config cpu_fp32``).

Data: see :mod:`tsm_ds.data.splits`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The command line (DeepSpeed's --deepspeed / --deepspeed_config added)."""
    p = argparse.ArgumentParser(prog="tsm_ds.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                   help="set by the deepspeed launcher")
    d = p.add_argument_group("data")
    d.add_argument("--data", help="a folder holding manifest.csv (../shared/data) or its videos/ folder, class "
                   "folders under train/ + val/, or a class-per-folder tree (per-class hold-out); with list files, "
                   "the root their paths are relative to (tsm_ds.data.splits.resolve_split)")
    d.add_argument("--train-list", help="list file of training clips: 'path label' per line")
    d.add_argument("--val-list", help="list file of validation clips")
    d.add_argument("--classes", help="class names, one per line (line = label): the names of list-file labels, "
                   "or the label order of class folders")
    d.add_argument("--val-fraction", type=float, default=0.2,
                   help="per-class hold-out for --data trees without train/ val/ folders")
    d.add_argument("--img-size", type=int, default=224, help="crop side in pixels")
    d.add_argument("--no-flip", action="store_true", help="no horizontal flip (direction-sensitive classes)")
    d.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes per rank")
    d.add_argument("--index-cache", default=None,
                   help="also keep the per-file frame indexes on disk in this folder, shared by workers and runs "
                        "(default: $TSM_DS_INDEX_CACHE, else in memory only)")
    d.add_argument("--index-cache-size", type=int, default=None,
                   help="frame indexes kept in memory per process (default: $TSM_DS_INDEX_CACHE_SIZE, else 8192)")
    d.add_argument("--demo-clips", type=int, default=48,
                   help="training clips per class of the generated demo dataset (used only without data)")
    m = p.add_argument_group("model")
    m.add_argument("--arch", default="resnet50", help="resnet18/34/50/101, mobilenet_v2, i3d_resnet50 (non-local paper / mmaction2 layout), i3d_resnet50_release (released non-local code)")
    m.add_argument("--num-segments", type=int, default=8, help="T, frames per clip")
    m.add_argument("--shift", default="bidirectional", choices=["bidirectional", "online", "none"],
                   help="temporal shift (none = TSN)")
    m.add_argument("--shift-div", type=int, default=8)
    m.add_argument("--shift-place", default="blockres", choices=["blockres", "block"])
    m.add_argument("--temporal-pool", action="store_true")
    m.add_argument("--dropout", type=float, default=0.5)
    m.add_argument("--partial-bn", action="store_true")
    m.add_argument("--pretrained", help="torchvision ImageNet state dict file for the backbone")
    m.add_argument("--tune-from", help="weights to start from: an export (RUN/best_model.pt), a run dir, its "
                   "checkpoints/ dir (the 'latest' tag), a tag dir (ZeRO-3 too), or an official TSM file (TSM_..."
                   "_segment8_e50*.pth[.tar] with any suffix, ckpt.best.pth.tar in its TSM_... directory, the online "
                   "demo's mobilenetv2_jester_online.pth.tar); the head is replaced when the class count differs")
    t = p.add_argument_group("training (flags for engine-JSON keys are only allowed where the JSON says \"auto\")")
    t.add_argument("--epochs", type=int, default=50)
    t.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=int, help="global batch (train_batch_size)")
    t.add_argument("--micro-batch-size", type=int, help="clips per rank per micro-batch")
    t.add_argument("--grad-accum", type=int, help="gradient_accumulation_steps")
    t.add_argument("--lr", type=float, help="lr for the global batch (skips the scaling rule)")
    t.add_argument("--weight-decay", type=float, help="default 1e-4")
    t.add_argument("--clip-grad", type=float, help="gradient_clipping; default 20")
    t.add_argument("--warmup-steps", type=int, help="linear warmup in optimizer steps; default 0")
    t.add_argument("--lr-steps", type=float, nargs="+", help="step-decay epochs; default 20 40")
    o = p.add_argument_group("output")
    o.add_argument("--output-dir", default="runs", help="runs are written to OUTPUT_DIR/RUN_NAME")
    o.add_argument("--run-name", help="default: <arch>_T<segments>_<engine json name>")
    o.add_argument("--resume", help="'auto': continue from the latest complete checkpoint of the run dir "
                   "(fresh start when there is none); or a checkpoint tag")
    o.add_argument("--save-every-steps", type=int, default=0, help="also save every N optimizer steps")
    o.add_argument("--keep-last", type=int, default=2, help="complete checkpoints kept besides the best")
    o.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    m.add_argument("--no-fused-shift", action="store_true",
                   help="use the out-of-place reference shift instead of the fused in-place one "
                        "(the same as TSM_DS_FUSED_SHIFT=0)")
    g = p.add_argument_group("run guards (a diverged run stops before its update; exit status 3)")
    g.add_argument("--on-divergence", choices=["stop", "rollback"], default="stop",
                   help="stop: exit 3 naming the step, lr, loss and the last good checkpoint; rollback: reload "
                        "the last good checkpoint, multiply every lr by --rollback-lr-factor, go on")
    g.add_argument("--rollback-lr-factor", type=float, default=0.5, help="lr multiplier per rollback")
    g.add_argument("--max-rollbacks", type=int, default=3, help="rollbacks before the run stops anyway")
    g.add_argument("--divergence-factor", type=float, default=10.0,
                   help="a step whose loss exceeds this multiple of max(running median loss, ln(classes)) "
                        "diverged (0: off)")
    g.add_argument("--max-skipped-steps", type=int, default=20,
                   help="this many skipped updates in a row (fp16 overflow, non-finite bf16 gradients) stop the run "
                        "(0: off)")
    g.add_argument("--inject-nan-at-step", type=int, default=None, help=argparse.SUPPRESS)  # test hook
    g.add_argument("--inject-nan-rank", type=int, default=0, help=argparse.SUPPRESS)
    import deepspeed
    deepspeed.add_config_arguments(p)
    return p


def select_data(args: argparse.Namespace, log: logging.Logger) -> tuple:
    """(split, flip): the run's :class:`tsm_ds.data.splits.Split` and whether to flip training clips.

    The data flags, else ``$TSM_DS_DATA``, else ../shared/data/videos, else the generated demo
    dataset in OUTPUT_DIR/demo_data (:func:`tsm_ds.data.splits.demo_split`); each fallback is logged.
    The demo's classes are directions: flipping is turned off for it (logged). ``args`` is not changed.

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: see :func:`tsm_ds.data.splits.resolve_split`.
    """
    from tsm_ds.data import splits

    data, split = args.data, None
    if data is None and not args.train_list:
        data, origin = splits.default_data()
        if data is None:
            root = Path(args.output_dir) / "demo_data"
            log.info("no data given, TSM_DS_DATA unset and %s absent: using the generated demo dataset in %s",
                     splits.DEFAULT_SHARED, root)
            split = splits.demo_split(root, seed=args.seed, clips=args.demo_clips)
        else:
            log.info("no --data given: using %s (%s)", data, origin)
    if split is None:
        split = splits.resolve_split(data=data, train_list=args.train_list, val_list=args.val_list,
                                     classes=args.classes, val_fraction=args.val_fraction)
    flip = not args.no_flip
    if split.demo:
        if flip:
            log.info("demo dataset: direction classes, so horizontal flip is turned off")
            flip = False
        if args.shift == "none":
            log.info("demo dataset: TSN (--shift none) cannot tell its classes apart; training anyway")
    return split, flip


def main(argv: list[str] | None = None) -> int:
    """Parse, build model + data + trainer, train.

    Returns 0 on success, 2 on a configuration or data error, 3 when the run diverged (the guard
    stopped it; nothing non-finite was saved), 4 when a checkpoint could not be written.
    """
    from tsm_ds.engine.dist import set_accelerator_env, set_threads

    acc_msg = set_accelerator_env()
    thread_msg = set_threads()
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(asctime)s %(levelname)s %(message)s",
                        stream=sys.stdout)
    log = logging.getLogger("tsm_ds.train")
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if acc_msg:
        log.info(acc_msg)
    log.info(thread_msg)
    from tsm_ds.data.video import set_index_cache_dir, set_index_cache_size
    from tsm_ds.models import set_fused_shift

    if os.environ.get("DS_ACCELERATOR") == "cpu":
        log.info("DeepSpeed builds its CPU comm op on first use into %s (up to a few minutes, once per cache; "
                 "launch/ scripts use .venv/torch_extensions)",
                 os.environ.get("TORCH_EXTENSIONS_DIR") or "~/.cache/torch_extensions")
    if args.index_cache:
        set_index_cache_dir(args.index_cache)   # DataLoader workers (forked) inherit it
    if args.index_cache_size:
        set_index_cache_size(args.index_cache_size)
    if args.no_fused_shift:
        set_fused_shift(False)

    import torch
    from tsm_ds.engine.checkpoint import CheckpointResumeError, CheckpointSaveError
    from tsm_ds.engine.guard import DivergenceError, GuardSettings
    from tsm_ds.engine.trainer import Trainer, TrainSettings
    from tsm_ds.engine.config import ConfigError, load_config, resolve_recipe
    try:
        cfg_path = str(resolve_recipe(args.deepspeed_config or (
            "cpu_fp32" if os.environ.get("DS_ACCELERATOR") == "cpu" else "gpu_fp16")))
        log.info("engine JSON: %s%s", cfg_path, "" if args.deepspeed_config else " (no --deepspeed_config: default)")
        engine_json = load_config(cfg_path)
    except ConfigError as e:
        log.error("%s", e)
        return 2

    torch.manual_seed(args.seed)
    from tsm_ds.data.splits import build_datasets
    try:  # a bad --data / list / label file is the user's to fix: a message, not a traceback
        split, flip = select_data(args, log)
        train_set, val_set = build_datasets(split, num_segments=args.num_segments, img_size=args.img_size,
                                            seed=args.seed, flip=flip)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        log.error("data: %s", e)
        return 2
    class_names, desc = split.class_names, split.description
    log.info("data: %s; %d train clips, %d val clips, %d classes", desc, len(train_set),
             len(val_set) if val_set is not None else 0, len(class_names))
    from tsm_ds.models import build_model
    model = build_model(args.arch, len(class_names), num_segments=args.num_segments,
                        shift=None if args.shift == "none" else args.shift, shift_div=args.shift_div,
                        shift_place=args.shift_place, temporal_pool=args.temporal_pool, dropout=args.dropout,
                        partial_bn=args.partial_bn, pretrained=args.pretrained)
    if args.tune_from:
        from tsm_ds.engine.checkpoint import load_finetune_weights
        try:
            # an official file whose name says nothing is read with this run's model options
            rep = load_finetune_weights(model, args.tune_from, official_overrides={
                "arch": args.arch, "num_segments": args.num_segments,
                "shift": None if args.shift == "none" else args.shift, "shift_div": args.shift_div,
                "shift_place": args.shift_place, "temporal_pool": args.temporal_pool, "dropout": args.dropout})
        except (FileNotFoundError, ValueError, RuntimeError) as e:
            log.error("--tune-from %s: %s", args.tune_from, e)
            return 2
        log.info("--tune-from %s (%s %s): %d tensors loaded, replaced (shape differs): %s", args.tune_from,
                 rep["source"], rep["path"], rep["loaded"], rep["skipped"] or "none")
    run_name = args.run_name or f"{args.arch}_T{args.num_segments}_{Path(cfg_path).stem}"
    flags = {k: getattr(args, k) for k in ("batch_size", "micro_batch_size", "grad_accum", "lr", "weight_decay",
                                           "clip_grad", "warmup_steps", "lr_steps")}
    record = dict(vars(args))
    record["deepspeed_config"] = cfg_path
    record["data_description"] = desc
    record["split"] = split.as_dict()  # what tsm-ds eval --checkpoint resolves again (tsm_ds.data.splits)
    record["no_flip"] = not flip
    settings = TrainSettings(run_dir=Path(args.output_dir) / run_name, epochs=args.epochs, max_steps=args.max_steps,
                             seed=args.seed, num_workers=args.num_workers, resume=args.resume,
                             save_every_steps=args.save_every_steps, keep_last=args.keep_last,
                             class_names=class_names, flags=flags, record=record,
                             progress=not args.no_progress,
                             guard=GuardSettings(factor=args.divergence_factor, max_skipped=args.max_skipped_steps),
                             on_divergence=args.on_divergence, rollback_lr_factor=args.rollback_lr_factor,
                             max_rollbacks=args.max_rollbacks, inject_nan_step=args.inject_nan_at_step,
                             inject_nan_rank=args.inject_nan_rank)
    trainer = Trainer(model, train_set, val_set, engine_json, settings)
    try:
        trainer.setup()
    except ConfigError as e:
        log.error("engine JSON %s: %s", cfg_path, e)
        return 2
    try:
        result = trainer.fit()
    except DivergenceError as e:   # decided alike on every rank: all exit 3
        if trainer.rank == 0:
            log.error("%s", e.describe())
        return 3
    except CheckpointSaveError as e:
        if trainer.rank == 0:
            log.error("%s", e)
        return 4
    except (CheckpointResumeError, FileNotFoundError) as e:   # --resume: a damaged or missing checkpoint
        if trainer.rank == 0:
            log.error("%s", e)
        return 2
    if trainer.rank == 0:
        val = result["val"]
        summary = {k: v for k, v in trainer.summary(result).items() if k != "history"}   # all of it: <run>/result.json
        print("RESULT " + json.dumps(summary), flush=True)
        if val:
            few = (f" (few clips: each one moves top-1 by {100 / max(1, val['count']):.0f} points; noisy)"
                   if val["count"] < 50 else "")
            print(f"val top-1 {val['top1']:.1f}% on {val['count']} validation clips{few}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
