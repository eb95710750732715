"""Flags and helpers shared by the checkpoint commands (``tsm-ds eval``, ``predict``, ``export``)."""
from __future__ import annotations

import argparse
import sys

from tsm_ds.inference.loading import LoadedModel, checkpoint_overrides, load_for_inference, resolve_img_size


def add_official_args(p: argparse.ArgumentParser) -> None:
    """``--arch`` / ``--num-classes`` for official checkpoints whose file name no longer carries them."""
    g = p.add_argument_group("official checkpoints renamed from TSM_<dataset>_RGB_<arch>_shift8_..._segment8_e50.pth")
    g.add_argument("--arch", default=None, help="backbone (resnet50, mobilenet_v2, ...)")
    g.add_argument("--num-classes", type=int, default=None, help="classes of the checkpoint's head")


def load_from_args(args: argparse.Namespace, prog: str) -> LoadedModel | None:
    """Load ``--checkpoint`` for a command-line tool (predict, export).

    Applies ``--labels`` and the build overrides, and sets ``args.img_size`` to the size to run at
    (:func:`resolve_img_size`). Returns None after printing ``"{prog}: <reason>"`` to stderr for a
    missing, unreadable or mismatched checkpoint.
    """
    from tsm_ds.models.weights import CheckpointError

    try:
        loaded = load_for_inference(args.checkpoint, labels=args.labels, **checkpoint_overrides(args))
    except (FileNotFoundError, ValueError, CheckpointError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    args.img_size = resolve_img_size(args.img_size, loaded)
    return loaded
