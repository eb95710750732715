"""``tsm-ds eval``: multi-view evaluation of a checkpoint, on one process or many.

One process::

    tsm-ds eval --checkpoint runs/x/best_model.pt --data ../shared/data --split val \\
        --num-clips 10 --num-crops 3 --full-res --out results/x
    tsm-ds eval --checkpoint runs/x/best_model.pt --out results/x   # the run's own validation clips

Data: ``--data DIR`` is resolved exactly as training resolves it (:func:`tsm_ds.data.splits.resolve_split`:
a folder holding manifest.csv or its videos/, class folders under train/ + val/, or a class-folder tree
with a per-class hold-out of ``--val-fraction``); ``--split train|val|all`` picks the side (default: val
when the data carries its own split, all for a plain class-folder tree). ``--list FILE [--root DIR]``
reads a video list. Without either, the run's ``config.json`` next to the checkpoint (RUN/best_model.pt,
RUN/last_model.pt, RUN, RUN/checkpoints/<tag>) names the data, and its validation side is evaluated.

Several processes (each video is scored once, by one rank; DistributedSampler padding is dropped by
:func:`tsm_ds.engine.evaluate.gather_predictions`)::

    deepspeed --num_gpus 2 --module tsm_ds.cli.eval --checkpoint ... --data ... --out ...
    torchrun --nproc_per_node 2 -m tsm_ds.cli.eval ...          # works the same

Checkpoints (:func:`tsm_ds.inference.loading.load_for_inference`): the trainer's exported plain state dict
(``{"state_dict", "model_config", "class_names"}``), a DeepSpeed run/checkpoint directory, or an
official TSM checkpoint file (``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth``;
class names from ``--labels``, e.g. ``kinetics400_labels.txt``).

Views are averaged as logits by default (as the official ``test_models.py``; see
:mod:`tsm_ds.inference.views`); ``--average prob`` averages softmax probabilities.
Results (rank 0 writes them): see :mod:`tsm_ds.inference.report`.
"""
from __future__ import annotations

import argparse
import sys

from tsm_ds.cli._common import add_official_args, add_view_args


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds eval`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds eval", description=__doc__.split("\n\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="exported state dict file, DeepSpeed checkpoint directory, or official TSM .pth")
    p.add_argument("--labels", default=None,
                   help="label map (one class name a line), e.g. kinetics400_labels.txt; "
                        "needed for official checkpoints, overrides the checkpoint's names")
    d = p.add_argument_group("data")
    d.add_argument("--data", default=None,
                   help="resolved as training does: a folder holding manifest.csv (../shared/data) or its "
                        "videos/, class folders under train/ + val/, or a class-folder tree "
                        "(<root>/<class>/<video>). Without --data and --list: the data recorded in the "
                        "run's config.json next to --checkpoint")
    d.add_argument("--split", choices=["train", "val", "all"], default=None,
                   help="side of the split to evaluate; default: val for a manifest, train/ + val/ folders or "
                        "the run's config.json, all for a plain class-folder tree (whose val side is the "
                        "per-class hold-out of --val-fraction, as in training)")
    d.add_argument("--val-fraction", type=float, default=0.2,
                   help="per-class hold-out of a plain class-folder tree, as the training flag (default 0.2)")
    d.add_argument("--list", default=None, help="video list file: '<path> <label>' lines")
    d.add_argument("--root", default=None, help="root that --list paths are relative to")
    v = p.add_argument_group("test protocol")
    add_view_args(v)
    v.add_argument("--sampling", choices=["tsn", "dense"], default=None,
                   help="override the protocol's sampling (default: dense for 10 clips, else tsn)")
    v.add_argument("--num-segments", type=int, default=None, help="T (default: the checkpoint's)")
    v.add_argument("--img-size", type=int, default=None, help="crop size, pixels (default: the size the checkpoint was trained at, else 224)")
    v.add_argument("--average", choices=["logits", "prob"], default="logits",
                   help="average views as logits (default, as the official test code) or probabilities")
    r = p.add_argument_group("run")
    r.add_argument("--batch-size", type=int, default=1, help="videos per rank per step (default 1)")
    r.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    r.add_argument("--max-clips", type=int, default=None,
                   help="clips per model call, to bound memory with many views (default: all)")
    r.add_argument("--out", required=True, help="results directory")
    r.add_argument("--no-plot", action="store_true", help="skip confusion.png")
    r.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_official_args(p)
    return p


def main(argv: list[str]) -> int:
    """``tsm-ds eval``; returns 0 on success, 2 on bad arguments/checkpoint/data (message on stderr)."""
    args = build_parser().parse_args(argv)
    from tsm_ds.inference.views import legacy_note

    if legacy_note(args.num_crops, args.full_res):
        print(f"note: {legacy_note(args.num_crops, args.full_res)}", file=sys.stderr)
    from tsm_ds.engine.dist import set_threads
    from tsm_ds.inference.evaluate import evaluate

    set_threads()   # ranks sharing a CPU split its cores (a no-op for one process or with OMP_NUM_THREADS)
    from tsm_ds.models.weights import CheckpointError

    try:
        metrics = evaluate(args, log=lambda line: print(line, flush=True))
    except (FileNotFoundError, NotADirectoryError, ValueError, CheckpointError) as e:
        print(f"tsm-ds eval: {e}", file=sys.stderr)
        return 2
    if metrics is not None:
        print(f"top-1 {metrics['top1']:.2f}%  top-5 {metrics['top5']:.2f}%  "
              f"mean class accuracy {metrics['mean_class_accuracy']:.2f}%  ({metrics['videos']} videos)")
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
