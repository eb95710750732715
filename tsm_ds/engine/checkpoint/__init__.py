"""Checkpoints: the manager (atomic, sharded writes, latest / keep-last), the reader of every
checkpoint kind, weights-only loading, resuming at another world size (reshard), and a run's
position (epoch, micro-batch, RNG states).

``tsm_ds.engine.checkpoint`` re-exports :mod:`.manager` (its former module).
"""
from .manager import *  # noqa: F401,F403
