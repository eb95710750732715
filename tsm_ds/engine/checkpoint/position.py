"""A run's position in checkpoints: save the engine with the run's state and data position, load it
back (at any world size, :func:`tsm_ds.engine.checkpoint.reshard.load`), pick the checkpoint ``--resume`` means.

Functions take the run's parts (:class:`tsm_ds.engine.loop.build.EngineParts`) and state
(:class:`tsm_ds.engine.loop.state.RunState`) explicitly; the trainer calls them.
"""
from __future__ import annotations

import logging

from tsm_ds.engine.checkpoint import reshard
from tsm_ds.engine.checkpoint.manager import rng_state, set_rng_state
from tsm_ds.engine.loop.evaluate import sync_batchnorm_stats

__all__ = ["save_position", "load_position", "resume_position"]

log = logging.getLogger("tsm_ds.train")


def save_position(parts, state, *, epoch: int, micro: int, extra: dict, lrs: dict) -> str:
    """Save a checkpoint positioned at (epoch, micro-batches done in it); BatchNorm statistics are
    averaged over ranks first and the weights checked (every rank).

    Args:
        parts: the run's :class:`~tsm_ds.engine.loop.build.EngineParts`; state: its ``RunState``.
        epoch, micro: the data position the checkpoint resumes at.
        extra: more client state (class names, model config, image size).
        lrs: the current per-group lrs (for a divergence report).

    Returns:
        the checkpoint's tag.

    Raises:
        DivergenceError: non-finite weights (nothing written).
        CheckpointSaveError: the write failed (the previous checkpoint stays the latest).
    """
    sync_batchnorm_stats(parts.engine.module)
    parts.guard.check_weights(f"saving the checkpoint of step {state.step}", step=state.step, lrs=lrs)
    client = {**state.state_dict(), "epoch": epoch, "micro_in_epoch": micro, **extra,
              "bad_videos": parts.bad.state_dict(), "guard": parts.guard.state_dict()}
    rank_state = {"rng": rng_state(), "epoch": epoch, "micro_in_epoch": micro,
                  "samples_in_epoch": parts.layout.clips_before(epoch, micro) // parts.layout.world,
                  "rank": parts.layout.rank}
    if parts.compressor is not None:
        rank_state["compressor"] = parts.compressor.state_dict()
    tag = parts.ckpt.save(parts.engine, step=state.step, client_state=client, rank_state=rank_state,
                          best_tag=state.best_tag, meta=reshard.manifest_fields(parts.layout, epoch, micro))
    state.last_saved = state.step
    return tag


def load_position(parts, state, tag: str, *, seed: int) -> tuple[int, int]:
    """Load checkpoint ``tag`` into the engine, ``state``, the guard, the bad-file tracker, the
    compressor and the RNGs; returns its (epoch, micro-batches done in it) for this world size.

    Raises:
        CheckpointResumeError, UntrustedCheckpointError, ConfigError: see :func:`tsm_ds.engine.checkpoint.reshard.load`.
    """
    client, rank_state = reshard.load(parts.ckpt, parts.engine, tag, layout=parts.layout, seed=seed,
                                      compressor=parts.compressor)
    state.load_state_dict(client)
    parts.bad.load_state_dict(client.get("bad_videos"))
    if client.get("guard"):
        parts.guard.load_state_dict(client["guard"])
    if parts.compressor is not None and "compressor" in rank_state:
        parts.compressor.load_state_dict(rank_state["compressor"])
    set_rng_state(rank_state["rng"])
    parts.engine.zero_grad()
    parts.engine.micro_steps = 0   # the accumulation boundary counts from the checkpoint, as in a new process
    return int(rank_state["epoch"]), int(rank_state["micro_in_epoch"])


def resume_position(parts, state, resume: str | None, *, seed: int) -> tuple[int, int]:
    """Where the run starts: (0, 0) without ``resume``, else the position of the checkpoint it names
    (``"auto"``: the latest complete one, a fresh start when there is none; or a tag). Logged on rank 0."""
    rank0 = parts.layout.rank == 0
    tag = parts.ckpt.pick_resume_tag(resume, warn=log.warning if rank0 else None) if resume else None
    if tag is None:
        if resume and rank0:
            log.info("--resume auto: no checkpoint in %s yet, starting fresh", parts.ckpt.dir)
        return 0, 0
    epoch, micro = load_position(parts, state, tag, seed=seed)
    if rank0:
        log.info("resumed from %s: epoch %d, %d micro-batches into it, optimizer step %d", parts.ckpt.dir / tag,
                 epoch, micro, state.step)
    return epoch, micro
