"""Flags and helpers shared by the commands: the checkpoint commands (``tsm-ds eval``, ``predict``,
``export``) and the training flags of ``tsm_ds.train`` and ``tsm-ds config``."""
from __future__ import annotations

import argparse
import sys

from tsm_ds.inference.loading import LoadedModel, checkpoint_overrides, load_for_inference, resolve_img_size


def add_official_args(p: argparse.ArgumentParser) -> None:
    """The TSN options of a checkpoint whose file does not record them (an official file renamed,
    e.g. ``main.py``'s ``ckpt.best.pth.tar``), or to change those of any checkpoint:
    ``--arch``, ``--num-classes``, ``--shift {bidirectional,online,none}``, ``--shift-div``,
    ``--shift-place``, ``--temporal-pool`` / ``--no-temporal-pool``, ``--dropout`` (all default None
    = "as the checkpoint says"; ``--num-segments`` is the command's own flag). Read back with
    :func:`tsm_ds.inference.loading.checkpoint_overrides`. Also ``--trust-checkpoint``
    (:func:`add_trust_arg`).
    """
    g = p.add_argument_group("checkpoint options (default: what the checkpoint or its official file name says; "
                             "needed for official files renamed, e.g. ckpt.best.pth.tar)")
    g.add_argument("--arch", default=None, help="backbone (resnet50, mobilenet_v2, ...)")
    g.add_argument("--num-classes", type=int, default=None,
                   help="classes of the checkpoint's head (default for official files: its classifier's rows)")
    g.add_argument("--shift", default=None, choices=["bidirectional", "online", "none"],
                   help="temporal shift (none = TSN)")
    g.add_argument("--shift-div", type=int, default=None, help="1/shift_div of the channels move per direction")
    g.add_argument("--shift-place", default=None, choices=["blockres", "block"])
    g.add_argument("--temporal-pool", action=argparse.BooleanOptionalAction, default=None,
                   help="temporal max pooling before layer2 (ResNets)")
    g.add_argument("--dropout", type=float, default=None, help="dropout before the head (no effect at eval)")
    add_trust_arg(g)


def add_trust_arg(p) -> None:
    """``--trust-checkpoint`` (store_true), the one definition for every command that reads a
    checkpoint: eval, predict, export (through :func:`add_official_args`) and ``tsm_ds.train``
    (``--tune-from``, ``--resume``). Passed on as the library's ``trust=`` keyword
    (:mod:`tsm_ds.engine.safe_load`). ``p``: a parser or an argument group."""
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="load a checkpoint file that weights-only loading refuses (it asks to unpickle a class or "
                        "function besides tensors and the DeepSpeed classes tsm_ds's recipes save) with full "
                        "unpickling, which runs any code the file holds: only for checkpoints whose origin you know")


def load_from_args(args: argparse.Namespace, prog: str) -> LoadedModel | None:
    """Load ``--checkpoint`` for a command-line tool (predict, export).

    Applies ``--labels``, ``--trust-checkpoint`` and the build overrides, and sets ``args.img_size``
    to the size to run at (:func:`resolve_img_size`). Returns None after printing ``"{prog}: <reason>"`` to stderr for a
    missing, unreadable or mismatched checkpoint.
    """
    from tsm_ds.models.weights import CheckpointError

    try:
        loaded = load_for_inference(args.checkpoint, labels=args.labels, trust=args.trust_checkpoint,
                                    **checkpoint_overrides(args))
    except (FileNotFoundError, ValueError, CheckpointError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    args.img_size = resolve_img_size(args.img_size, loaded)
    return loaded


def add_training_args(p: argparse.ArgumentParser) -> None:
    """The training flags of ``tsm_ds.train`` and ``tsm-ds config``: ``--epochs``, ``--max-steps``,
    ``--seed`` and one flag per engine-JSON key of :data:`tsm_ds.engine.config.FLAG_KEYS`
    (``--batch-size``, ``--micro-batch-size``, ``--grad-accum``, ``--lr``, ``--weight-decay``,
    ``--clip-grad``, ``--warmup-steps``, ``--lr-steps``; default None = not given), allowed only where
    the JSON says "auto". Read the latter back with :func:`engine_flags`."""
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


def engine_flags(args: argparse.Namespace) -> dict:
    """``{FLAG_KEYS name: value or None}`` of :func:`add_training_args`' engine-JSON flags, the
    ``flags`` argument of :func:`tsm_ds.engine.config.resolve_config`."""
    from tsm_ds.engine.config import FLAG_KEYS

    return {k: getattr(args, k) for k in FLAG_KEYS}


def add_view_args(p) -> None:
    """The test-protocol flags of ``tsm-ds eval`` and ``predict`` (official ``test_models.py``):
    ``--num-clips``, ``--num-crops``, ``--full-res``, ``--resize`` (see :mod:`tsm_ds.inference.views`)."""
    p.add_argument("--num-clips", type=int, default=1, choices=[1, 2, 10],
                   help="clips per video: 1 uniform, 2 twice-sample, 10 dense (default 1)")
    p.add_argument("--num-crops", type=int, default=1, choices=[1, 3, 5, 10],
                   help="crops per clip, as the official --test_crops: 1 centre, 3 left/right/centre, "
                        "5 corners+centre, 10 corners+centre+flips (default 1). Deprecated: 3 without "
                        "--full-res/--no-full-res still means full-res 3 crops (the old meaning)")
    p.add_argument("--full-res", action=argparse.BooleanOptionalAction, default=None,
                   help="crops of side scale_size (256 for 224) instead of --img-size, as the official "
                        "--full_res; works with every --num-crops (default: off, on for --num-crops 3)")
    p.add_argument("--resize", choices=["box", "official"], default="box",
                   help="val/test scaling: box (default: one resized crop per view, faster) or official "
                        "(short side to scale_size with bilinear on uint8, then crop, as GroupScale + "
                        "GroupCenterCrop; frames decoded at full size)")
