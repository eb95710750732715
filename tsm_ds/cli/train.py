"""``tsm_ds.train``: train TSM with DeepSpeed; what the ``deepspeed`` launcher runs on every rank.

    deepspeed --num_gpus 2 tsm_ds/train.py --deepspeed_config cpu_fp32 \\
        --data ../shared/data/videos --arch resnet18 --img-size 112 --epochs 3
    deepspeed --num_gpus 2 --module tsm_ds.train ...            # the same, as a module
    deepspeed --hostfile launch/hostfile.example tsm_ds/train.py ...   # several machines

``tsm_ds/train.py`` is a shim that calls :func:`main` here. Defaults are the official TSM Kinetics
recipe (mit-han-lab/temporal-shift-module, opts.py and the paper, Sec. 4.1/Appendix): resnet50, 8
segments, shift_div 8, blockres, dropout 0.5, SGD momentum 0.9, lr 0.02 per 128 clips (linear
scaling), weight decay 1e-4, gradient clip 20, 50 epochs with x0.1 steps at epochs 20 and 40.
Run-dependent values of the engine JSON may be "auto" (see :mod:`tsm_ds.engine.config.resolve`); the
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

from tsm_ds.config import Config, parse
from tsm_ds.config.commands import TRAIN
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.utils.exits import (
    EXIT_CONFIG,
    EXIT_DATA_LOSS,
    EXIT_DIVERGED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_RENDEZVOUS,
    EXIT_SAVE_FAILED,
)

#: the fields ``tsm_ds.train`` uses: every section of a training run (:data:`tsm_ds.config.commands.TRAIN`)
COMMAND = TRAIN


def build_parser() -> argparse.ArgumentParser:
    """The command line, generated from the configuration tree (:data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


#: the model fields that decide which weights a network has: taken from the run ``--tune-from`` names
#: (its config.json) unless given on the command line
TUNE_FROM_FIELDS = ("arch", "shift", "shift_div", "shift_place", "temporal_pool")


def default_recipe() -> str:
    """The engine recipe without ``--deepspeed_config``: cpu_fp32 on DeepSpeed's CPU accelerator, else
    gpu_fp16 (:func:`tsm_ds.utils.node.default_recipe`, the launch scripts' ``CONFIG`` default too).
    The accelerator is ``DS_ACCELERATOR`` (set by :func:`main` before this is asked), else the
    torch-free CUDA check of :func:`tsm_ds.utils.node.accelerator`."""
    from tsm_ds.utils.node import accelerator
    from tsm_ds.utils.node import default_recipe as recipe_for

    return recipe_for(accelerator(os.environ))


def run_dir_of(cfg: Config, recipe_path: str | Path) -> Path:
    """OUTPUT_DIR/RUN_NAME; the default name is ``<arch>_T<segments>_<engine json name>``."""
    name = cfg.output.run_name or f"{cfg.model.arch}_T{cfg.model.num_segments}_{Path(recipe_path).stem}"
    return Path(cfg.output.output_dir) / name


def parse_config(argv: list[str] | None, environ: dict | None = None) -> tuple[Config, list[str]]:
    """The run's tree from argv: a recorded run's fields first, then the flags given (they win), then
    ``TSM_DS_*`` variables for fields neither gave.

    The recorded run: ``--config RUN/config.json``; else, with ``--resume``, the run being resumed
    (its ``config.json`` in OUTPUT_DIR/RUN_NAME, when there is one), so that a resume rebuilds the
    run's model and data without retyping them. ``--tune-from`` a run (its dir, checkpoints or
    exports, beside its ``config.json``) also takes that run's :data:`TUNE_FROM_FIELDS` unless given.

    Returns:
        (the tree, notes for the log: where recorded fields came from, fields of a recorded run that
        are options no more).

    Raises:
        SystemExit: bad options (argparse).
        FileNotFoundError, ConfigTreeError: an unreadable ``--config`` file (named).
    """
    from tsm_ds.config.record import load_run_config

    args = list(sys.argv[1:] if argv is None else argv)
    path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if path is None and "--config" in args[:-1]:
        path = args[args.index("--config") + 1]
    base, notes = None, []
    if path:
        base, _, notes = load_run_config(path)
    env = os.environ if environ is None else environ
    cfg, given = parse(COMMAND, Config, argv, base=base, env=env)
    if base is None and cfg.output.resume:
        from tsm_ds.engine.config.recipes import ConfigError, resolve_recipe
        try:
            record = run_dir_of(cfg, resolve_recipe(cfg.engine.deepspeed_config or default_recipe())) / "config.json"
        except ConfigError:   # the trainer names the bad recipe
            record = None
        if record is not None and record.is_file():
            base, _, notes = load_run_config(record)
            cfg, given = parse(COMMAND, Config, argv, base=base, env=env)
            notes.append(f"--resume: the run's fields from {record} (flags given override them)")
    if base is None and "data.data" not in given and cfg.data.data and cfg.data.data == env.get("TSM_DS_DATA"):
        notes.append(f"no --data given: using {cfg.data.data} ($TSM_DS_DATA)")
    if cfg.model.tune_from and base is None:
        from tsm_ds.inference.evaluate import find_run_config
        try:
            src = load_run_config(find_run_config(cfg.model.tune_from))[0].model
        except (FileNotFoundError, ValueError):   # an export elsewhere, an official file: nothing recorded
            src = None
        taken = [f"{k}={getattr(src, k)!r}" for k in TUNE_FROM_FIELDS if src is not None
                 and f"model.{k}" not in given and getattr(src, k) != getattr(cfg.model, k)]
        for item in taken:
            k = item.split("=", 1)[0]
            setattr(cfg.model, k, getattr(src, k))
        if taken:
            notes.append(f"--tune-from {cfg.model.tune_from}: the model of that run ({', '.join(taken)}; "
                         f"give the flags to change them)")
    return cfg, notes


def select_data(cfg: Config, log: logging.Logger) -> tuple:
    """(split, flip): the run's :class:`tsm_ds.data.splits.Split` and whether to flip training clips.

    The data fields (``--data`` / lists, else ``$TSM_DS_DATA`` through the parser), else
    ../shared/data/videos, else the generated demo dataset in OUTPUT_DIR/demo_data
    (:func:`tsm_ds.data.splits.demo_split`); each fallback is logged. ``--dataset NAME`` reads that
    dataset's own annotation files under ``--data`` (no fallback). The demo's classes are directions,
    and Something-Something's and Jester's say left and right (the official TSM code trains them
    without flip): flipping is turned off for them (logged). ``cfg`` is not changed.

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: see :func:`tsm_ds.data.splits.resolve_split`.
    """
    from tsm_ds.data import splits

    d = cfg.data
    data, split = d.data, None
    if data is None and not d.train_list and not d.dataset:
        data, origin = splits.default_data()
        if data is None:
            root = Path(cfg.output.output_dir) / "demo_data"
            log.info("no data given, TSM_DS_DATA unset and %s absent: using the generated demo dataset in %s",
                     splits.DEFAULT_SHARED, root)
            split = splits.demo_split(root, seed=cfg.schedule.seed, clips=d.demo_clips)
        else:
            log.info("no --data given: using %s (%s)", data, origin)
    if split is None:
        split = splits.resolve_split(data=data, train_list=d.train_list, val_list=d.val_list,
                                     classes=d.classes, val_fraction=d.val_fraction, dataset=d.dataset,
                                     dataset_split=d.dataset_split, frame_template=d.frame_template)
    flip = d.flip
    if not split.flip and flip:
        log.info("%s: its classes say left and right, so horizontal flip is turned off (as the official TSM "
                 "code trains it)", split.dataset)
        flip = False
    if split.demo:
        if flip:
            log.info("demo dataset: direction classes, so horizontal flip is turned off")
            flip = False
        if cfg.model.shift == "none":
            log.info("demo dataset: TSN (--shift none) cannot tell its classes apart; training anyway")
    return split, flip


def main(argv: list[str] | None = None) -> int:
    """Parse, build model + data + trainer, train.

    Returns 0 on success, 2 on a configuration or data error, 3 when the run diverged (the guard
    stopped it; nothing non-finite was saved), 4 when a checkpoint could not be written, 5 when
    not every rank joined within --dist-timeout, 7 when more files were unreadable than
    --max-bad-fraction allows (the message names the count, the fraction and the files), 75
    (EX_TEMPFAIL) when a stop signal made the run save and stop (resume with --resume auto); the
    hang watchdog exits 6 from its own thread
    (:mod:`tsm_ds.engine.guards.watchdog`). The statuses are the constants of :mod:`tsm_ds.utils.exits`.
    Every rank also logs to ``<run>/logs/rank<r>.log``.
    """
    from tsm_ds.engine.comm.dist import set_accelerator_env, set_threads

    thread_msg = set_threads()
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.WARNING, format=f"[rank{rank}] %(asctime)s %(levelname)s %(message)s",
                        stream=sys.stdout)
    log = logging.getLogger("tsm_ds.train")
    log.setLevel(logging.INFO)   # every rank's file gets INFO (add_rank_log_file); the console: rank 0's
    if rank != 0:
        for h in logging.getLogger().handlers:
            h.setLevel(logging.WARNING)
    from tsm_ds.config import ConfigTreeError
    try:
        cfg, notes = parse_config(argv)
    except (FileNotFoundError, ConfigTreeError, ValueError) as e:
        log.error("%s", e)
        return EXIT_CONFIG
    for note in notes:
        (log.warning if "option any more" in note else log.info)("%s", note)   # a removed option: WARNING
    from tsm_ds.engine.config.recipes import ConfigError, load_config, recipe_needs_cuda, resolve_recipe
    from tsm_ds.utils.node import AcceleratorError, ops_cache_dir
    # DeepSpeed's op cache: node-local, the same for every command (tsm_ds.utils.node.ops_cache_dir)
    os.environ["TORCH_EXTENSIONS_DIR"] = ops_cache_dir(os.environ)
    try:   # the accelerator, decided on this rank's node before deepspeed is imported: never a silent CPU
        needs, name = None, "the default recipe"
        if cfg.engine.deepspeed_config:
            path = resolve_recipe(cfg.engine.deepspeed_config)
            needs, name = recipe_needs_cuda(load_config(path), path), f"recipe {Path(path).name}"
        acc_msg = set_accelerator_env(device=cfg.distributed.device, needs_cuda=needs, recipe=name)
    except (ConfigError, AcceleratorError) as e:
        log.error("%s", e)
        return EXIT_CONFIG
    if acc_msg:
        (log.warning if "on purpose" in acc_msg or "meant for CUDA" in acc_msg else log.info)("%s", acc_msg)
    log.info(thread_msg)
    return train(cfg, log=log, rank=rank)


