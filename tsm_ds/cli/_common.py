"""Helpers shared by the checkpoint commands (``tsm-ds eval``, ``predict``, ``export``): the model
overrides of a parsed tree and loading ``--checkpoint`` with a message instead of a traceback.
Their options are fields of the configuration tree (:mod:`tsm_ds.config.commands`)."""
from __future__ import annotations

import sys

from tsm_ds.config import Config
from tsm_ds.inference.loading import LoadedModel, checkpoint_overrides, load_for_inference, resolve_img_size

#: the model fields a checkpoint command may override (None = what the checkpoint says)
_OVERRIDES = ("arch", "num_classes", "num_segments", "shift", "shift_div", "shift_place", "temporal_pool", "dropout")


def model_overrides(cfg: Config) -> dict:
    """``build_model`` overrides given on the command line (:func:`tsm_ds.inference.loading.checkpoint_overrides`
    of the ``model`` fields that are not None)."""
    return checkpoint_overrides({k: getattr(cfg.model, k) for k in _OVERRIDES})


def load_from_config(cfg: Config, prog: str) -> tuple[LoadedModel | None, int | None]:
    """Load ``cfg.checkpoint.checkpoint`` for a command-line tool (predict, export).

    Applies ``--labels``, ``--trust-checkpoint`` and the model overrides. Returns
    ``(loaded model, crop side to run at)`` (:func:`resolve_img_size`), or ``(None, None)`` after
    printing ``"{prog}: <reason>"`` to stderr for a missing, unreadable or mismatched checkpoint.
    """
    from tsm_ds.models.weights import CheckpointError

    try:
        loaded = load_for_inference(cfg.checkpoint.checkpoint, labels=cfg.checkpoint.labels,
                                    trust=cfg.checkpoint.trust_checkpoint, **model_overrides(cfg))
    except (FileNotFoundError, ValueError, CheckpointError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None, None
    return loaded, resolve_img_size(cfg.data.img_size, loaded)
