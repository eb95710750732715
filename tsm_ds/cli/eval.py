"""``tsm-ds eval``: multi-view evaluation of a checkpoint, on one process or many.

One process::

    tsm-ds eval --checkpoint runs/x/best_model.pt --data ../shared/data --split val \\
        --num-clips 10 --num-crops 3 --full-res --out results/x
    tsm-ds eval --checkpoint runs/x/best_model.pt --out results/x   # the run's own validation clips

Data: ``--data DIR`` is resolved exactly as training resolves it (:func:`tsm_ds.data.splits.resolve_split`:
a folder holding manifest.csv or its videos/, class folders under train/ + val/, or a class-folder tree
with a per-class hold-out of ``--val-fraction``); ``--split train|val|all`` picks the side (default: val
when the data carries its own split, all for a plain class-folder tree). ``--list FILE [--root DIR]``
reads a video list. ``--dataset NAME --data ROOT [--dataset-split N]`` reads a distributed dataset's own
annotation files (:mod:`tsm_ds.data.datasets`): its validation ids are scored, minus the listed videos
missing on disk, which are named. Without either, the run's ``config.json`` next to the checkpoint (RUN/best_model.pt,
RUN/last_model.pt, RUN, RUN/checkpoints/<tag>) names the data, and its validation side is evaluated.

Several processes (each video is scored once, by one rank; DistributedSampler padding is dropped by
:func:`tsm_ds.engine.loop.evaluate.gather_predictions`)::

    deepspeed --num_gpus 2 --module tsm_ds.cli.eval --checkpoint ... --data ... --out ...
    torchrun --nproc_per_node 2 -m tsm_ds.cli.eval ...          # works the same

Checkpoints (:func:`tsm_ds.inference.loading.load_for_inference`): the trainer's exported plain state dict
(``{"state_dict", "model_config", "class_names"}``), a DeepSpeed run/checkpoint directory, or an
official TSM checkpoint file (``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth``;
class names from ``--labels``, e.g. ``kinetics400_labels.txt``).

Views are averaged as logits by default (as the official ``test_models.py``; see
:mod:`tsm_ds.inference.views`); ``--average prob`` averages softmax probabilities.
Results (rank 0 writes them): see :mod:`tsm_ds.inference.eval_report`.
"""
from __future__ import annotations

import argparse
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.commands import EVAL
from tsm_ds.config.fields import build_parser as build_parser_for

#: the fields this command uses
COMMAND = EVAL


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds eval`` argument parser (generated: :data:`tsm_ds.config.commands.EVAL`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str]) -> int:
    """``tsm-ds eval``; returns 0 on success, 2 on bad arguments/checkpoint/data, 7 when more videos were
    unreadable than ``--max-bad-fraction`` allows (message on stderr)."""
    cfg, _ = parse(COMMAND, Config, argv)
    v, e = cfg.views, cfg.eval
    from tsm_ds.inference.views import legacy_note

    if legacy_note(v.num_crops, v.full_res):
        print(f"note: {legacy_note(v.num_crops, v.full_res)}", file=sys.stderr)
    from tsm_ds.cli._common import model_overrides
    from tsm_ds.engine.comm.dist import set_threads
    from tsm_ds.inference.evaluate import evaluate

    set_threads()   # ranks sharing a CPU split its cores (a no-op for one process or with OMP_NUM_THREADS)
    from tsm_ds.data.options import ReaderOptions
    try:
        reader_options = ReaderOptions(shard_cache=cfg.data.shard_cache, shard_cache_mb=cfg.data.shard_cache_mb)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tsm_ds.data.bad_videos import DataLossError, check_fraction, describe_loss
    from tsm_ds.models.weights import CheckpointError
    from tsm_ds.utils.exits import EXIT_DATA_LOSS

    try:
        check_fraction(cfg.data.max_bad_fraction)
    except ValueError as err:
        print(f"tsm-ds eval: {err}", file=sys.stderr)
        return 2

    try:
        metrics = evaluate(cfg.checkpoint.checkpoint, out=e.out, labels=cfg.checkpoint.labels,
                           overrides=model_overrides(cfg), data=cfg.data.data, list_file=e.list, root=e.root,
                           split=e.split, val_fraction=cfg.data.val_fraction, num_clips=v.num_clips,
                           num_crops=v.num_crops, sampling=v.sampling, full_res=v.full_res, resize=v.resize,
                           img_size=cfg.data.img_size, average=v.average, batch_size=e.batch_size,
                           workers=e.workers, max_clips=e.max_clips, plot=e.plot,
                           trust=cfg.checkpoint.trust_checkpoint, decode_device=cfg.data.decode_device,
                           log=lambda line: print(line, flush=True), max_bad_fraction=cfg.data.max_bad_fraction,
                           dataset=cfg.data.dataset, dataset_split=cfg.data.dataset_split,
                           frame_template=cfg.data.frame_template, reader_options=reader_options)
    except DataLossError as err:
        print(f"tsm-ds eval: {err}", file=sys.stderr)
        return EXIT_DATA_LOSS
    except (FileNotFoundError, NotADirectoryError, ValueError, CheckpointError) as err:
        print(f"tsm-ds eval: {err}", file=sys.stderr)
        return 2
    if metrics is not None:
        print(f"top-1 {metrics['top1']:.2f}%  top-5 {metrics['top5']:.2f}%  "
              f"mean class accuracy {metrics['mean_class_accuracy']:.2f}%  ({metrics['videos']} videos)")
        print(f"results: {e.out}")
        print(f"data lost: {describe_loss('eval', metrics['data_lost'])} (metrics.json names every file)")
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main(sys.argv[1:]))