class ConfigStop(Exception):
    """A configuration or data error already phrased for the user: exit 2, logged on every rank."""


def exit_table() -> list[tuple]:
    """The one table from an exception of :func:`train` to its exit status: ``(exception types,
    status, logged on rank 0 only, log level, message of the exception)``, first match wins; an
    exception not in it is a bug and propagates (a traceback, status 1)."""
    from tsm_ds.data.bad_videos import DataLossError
    from tsm_ds.engine.checkpoint.manager import CheckpointResumeError, CheckpointSaveError
    from tsm_ds.engine.checkpoint.safe_load import UntrustedCheckpointError
    from tsm_ds.engine.comm.rendezvous import RendezvousError
    from tsm_ds.engine.guards.divergence import DivergenceError
    from tsm_ds.engine.guards.preempt import Preempted

    return [
        (ConfigStop, EXIT_CONFIG, False, logging.ERROR, str),
        (RendezvousError, EXIT_RENDEZVOUS, False, logging.ERROR, str),   # each rank: its own view
        (DivergenceError, EXIT_DIVERGED, True, logging.ERROR, lambda e: e.describe()),   # alike on every rank
        (DataLossError, EXIT_DATA_LOSS, True, logging.ERROR, lambda e: e.describe()),    # files exchanged first
        (CheckpointSaveError, EXIT_SAVE_FAILED, True, logging.ERROR, str),
        (Preempted, EXIT_PREEMPTED, True, logging.WARNING, str),
        # --resume: a damaged, missing or foreign (asks to unpickle code) checkpoint
        ((CheckpointResumeError, UntrustedCheckpointError, FileNotFoundError), EXIT_CONFIG, True, logging.ERROR, str),
    ]


