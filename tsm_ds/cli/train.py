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
    d.add_argument("--cache-decoded", action="store_true",
                   help="decode every video once before training and keep its frames in memory (frame sampling, "
                        "crops and flips are still drawn per epoch); for small datasets, see tsm_ds.data.clip_cache")
    d.add_argument("--cache-decoded-max-mb", type=float, default=4096.0,
                   help="size limit of --cache-decoded per rank (MiB of decoded frames); videos beyond it are "
                        "decoded per clip")
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
    from tsm_ds.cli._common import add_training_args, add_trust_arg
    add_trust_arg(m)       # --trust-checkpoint: for --tune-from and --resume
    add_training_args(p)   # --epochs ... --lr-steps, shared with tsm-ds config
    o = p.add_argument_group("output")
    o.add_argument("--output-dir", default="runs", help="runs are written to OUTPUT_DIR/RUN_NAME")
    o.add_argument("--run-name", help="default: <arch>_T<segments>_<engine json name>")
    o.add_argument("--resume", help="'auto': continue from the latest complete checkpoint of the run dir "
                   "(fresh start when there is none); or a checkpoint tag. Another number of ranks than the "
                   "checkpoint's keeps its global batch by accumulation (README: resuming on another world size)")
    o.add_argument("--save-every-steps", type=int, default=0, help="also save every N optimizer steps")
    o.add_argument("--keep-last", type=int, default=2, help="complete checkpoints kept besides the best")
    o.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    m.add_argument("--no-fused-shift", action="store_true",
                   help="use the out-of-place reference shift instead of the fused in-place one "
                        "(the same as TSM_DS_FUSED_SHIFT=0)")
    m.add_argument("--channels-last", action="store_true",
                   help="feed the clips channels-last per frame (the convolutions then run channels-last; parameters "
                        "stay as they are); see README for the measured speed")
    m.add_argument("--compile", action="store_true",
                   help="torch.compile the model through DeepSpeed's engine.compile() (inductor; on CPU it needs a C++ "
                        "compiler; the first training and evaluation batches include minutes of compiling)")
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
    g.add_argument("--inject-signal-at-step", type=int, default=None, help=argparse.SUPPRESS)  # test hook:
    g.add_argument("--inject-signal-rank", type=int, default=0, help=argparse.SUPPRESS)  # that rank signals itself
    c = p.add_argument_group("cluster (fail fast, time limits)")
    c.add_argument("--dist-timeout", type=float, default=None,
                   help="seconds for every rank to join (else every rank stops, naming the missing ranks and hosts; "
                        "exit 5) and for every collective (a dead or hung peer); default $TSM_DS_DIST_TIMEOUT, else 300")
    c.add_argument("--stop-signal", default="SIGUSR1",
                   help="on this signal, save a checkpoint at the next optimizer step and exit 75 (SLURM "
                        "--signal=USR1@120; launch/slurm_train.sbatch requeues and resumes); 'none' to disable")
    w = p.add_argument_group("hang watchdog (no progress: every rank writes its Python stacks to RUN/stacks/ and exits 6)")
    w.add_argument("--step-timeout", type=float, default=1800.0,
                   help="seconds without progress (an optimizer step, an eval batch, a checkpoint write) before the "
                        "watchdog stops the run (0: off)")
    w.add_argument("--startup-timeout", type=float, default=3600.0,
                   help="seconds from set-up (op builds, deepspeed.initialize, resume) to the end of the first optimizer "
                        "step (0: off)")
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
    stopped it; nothing non-finite was saved), 4 when a checkpoint could not be written, 5 when
    not every rank joined within --dist-timeout, 75 (EX_TEMPFAIL) when a stop signal made the run
    save and stop (resume with --resume auto); the hang watchdog exits 6 from its own thread
    (:mod:`tsm_ds.engine.watchdog`). Every rank also logs to ``<run>/logs/rank<r>.log``.
    """
    from tsm_ds.engine.dist import set_accelerator_env, set_threads

    acc_msg = set_accelerator_env()
    thread_msg = set_threads()
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(asctime)s %(levelname)s %(message)s",
                        stream=sys.stdout)
    log = logging.getLogger("tsm_ds.train")
    log.setLevel(logging.INFO)   # every rank's file gets INFO (add_rank_log_file); the console: rank 0's
    if rank != 0:
        for h in logging.getLogger().handlers:
            h.setLevel(logging.WARNING)
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
    from tsm_ds.engine.safe_load import UntrustedCheckpointError
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
    if args.cache_decoded:   # decoded here, once: forked DataLoader workers share the frames
        if not args.cache_decoded_max_mb > 0:
            log.error("--cache-decoded-max-mb %s: give a size limit > 0 (MiB)", args.cache_decoded_max_mb)
            return 2
        from tsm_ds.data.clip_cache import attach_frame_cache
        _, cache_stats = attach_frame_cache([train_set, val_set], max_mb=args.cache_decoded_max_mb)
        log.info("--cache-decoded: %(videos)d videos, %(mb).0f of %(max_mb).0f MiB, decoded in %(seconds).1f s "
                 "(%(skipped)d over the limit, %(unreadable)d unreadable)", cache_stats)
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
                "shift_place": args.shift_place, "temporal_pool": args.temporal_pool, "dropout": args.dropout},
                trust=args.trust_checkpoint)
        except (FileNotFoundError, ValueError, RuntimeError) as e:
            log.error("--tune-from %s: %s", args.tune_from, e)
            return 2
        log.info("--tune-from %s (%s %s): %d tensors loaded, replaced (shape differs): %s", args.tune_from,
                 rep["source"], rep["path"], rep["loaded"], rep["skipped"] or "none")
    run_name = args.run_name or f"{args.arch}_T{args.num_segments}_{Path(cfg_path).stem}"
    log_path = add_rank_log_file(Path(args.output_dir) / run_name, rank)
    log.info("this rank's log: %s (every rank writes one)", log_path)
    from tsm_ds.cli._common import engine_flags
    flags = engine_flags(args)   # the engine-JSON flags (config.FLAG_KEYS)
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
                             inject_nan_rank=args.inject_nan_rank, dist_timeout=args.dist_timeout,
                             stop_signals=() if args.stop_signal.lower() == "none" else (args.stop_signal.upper(),),
                             step_timeout=args.step_timeout, startup_timeout=args.startup_timeout,
                             channels_last=args.channels_last, compile=args.compile,
                             trust_checkpoint=args.trust_checkpoint)
    if args.inject_signal_at_step is not None and settings.stop_signals:   # test hook (see the flag)
        import signal as _signal

        def _signal_self(tr, step, _at=args.inject_signal_at_step, _rank=args.inject_signal_rank):
            if step == _at and tr.rank == _rank:
                os.kill(os.getpid(), getattr(_signal, settings.stop_signals[0]))
        settings.step_callback = _signal_self
    trainer = Trainer(model, train_set, val_set, engine_json, settings)
    from tsm_ds.engine.preempt import EXIT_PREEMPTED, Preempted
    from tsm_ds.engine.rendezvous import RendezvousError
    try:
        trainer.setup()
    except ConfigError as e:
        log.error("engine JSON %s: %s", cfg_path, e)
        return 2
    except RendezvousError as e:   # every rank: its own view (rank 0 names the missing ranks)
        log.error("%s", e)
        return 5
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
    except Preempted as e:
        if trainer.rank == 0:
            log.warning("%s", e)
        return EXIT_PREEMPTED
    except (CheckpointResumeError, UntrustedCheckpointError, FileNotFoundError) as e:   # --resume: a damaged,
        # missing or foreign (asks to unpickle code) checkpoint
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



def add_rank_log_file(run_dir: Path, rank: int) -> Path:
    """Also write this rank's log (ours, DeepSpeed's, Python warnings; INFO and up) to
    ``<run_dir>/logs/rank<rank>.log``, appended across restarts; the console keeps rank 0's INFO
    and the other ranks' warnings. The first line of each start names the host and PID.

    Returns the file's path.
    """
    import socket

    path = Path(run_dir) / "logs" / f"rank{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "tsm_ds_rank_log", False)]:   # a second main() in-process
        root.removeHandler(h)
        logging.getLogger("DeepSpeed").removeHandler(h)
        h.close()
    handler = logging.FileHandler(path)
    handler.tsm_ds_rank_log = True
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(f"[rank{rank}] %(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)   # ours and Python warnings propagate to the root
    ds_logger = logging.getLogger("DeepSpeed")
    if not ds_logger.propagate:
        ds_logger.addHandler(handler)
    logging.captureWarnings(True)
    handler.stream.write(f"[rank{rank}] start: host {socket.gethostname()} pid {os.getpid()} "
                         f"world size {os.environ.get('WORLD_SIZE', '1')}\n")
    handler.flush()
    return path


if __name__ == "__main__":
    sys.exit(main())
