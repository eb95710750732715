"""Train TSM with DeepSpeed; the script the ``deepspeed`` launcher runs on every rank.

    deepspeed --num_gpus 2 tsm_ds/train.py --deepspeed_config ds_configs/cpu_fp32.json \\
        --data ../shared/data/videos --arch resnet18 --img-size 112 --epochs 3
    deepspeed --num_gpus 2 --module tsm_ds.train ...            # the same, as a module
    deepspeed --hostfile launch/hostfile.example tsm_ds/train.py ...   # several machines

Defaults are the official TSM Kinetics recipe (mit-han-lab/temporal-shift-module, opts.py and
the paper, Sec. 4.1/Appendix): resnet50, 8 segments, shift_div 8, blockres, dropout 0.5, SGD
momentum 0.9, lr 0.02 per 128 clips (linear scaling), weight decay 1e-4, gradient clip 20, 50 epochs
with x0.1 steps at epochs 20 and 40. Run-dependent values of the engine JSON may be "auto"
(see ``tsm_ds.engine.config``); the resolved configuration (flags + engine JSON) is written to
``<output dir>/config.json``.

Data: ``--data DIR`` is a class-per-folder tree (``DIR/train`` + ``DIR/val`` when present, else a
per-class hold-out of ``--val-fraction``); the project's real clips (a ``videos`` folder next to a
``manifest.csv``) are split by ``source_group`` (per class, the last group is validation);
``--train-list/--val-list`` read ``path label`` list files (relative to ``--data`` when given).
Without any of these, ``../shared/data/videos`` (or ``$TSM_DS_DATA``) is used when present, else
the generated demo dataset (``tsm_ds.data.synthetic``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SHARED = REPO.parent / "shared" / "data" / "videos"


def _set_accelerator_env() -> str | None:
    """DS_ACCELERATOR=cpu when CUDA is absent and the variable is unset (before deepspeed is imported)."""
    if "DS_ACCELERATOR" in os.environ:
        return None
    import torch
    if torch.cuda.is_available():
        return None
    os.environ["DS_ACCELERATOR"] = "cpu"
    return "no CUDA device: set DS_ACCELERATOR=cpu (DeepSpeed's CPU accelerator, gloo)"


def _set_threads() -> str:
    """Give each local rank its own cores: torch threads = usable cores / local ranks.

    Skipped when OMP_NUM_THREADS is set (``--bind_cores_to_rank`` sets it) or when the launcher
    reports no local world size. 2 unpinned ranks on 2 cores ran ~10x slower (ds_cpu_notes.md).
    """
    import torch
    if "OMP_NUM_THREADS" in os.environ:
        return f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} given: torch threads {torch.get_num_threads()}"
    local = int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = max(1, cores // max(1, local))
    torch.set_num_threads(n)
    return f"{cores} cores / {local} local ranks: torch threads {n} (set OMP_NUM_THREADS to override)"


def build_parser() -> argparse.ArgumentParser:
    """The command line (DeepSpeed's --deepspeed / --deepspeed_config added)."""
    p = argparse.ArgumentParser(prog="tsm_ds.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                   help="set by the deepspeed launcher")
    d = p.add_argument_group("data")
    d.add_argument("--data", help="class-per-folder video tree (or the root the list files are relative to)")
    d.add_argument("--train-list", help="list file of training clips: 'path label' per line")
    d.add_argument("--val-list", help="list file of validation clips")
    d.add_argument("--classes", help="class names, one per line (line = label) for list files")
    d.add_argument("--val-fraction", type=float, default=0.2,
                   help="per-class hold-out for --data trees without train/ val/ folders")
    d.add_argument("--img-size", type=int, default=224, help="crop side in pixels")
    d.add_argument("--no-flip", action="store_true", help="no horizontal flip (direction-sensitive classes)")
    d.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes per rank")
    d.add_argument("--demo-clips", type=int, default=48,
                   help="training clips per class of the generated demo dataset (used only without data)")
    m = p.add_argument_group("model")
    m.add_argument("--arch", default="resnet50", help="resnet18/34/50/101, mobilenet_v2, i3d_resnet50")
    m.add_argument("--num-segments", type=int, default=8, help="T, frames per clip")
    m.add_argument("--shift", default="bidirectional", choices=["bidirectional", "online", "none"],
                   help="temporal shift (none = TSN)")
    m.add_argument("--shift-div", type=int, default=8)
    m.add_argument("--shift-place", default="blockres", choices=["blockres", "block"])
    m.add_argument("--temporal-pool", action="store_true")
    m.add_argument("--dropout", type=float, default=0.5)
    m.add_argument("--partial-bn", action="store_true")
    m.add_argument("--pretrained", help="torchvision ImageNet state dict file for the backbone")
    m.add_argument("--tune-from", help="our export / checkpoint tag dir, or an official TSM .pth; the head "
                   "is replaced when the class count differs")
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
    import deepspeed
    deepspeed.add_config_arguments(p)
    return p


def _find_manifest_root(data: Path) -> Path | None:
    for cand in (data, data.parent):
        if (cand / "manifest.csv").is_file():
            return cand
    return None


def build_datasets(args, log) -> tuple:
    """(train_set, val_set, class_names, description) from the data flags.

    Raises:
        SystemExit: no data given and neither ../shared nor the demo generator is available.
        FileNotFoundError: a given path does not exist.
    """
    from tsm_ds.data import records
    from tsm_ds.data.dataset import VideoClipDataset
    data = Path(args.data) if args.data else None
    if data is None and not args.train_list:
        env = os.environ.get("TSM_DS_DATA")
        if env:
            data = Path(env)
        elif DEFAULT_SHARED.is_dir():
            data = DEFAULT_SHARED
        else:
            try:
                from tsm_ds.data.synthetic import make_demo_dataset
            except ImportError:
                raise SystemExit(
                    f"no training data: pass --data DIR (one folder per class of video files) or "
                    f"--train-list/--val-list, or set TSM_DS_DATA; the project's real clips are expected "
                    f"at {DEFAULT_SHARED}, which does not exist on this machine")
            root = Path(args.output_dir) / "demo_data"
            log.info("no data given and %s absent: generating the demo dataset in %s", DEFAULT_SHARED, root)
            info = make_demo_dataset(root, seed=args.seed, train_per_class=args.demo_clips,
                                     val_per_class=max(2, args.demo_clips // 4))
            args.train_list, args.val_list = info["train_list"], info["val_list"]
            args.classes_list = list(info["classes"])
            if not args.no_flip:
                log.info("demo dataset: direction classes, so horizontal flip is turned off")
                args.no_flip = True
            if args.shift == "none":
                log.info("demo dataset: TSN (--shift none) cannot tell its classes apart; training anyway")
    if data is not None and not data.exists():
        raise FileNotFoundError(f"--data {data}: no such directory")
    if args.train_list:
        tr = records.read_video_list(args.train_list, root=str(data) if data else None)
        va = records.read_video_list(args.val_list, root=str(data) if data else None) if args.val_list else []
        names = getattr(args, "classes_list", None)
        if names is None and args.classes:
            names = [ln.strip() for ln in Path(args.classes).read_text().splitlines() if ln.strip()]
        if names is None:
            n = 1 + max(r.label for r in list(tr) + list(va))
            names = [f"class_{i}" for i in range(n)]
        desc = f"list files {args.train_list} / {args.val_list}"
    elif _find_manifest_root(data) is not None and data.name == "videos":
        tr, va, names = records.split_by_source_group(_find_manifest_root(data))
        desc = f"{data}: split by source_group (manifest.csv; per class the last group is validation)"
    elif (data / "train").is_dir() and (data / "val").is_dir():
        tr, names = records.read_class_folders(data / "train")
        va, vnames = records.read_class_folders(data / "val")
        if list(vnames) != list(names):
            raise ValueError(f"{data}/train and {data}/val have different class folders: {names} vs {vnames}")
        desc = f"{data}/train and {data}/val"
    else:
        allr, names = records.read_class_folders(data)
        tr, va = [], []
        for c in range(len(names)):
            rs = sorted((r for r in allr if r.label == c), key=lambda r: r.path)
            k = int(round(len(rs) * args.val_fraction)) if len(rs) > 1 else 0
            tr += rs[: len(rs) - k]
            va += rs[len(rs) - k:]
        desc = f"{data}: per-class hold-out of the last {args.val_fraction:.0%} by file name"
    common = dict(num_segments=args.num_segments, img_size=args.img_size, seed=args.seed)
    train_set = VideoClipDataset(list(tr), mode="train", flip=not args.no_flip, **common)
    val_set = VideoClipDataset(list(va), mode="val", **common) if len(va) else None
    return train_set, val_set, list(names), desc


def main(argv: list[str] | None = None) -> int:
    """Parse, build model + data + trainer, train. Returns 0 on success, 2 on a configuration error."""
    acc_msg = _set_accelerator_env()
    thread_msg = _set_threads()
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(asctime)s %(levelname)s %(message)s",
                        stream=sys.stdout)
    log = logging.getLogger("tsm_ds.train")
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if acc_msg:
        log.info(acc_msg)
    log.info(thread_msg)

    import torch
    from tsm_ds.engine.config import ConfigError, load_config
    from tsm_ds.engine.trainer import Trainer, TrainSettings
    cfg_path = args.deepspeed_config or str(REPO / "ds_configs" / (
        "cpu_fp32.json" if os.environ.get("DS_ACCELERATOR") == "cpu" else "gpu_fp16.json"))
    if not args.deepspeed_config:
        log.info("no --deepspeed_config: using %s", cfg_path)
    try:
        engine_json = load_config(cfg_path)
    except ConfigError as e:
        log.error("%s", e)
        return 2

    torch.manual_seed(args.seed)
    try:  # a bad --data / list / label file is the user's to fix: a message, not a traceback
        train_set, val_set, class_names, desc = build_datasets(args, log)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        log.error("data: %s", e)
        return 2
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
            rep = load_finetune_weights(model, args.tune_from)
        except (FileNotFoundError, ValueError, RuntimeError) as e:
            log.error("--tune-from %s: %s", args.tune_from, e)
            return 2
        log.info("--tune-from %s (%s): %d tensors loaded, replaced (shape differs): %s", args.tune_from,
                 rep["source"], rep["loaded"], rep["skipped"] or "none")
    run_name = args.run_name or f"{args.arch}_T{args.num_segments}_{Path(cfg_path).stem}"
    flags = {k: getattr(args, k) for k in ("batch_size", "micro_batch_size", "grad_accum", "lr", "weight_decay",
                                           "clip_grad", "warmup_steps", "lr_steps")}
    record = {k: v for k, v in vars(args).items() if k != "classes_list"}
    record["deepspeed_config"] = cfg_path
    record["data_description"] = desc
    settings = TrainSettings(run_dir=Path(args.output_dir) / run_name, epochs=args.epochs, max_steps=args.max_steps,
                             seed=args.seed, num_workers=args.num_workers, resume=args.resume,
                             save_every_steps=args.save_every_steps, keep_last=args.keep_last,
                             class_names=class_names, flags=flags, record=record,
                             progress=not args.no_progress)
    trainer = Trainer(model, train_set, val_set, engine_json, settings)
    try:
        trainer.setup()
    except ConfigError as e:
        log.error("engine JSON %s: %s", cfg_path, e)
        return 2
    result = trainer.fit()
    if trainer.rank == 0:
        val = result["val"]
        m = getattr(trainer, "last_metrics", {})
        summary = {"run_dir": str(settings.run_dir), "steps": result["step"],
                   "val_top1": val.get("top1"), "val_top5": val.get("top5"), "val_clips": val.get("count"),
                   "best_val_top1": result["best_top1"], "last_clips_per_s": m.get("perf/clips_per_s")}
        print("RESULT " + json.dumps(summary), flush=True)
        if val:
            few = (f" (few clips: each one moves top-1 by {100 / max(1, val['count']):.0f} points; noisy)"
                   if val["count"] < 50 else "")
            print(f"val top-1 {val['top1']:.1f}% on {val['count']} validation clips{few}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