def train(cfg: Config, *, log: logging.Logger, rank: int) -> int:
    """Build the components from their sections of ``cfg`` and train: comm op -> recipe ->
    data -> model -> trainer -> fit, each phase in its own function; every failure becomes an exit
    status through :func:`exit_table` (see :func:`main` for the statuses)."""
    try:
        _check_comm_op(log)
        cfg_path, engine_json = _recipe(cfg, log)
        split, flip, train_set, val_set = _data(cfg, log)
        model = _model(cfg, engine_json, log, num_classes=len(split.class_names))
        trainer, run_dir = _trainer(cfg, log, rank, model, train_set, val_set, engine_json, cfg_path, split, flip)
        import torch.distributed as dist
        rank = dist.get_rank() if dist.is_initialized() else rank   # (an MPI launch sets no $RANK)
        result = trainer.fit()
    except Exception as e:
        for types, status, rank0_only, level, message in exit_table():
            if isinstance(e, types):
                if rank == 0 or not rank0_only:
                    log.log(level, "%s", message(e))
                return status
        raise
    if rank == 0:
        _report(result, run_dir, cfg.data.max_bad_fraction)
    return EXIT_OK


def _check_comm_op(log: logging.Logger) -> None:
    """Say when DeepSpeed's CPU comm op is about to be built (not built ahead by set-up). No process
    setting is flipped here: the readers' caches are the datasets' options, applied in the process
    that reads (:mod:`tsm_ds.data.options`); the fused shift is the model's (:func:`tsm_ds.models.use_fused_shift`)."""
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        ops = Path(os.environ["TORCH_EXTENSIONS_DIR"])
        if not (ops / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").exists():
            log.warning("DeepSpeed builds its CPU comm op into %s now (~40 s, once per machine; launch/setup.sh "
                        "builds it ahead)", ops)


def _recipe(cfg: Config, log: logging.Logger) -> tuple[str, dict]:
    """(the engine JSON's path, the recipe as read). Raises ConfigStop."""
    from tsm_ds.engine.config.recipes import ConfigError, load_config, resolve_recipe

    try:
        cfg_path = str(resolve_recipe(cfg.engine.deepspeed_config or default_recipe()))
        log.info("engine JSON: %s%s", cfg_path,
                 "" if cfg.engine.deepspeed_config else " (no --deepspeed_config: default)")
        return cfg_path, load_config(cfg_path)
    except ConfigError as e:
        raise ConfigStop(str(e)) from None


def _data(cfg: Config, log: logging.Logger) -> tuple:
    """(split, flip, train set, val set), the decoded-frame cache attached when asked. Raises
    ConfigStop: a bad --data / list / label file is the user's to fix, a message, not a traceback."""
    import torch

    from tsm_ds.data.options import ReaderOptions
    from tsm_ds.data.splits import build_datasets

    d, m, sch = cfg.data, cfg.model, cfg.schedule
    torch.manual_seed(sch.seed)
    try:
        split, flip = select_data(cfg, log)
        if d.decode_device and d.cache_decoded:
            raise ValueError("--decode-device and --cache-decoded exclude each other: the cache holds "
                             "decoded frames; choose one")
        train_set, val_set = build_datasets(split, num_segments=m.num_segments, img_size=d.img_size,
                                            seed=sch.seed, flip=flip, decode_device=d.decode_device,
                                            reader_options=ReaderOptions.from_config(d))
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        raise ConfigStop(f"data: {e}") from None
    log.info("data: %s; %d train clips, %d val clips, %d classes", split.description, len(train_set),
             len(val_set) if val_set is not None else 0, len(split.class_names))
    if d.cache_decoded:   # decoded here, once: forked DataLoader workers share the frames
        if not d.cache_decoded_max_mb > 0:
            raise ConfigStop(f"--cache-decoded-max-mb {d.cache_decoded_max_mb}: give a size limit > 0 (MiB)")
        from tsm_ds.data.clip_cache import attach_frame_cache
        _, cache_stats = attach_frame_cache([train_set, val_set], max_mb=d.cache_decoded_max_mb)
        log.info("--cache-decoded: %(videos)d videos, %(mb).0f of %(max_mb).0f MiB, decoded in %(seconds).1f s "
                 "(%(skipped)d over the limit, %(unreadable)d unreadable)", cache_stats)
    return split, flip, train_set, val_set


def _model(cfg: Config, engine_json: dict, log: logging.Logger, *, num_classes: int):
    """The recognizer: built, ``--tune-from`` weights loaded, the large-batch options applied.
    Raises ConfigStop."""
    from tsm_ds.models import build_model, use_fused_shift

    m = cfg.model
    model = build_model(m.arch, num_classes, pretrained=m.pretrained, **m.build_options())
    use_fused_shift(model, m.fused_shift)   # --no-fused-shift: the reference shift, on this model
    if m.tune_from:
        from tsm_ds.engine.checkpoint.manager import load_finetune_weights
        try:
            # an official file whose name says nothing is read with this run's model options
            opts = {k: v for k, v in m.build_options().items() if k != "partial_bn"}
            rep = load_finetune_weights(model, m.tune_from, official_overrides={"arch": m.arch, **opts},
                                        trust=cfg.checkpoint.trust_checkpoint)
        except (FileNotFoundError, ValueError, RuntimeError) as e:
            raise ConfigStop(f"--tune-from {m.tune_from}: {e}") from None
        log.info("--tune-from %s (%s %s): %d tensors loaded, replaced (shape differs): %s", m.tune_from,
                 rep["source"], rep["path"], rep["loaded"], rep["skipped"] or "none")
    try:
        notes = prepare_large_batch_model(model, m, engine_json)
    except ValueError as e:
        raise ConfigStop(str(e)) from None
    for note in notes:
        log.info("%s", note)
    return model


def train_settings(cfg: Config, *, run_dir: Path, class_names: list, record: dict):
    """The trainer's :class:`~tsm_ds.engine.loop.settings.TrainSettings`: the run's folder and tree.
    Raises ValueError: a threshold out of range (the message names the flag)."""
    from tsm_ds.engine.loop.trainer import TrainSettings

    return TrainSettings(run_dir=run_dir, config=cfg, class_names=class_names, record=record)


def _trainer(cfg: Config, log: logging.Logger, rank: int, model, train_set, val_set, engine_json: dict,
             cfg_path: str, split, flip: bool) -> tuple:
    """(the set-up :class:`~tsm_ds.engine.loop.trainer.Trainer`, the run folder). Raises ConfigStop (a
    setting out of range, a recipe that cannot work here) or RendezvousError."""
    from tsm_ds.config.record import run_record
    from tsm_ds.engine.config.recipes import ConfigError
    from tsm_ds.engine.loop.trainer import Trainer

    run_dir = run_dir_of(cfg, cfg_path)
    log.info("this rank's log: %s (every rank writes one)", add_rank_log_file(run_dir, rank))
    # config.json: the tree + what the trainer resolves (tsm_ds.config.record; eval re-resolves the split)
    record = run_record(cfg, deepspeed_config=cfg_path, data_description=split.description, split=split.as_dict(),
                        flip=flip)
    try:
        settings = train_settings(cfg, run_dir=run_dir, class_names=split.class_names, record=record)
    except ValueError as e:
        raise ConfigStop(str(e)) from None
    trainer = Trainer(model, train_set, val_set, engine_json, settings)
    try:
        trainer.setup()
    except ConfigError as e:
        raise ConfigStop(f"engine JSON {cfg_path}: {e}") from None
    return trainer, run_dir


def _report(result: dict, run_dir: Path, max_bad_fraction: float) -> None:
    """Rank 0's last lines: ``RESULT {json}``, val top-1, and what data was lost."""
    from tsm_ds.data.bad_videos import describe_loss
    from tsm_ds.engine.loop.result import run_summary

    val = result["val"]
    summary = {k: v for k, v in run_summary(result, run_dir, result["last_metrics"]).items()
               if k != "history"}   # all of it: <run>/result.json
    print("RESULT " + json.dumps(summary), flush=True)
    if val:
        few = (f" (few clips: each one moves top-1 by {100 / max(1, val['count']):.0f} points; noisy)"
               if val["count"] < 50 else "")
        print(f"val top-1 {val['top1']:.1f}% on {val['count']} validation clips{few}", flush=True)
    lost = result.get("data_lost") or {}
    print("data lost: " + (" | ".join(describe_loss(k, r) for k, r in lost.items() if r["count"]) or "none")
          + f" (--max-bad-fraction {max_bad_fraction:g}; result.json names every file)", flush=True)


def prepare_large_batch_model(model, m, engine_json: dict) -> list[str]:
    """Zero-gamma init and ghost BatchNorm (:mod:`tsm_ds.models.large_batch`) as the model section
    and the recipe say; returns lines for the log.

    Zero gamma: ``--zero-init-residual on``, or ``auto`` with the recipe's
    ``tsm_ds.zero_init_residual`` true; never over pretrained or ``--tune-from`` weights (they are
    trained already: the log says it was skipped). Ghost BatchNorm: ``--ghost-bn-clips G``.

    Raises:
        ValueError: a bad ``--ghost-bn-clips`` or recipe value (the message names it).
    """
    from tsm_ds.models.large_batch import use_ghost_bn, zero_init_residual

    notes = []
    want = engine_json.get("tsm_ds", {}).get("zero_init_residual", False)
    if not isinstance(want, bool):
        raise ValueError(f"engine JSON tsm_ds.zero_init_residual = {want!r}: give true or false")
    zero = m.zero_init_residual == "on" or (m.zero_init_residual == "auto" and want)
    if zero and (m.pretrained or m.tune_from):
        notes.append("zero-init of the residual blocks' last BatchNorm skipped: the weights are pretrained "
                     "(--pretrained / --tune-from)")
    elif zero:
        n = zero_init_residual(model)
        notes.append(f"zero-init residual: the last BatchNorm gamma of {n} residual blocks set to 0 (each block "
                     f"starts as the identity; Goyal et al. 2017){'' if m.zero_init_residual == 'on' else ' (recipe)'}")
    if m.ghost_bn_clips is not None:
        n = use_ghost_bn(model, int(m.ghost_bn_clips))
        notes.append(f"ghost BatchNorm: {n} BatchNorm layers take their statistics over groups of "
                     f"{m.ghost_bn_clips} clips of each micro-batch")
    return notes


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
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
