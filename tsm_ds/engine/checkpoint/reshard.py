"""Resuming on another world size: the global batch kept by accumulation, the data order re-sharded.

Node counts change between jobs (a requeued SLURM job lands on other nodes). A checkpoint written
by W0 ranks with global batch G0 = micro-batch m0 x accumulation a0 x W0 resumes on W1 ranks so:

- **Engine JSON** (:func:`resume_engine_inputs`, before the engine is built): the global batch stays
  G0 (the lr scaling rule, the steps per epoch and the lr schedule depend on it); the micro-batch
  stays m0 unless the recipe fixes another or ``--micro-batch-size`` is given; the accumulation is
  derived, G0 / (m x W1), whatever the recipe or ``--grad-accum`` said for the old world size.
  When it does not divide, :class:`~tsm_ds.engine.config.recipes.ConfigError` names the numbers, the world
  sizes that work and the micro-batches that would. The checkpoint's batch layout is read from its
  ``complete.json`` (written by :func:`manifest_fields` since this module exists), for older
  checkpoints from the run's ``config.json`` (``resolved_ds_config``).
- **Data order**: after S micro-batches per rank, ``DistributedSampler``'s interleaved striding has
  consumed exactly the prefix P = S x m0 x W0 of the epoch's permutation. P is recorded; on W1 ranks
  :class:`~tsm_ds.engine.loop.loaders.ResumableDistributedSampler` drops that prefix and shards the rest
  ``[rank::W1]`` (:func:`remaining_shard`), and the trainer continues at micro-batch P / (m x W1)
  of the epoch. Each clip of the epoch is seen once, and step k of the epoch trains on the same
  clips as at W0 (tested). At an unchanged world size the order is ``DistributedSampler``'s own.
- **Per-rank state** (``rank*.pt``) belongs to the old ranks: every rank re-seeds python / numpy /
  torch from (seed, step, rank) (:func:`reseed`); the 1-bit compressor's error feedback restarts at
  zero (its step count, which ends the warm-up, is kept).
- **DeepSpeed state**: with ZeRO stage 0 and no DeepSpeed bf16 optimizer (``BF16_Optimizer``,
  bf16 with ``data_types.grad_accum_dtype`` fp32) the module, optimizer and lr-schedule state sit
  whole in ``mp_rank_00_model_states.pt`` and load at any world size. ZeRO stages 1-3 and the bf16
  optimizer write one optimizer shard per rank (``*zero_pp_rank_<r>_*optim_states.pt``) that
  DeepSpeed 0.19.8 refuses to re-partition (``engine._load_zero_checkpoint``); its universal
  checkpoint converter (``deepspeed/checkpoint/ds_to_universal.py``) stops on our checkpoints
  (tried on a cpu_zero1 checkpoint: "Required universal_checkpoint_info state is missing", model
  metadata that Megatron-style clients write) and reads Adam's ``exp_avg`` / ``exp_avg_sq`` only (no
  SGD momentum, LARS, LAMB state). Such checkpoints are refused with a message naming the cause and
  what to do (:func:`check_optimizer_state`).

Bit-exact across a world-size change: the clips of every optimizer step and their augmentation
(a function of (seed, epoch, index)), the lr schedule, the optimizer state. Not: BatchNorm
statistics (computed per micro-batch, which holds other clips), dropout draws (re-seeded), the
summation order of the gradient average (float rounding), the compressor's error feedback.
"""
from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tsm_ds.engine.checkpoint.reader import COMPLETE
from tsm_ds.engine.config.recipes import AUTO, ConfigError

__all__ = ["CheckpointLayout", "ReshardPlan", "annotate_filled", "check_optimizer_state", "load",
           "manifest_fields", "peek_resume_tag", "read_layout", "remaining_shard", "reseed",
           "resume_engine_inputs", "written_world"]

log = logging.getLogger("tsm_ds.train")

#: DeepSpeed's per-rank optimizer shards (ZeRO 1-3: ``zero_pp_rank_0_mp_rank_00_optim_states.pt``;
#: ``BF16_Optimizer``: the same with a ``bf16_`` prefix), runtime/engine.py ``_get_zero_ckpt_prefix``
SHARD_GLOB = "*zero_pp_rank_*optim_states.pt"


def remaining_shard(order: list[int], consumed: int, rank: int, world: int) -> list[int]:
    """This rank's share of an epoch order after its first ``consumed`` samples (all ranks together).

    The rest ``order[consumed:]`` is padded to a multiple of ``world`` with the start of ``order``
    (cycling when shorter, as ``torch.utils.data.DistributedSampler`` pads) and strided
    ``[rank::world]``. With ``consumed`` a multiple of ``world`` this equals
    ``DistributedSampler``'s shard of ``order`` minus its first ``consumed / world`` entries.

    Args:
        order: the epoch's permutation of dataset indices (unpadded, length N >= 1).
        consumed: samples consumed in the epoch by all ranks (0 <= consumed; >= N: nothing left).
        rank, world: this rank and the world size (0 <= rank < world).

    Returns:
        ``ceil((N - consumed) / world)`` indices (none when ``consumed >= N``).
    """
    n = len(order)
    left = max(0, n - int(consumed))
    end = consumed + world * math.ceil(left / world)
    return [order[i % n] for i in range(consumed + rank, end, world)] if left else []


@dataclass(frozen=True)
class CheckpointLayout:
    """How a checkpoint was trained: world size and batch layout, and where the epoch stood.

    Attributes:
        tag_dir: the checkpoint's tag directory.
        world_size: ranks that wrote it.
        global_batch, micro_batch, accumulation: clips per optimizer step, per rank per micro-batch,
            micro-batches per step.
        samples_in_epoch: P, the clips all ranks consumed in the current epoch (None for checkpoints
            written before it was recorded: derived from the client state on load).
        source: the file the batch layout was read from.
    """
    tag_dir: Path
    world_size: int
    global_batch: int
    micro_batch: int
    accumulation: int
    samples_in_epoch: int | None
    source: str


@dataclass(frozen=True)
class ReshardPlan:
    """A resume on another world size, decided before the engine is built.

    Attributes:
        layout: the checkpoint's :class:`CheckpointLayout`.
        world: this run's world size; micro: this run's micro-batch.
        accumulation: derived, ``layout.global_batch / (micro x world)``.
    """
    layout: CheckpointLayout
    world: int
    micro: int
    accumulation: int


def peek_resume_tag(ckpt_dir: str | Path, resume: str | None) -> Path | None:
    """The tag directory ``--resume`` will most likely load, without reading the checkpoint files.

    ``"auto"``: the tag ``latest`` names when complete, else the newest complete tag (as
    :meth:`CheckpointManager.latest_tag`); a tag name or path: that tag when complete. None when
    there is nothing to resume (the trainer's own checks then report a missing tag). The CRC check
    and the fall-back to an older tag happen later, in :meth:`CheckpointManager.pick_resume_tag`.
    """
    d = Path(ckpt_dir)
    if not resume or not d.is_dir():
        return None
    if resume != "auto":
        t = d / Path(resume).name
        return t if (t / COMPLETE).is_file() else None
    latest = d / "latest"
    if latest.is_file() and (d / latest.read_text().strip() / COMPLETE).is_file():
        return d / latest.read_text().strip()
    tags = sorted(p for p in d.iterdir() if p.is_dir() and (p / COMPLETE).is_file() and not p.name.endswith(".damaged"))
    return tags[-1] if tags else None


def written_world(tag_dir: str | Path) -> int | None:
    """The world size recorded in a tag's ``complete.json``; None when it cannot be read (a damaged
    tag: :meth:`CheckpointManager.pick_resume_tag` reports and skips it)."""
    try:
        return int(json.loads((Path(tag_dir) / COMPLETE).read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_layout(tag_dir: str | Path) -> CheckpointLayout:
    """The batch layout of a complete checkpoint.

    Read from its ``complete.json`` (keys ``world_size``, ``global_batch``, ``micro_batch``,
    ``accumulation``, ``samples_in_epoch``); for checkpoints written before those keys, the batch
    sizes come from the run's ``config.json`` (``resolved_ds_config``, two folders up) and
    ``samples_in_epoch`` is None.

    Raises:
        ConfigError: ``complete.json`` unreadable, or an older checkpoint whose run has no readable
            ``config.json`` (the message says what to do).
    """
    tag_dir = Path(tag_dir)
    try:
        meta = json.loads((tag_dir / COMPLETE).read_text())
        world = int(meta["world_size"])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{tag_dir / COMPLETE}: unreadable ({e}); resume from another checkpoint") from e
    if "global_batch" in meta:
        return CheckpointLayout(tag_dir, world, int(meta["global_batch"]), int(meta["micro_batch"]),
                                int(meta["accumulation"]), int(meta["samples_in_epoch"]), str(tag_dir / COMPLETE))
    rec_path = tag_dir.parent.parent / "config.json"
    try:
        ds = json.loads(rec_path.read_text())["resolved_ds_config"]
        g, m, a = (int(ds[k]) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"checkpoint {tag_dir} does not record its batch layout (written before "
                          f"tsm_ds.engine.checkpoint.reshard) and {rec_path} cannot tell it ({type(e).__name__}: {e}): "
                          f"resume on {world} ranks as it was written, or start a new run from its weights "
                          f"with --tune-from {tag_dir}") from e
    return CheckpointLayout(tag_dir, world, g, m, a, None, str(rec_path))


def check_optimizer_state(layout: CheckpointLayout, world: int, *, error: type[Exception] = ConfigError) -> None:
    """Refuse a checkpoint whose optimizer state DeepSpeed keeps in per-rank shards.

    Args:
        layout: the checkpoint; world: the world size to resume on (the check applies only when
            it differs from ``layout.world_size``).
        error: the exception class to raise (ConfigError before the engine exists,
            ``CheckpointResumeError`` when loading).

    Raises:
        ``error``: the tag holds ``*zero_pp_rank_*optim_states.pt`` files (ZeRO stage >= 1 or
        DeepSpeed's bf16 optimizer): DeepSpeed 0.19.8 cannot re-partition them for another world
        size (see the module docstring); the message names the files and the three ways on.
    """
    if layout.world_size == world:
        return
    shards = sorted(p.name for p in layout.tag_dir.glob(SHARD_GLOB))
    if not shards:
        return
    kind = "DeepSpeed's bf16 optimizer" if shards[0].startswith("bf16_") else "ZeRO (`zero_optimization.stage` >= 1)"
    raise error(
        f"checkpoint {layout.tag_dir} was written by {layout.world_size} ranks with its optimizer state split "
        f"into one shard per rank by {kind} ({len(shards)} files: {shards[0]}, ...). DeepSpeed 0.19.8 cannot "
        f"re-partition those shards for {world} ranks (runtime/engine.py _load_zero_checkpoint), and its "
        f"universal-checkpoint converter (deepspeed/checkpoint/ds_to_universal.py) needs Megatron-style model "
        f"metadata (universal_checkpoint_info) and Adam states. "
        f"Resume on {layout.world_size} ranks; or start a new run from these weights with --tune-from "
        f"{layout.tag_dir} (the optimizer state restarts); or train with a recipe whose optimizer state is "
        f"whole (ZeRO stage 0 without bf16 master weights: cpu_fp32, cpu_bf16, gpu_fp16, gpu_bf16), which "
        f"resumes on any number of ranks")


def _divisors_note(g: int, m: int, world: int) -> str:
    worlds = [w for w in range(1, g // m + 1) if g % (m * w) == 0]
    micros = [d for d in range(1, g // world + 1) if g % (d * world) == 0] if g % world == 0 else []
    shown = ", ".join(map(str, worlds[:16])) + (", ..." if len(worlds) > 16 else "")
    note = f"resume on a number of ranks that divides {g // m} ({shown})"
    if micros:
        note += (f", or give --micro-batch-size with one of {', '.join(map(str, micros[:12]))} (where the recipe's "
                 f"micro-batch is \"auto\")")
    return note


def resume_engine_inputs(raw: dict, flags: dict, *, run_dir: str | Path, resume: str | None,
                         world: int) -> tuple[dict, dict, ReshardPlan | None]:
    """The engine JSON and flags to resolve for a run that resumes on another world size.

    Args:
        raw: the recipe as loaded (not modified); flags: the command-line values by
            ``config.FLAG_KEYS`` name (not modified); run_dir: the run folder (checkpoints/ in it);
        resume: ``--resume`` (``output.resume``); world: this run's world size.

    Returns:
        ``(raw, flags, None)`` unchanged when nothing is resumed or the checkpoint has this world
        size; else a copy of the recipe with ``train_batch_size`` = the checkpoint's global batch,
        ``train_micro_batch_size_per_gpu`` = the recipe's fixed micro-batch, else
        ``--micro-batch-size``, else the checkpoint's, and ``gradient_accumulation_steps`` =
        ``"auto"``; flags without the three batch flags; and the :class:`ReshardPlan`.

    Raises:
        ConfigError: the recipe fixes another global batch, ``--batch-size`` differs from the
            checkpoint's, the global batch is not divisible by micro-batch x world size, the
            optimizer state is sharded per rank (:func:`check_optimizer_state`), or the checkpoint's
            layout is unknown (:func:`read_layout`).
    """
    tag_dir = peek_resume_tag(Path(run_dir) / "checkpoints", resume)
    if tag_dir is None or written_world(tag_dir) in (None, world):   # nothing to do here (damaged: skipped later)
        return raw, flags, None
    lay = read_layout(tag_dir)
    check_optimizer_state(lay, world)
    g = lay.global_batch
    where = f"resuming {tag_dir} (global batch {g} = micro-batch {lay.micro_batch} x accumulation " \
            f"{lay.accumulation} x {lay.world_size} ranks) on {world} ranks"
    fixed_g = raw.get("train_batch_size", AUTO)
    if fixed_g != AUTO and fixed_g != g:
        raise ConfigError(f"{where}: the engine JSON fixes `train_batch_size` = {fixed_g}, the checkpoint was trained "
                          f"with {g}; a resumed run keeps its global batch: use the recipe it was trained with")
    if flags.get("batch_size") not in (None, g):
        raise ConfigError(f"{where}: --batch-size {flags['batch_size']} differs; a resumed run keeps its global "
                          f"batch (lr, steps per epoch and schedule depend on it): drop --batch-size, or start a "
                          f"new run with --tune-from {tag_dir}")
    fixed_m = raw.get("train_micro_batch_size_per_gpu", AUTO)
    m = fixed_m if fixed_m != AUTO else (flags.get("micro_batch_size") or lay.micro_batch)
    if not isinstance(m, int) or m < 1 or g % (m * world):
        raise ConfigError(f"{where}: the global batch {g} is not divisible by micro-batch {m} x {world} ranks = "
                          f"{m * world if isinstance(m, int) else m}, so no whole gradient accumulation keeps it; "
                          f"{_divisors_note(g, m if isinstance(m, int) and m > 0 else 1, world)}; or start a new "
                          f"run with --tune-from {tag_dir}")
    cfg = dict(raw)
    cfg.update(train_batch_size=g, train_micro_batch_size_per_gpu=m, gradient_accumulation_steps=AUTO)
    out_flags = {k: v for k, v in flags.items() if k not in ("batch_size", "micro_batch_size", "grad_accum")}
    return cfg, out_flags, ReshardPlan(lay, world, m, g // (m * world))


def annotate_filled(filled: dict, plan: ReshardPlan | None) -> None:
    """Say in ``filled`` (the "engine JSON auto" log lines and ``config.json``'s ``auto_filled``)
    where the batch sizes of a re-sharded resume came from. No-op without a plan."""
    if plan is None:
        return
    lay = plan.layout
    filled["train_batch_size"] = (f"{lay.global_batch} (kept from {lay.tag_dir.name}, written by "
                                  f"{lay.world_size} ranks)")
    filled["gradient_accumulation_steps"] = (f"{plan.accumulation} (global batch {lay.global_batch} / (micro-batch "
                                             f"{plan.micro} x {plan.world} ranks); the checkpoint used "
                                             f"{lay.accumulation})")


def manifest_fields(layout, epoch: int, micro_in_epoch: int) -> dict:
    """The batch layout and data position stored in a checkpoint's ``complete.json``, readable
    before any engine exists (:func:`read_layout`): ``global_batch``, ``micro_batch``,
    ``accumulation``, ``epoch``, ``micro_in_epoch`` (per rank) and ``samples_in_epoch`` (P, all
    ranks: ``micro_in_epoch x micro x world``; with a multigrid schedule the clips of the epoch's
    steps so far, :meth:`~tsm_ds.engine.loop.state.Layout.clips_before`), from a
    :class:`~tsm_ds.engine.loop.state.Layout`."""
    return {"global_batch": int(layout.global_batch), "micro_batch": int(layout.micro),
            "accumulation": int(layout.accum), "epoch": int(epoch), "micro_in_epoch": int(micro_in_epoch),
            "samples_in_epoch": int(layout.clips_before(epoch, micro_in_epoch))}


def reseed(seed: int, step: int, rank: int) -> int:
    """Seed python's, numpy's and torch's (CPU and every GPU) RNGs from (seed, step, rank).

    Used for the dropout draws of a rank whose RNG state was saved by another world size's ranks.
    The value comes from ``numpy.random.SeedSequence([seed, step, rank])`` (well mixed: neighbouring
    ranks and steps get unrelated streams). Returns the 32-bit seed used.
    """
    value = int(np.random.SeedSequence([int(seed), int(step), int(rank)]).generate_state(1)[0])
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    return value


def _restart_compressor(comp, step: int) -> None:
    """Error feedback of the 1-bit compressor back to zero; its step count (warm-up) kept."""
    comp.step = int(step)
    for name in ("worker_error", "server_error"):
        buf = getattr(comp, name, None)
        if buf is not None:
            buf.zero_()


def load(ckpt, engine, tag: str, *, layout, seed: int, compressor=None) -> tuple[dict, dict]:
    """Load checkpoint ``tag`` of ``ckpt`` (a :class:`~tsm_ds.engine.checkpoint.manager.CheckpointManager`)
    into ``engine``, at any world size; ``layout``: this run's :class:`~tsm_ds.engine.loop.state.Layout`;
    ``seed``: the run's seed; ``compressor``: the 1-bit compressor or None.

    The same world size: :meth:`CheckpointManager.load` as it is. Another one: the engine state
    (module, optimizer, lr schedule; refused when sharded per rank), then a rank state built for
    this rank: RNGs re-seeded from (seed, step, rank), the compressor's error feedback at zero, and
    the data position converted: micro-batch P / (micro x world) of the checkpoint's epoch. Logs
    once on rank 0 what was kept and what was not.

    Returns:
        ``(client_state, rank_state)`` as :meth:`CheckpointManager.load`.

    Raises:
        CheckpointResumeError: optimizer state sharded per rank, another global batch than this
            run's, or a position that is not a whole number of micro-batches here.
        ConfigError: the checkpoint's batch layout is unknown (:func:`read_layout`).
    """
    from tsm_ds.engine.checkpoint.manager import CheckpointResumeError, rng_state

    tag_dir = ckpt.dir / tag
    if written_world(tag_dir) in (None, layout.world):   # (None: the manager's own error)
        return ckpt.load(engine, tag)
    lay = read_layout(tag_dir)
    check_optimizer_state(lay, layout.world, error=CheckpointResumeError)
    if lay.global_batch != layout.global_batch:
        raise CheckpointResumeError(f"checkpoint {tag_dir} was trained with global batch {lay.global_batch}, this run "
                                    f"was set up for {layout.global_batch}: resume from that checkpoint explicitly "
                                    f"(--resume {tag}) so that the engine JSON is resolved for it")
    client, _ = ckpt.load(engine, tag, other_world=True)
    consumed = (lay.samples_in_epoch if lay.samples_in_epoch is not None
                else int(client["micro_in_epoch"]) * lay.micro_batch * lay.world_size)
    try:
        micro_here = layout.micro_at(int(client["epoch"]), consumed)
    except ValueError as e:
        raise CheckpointResumeError(f"checkpoint {tag_dir} stands {consumed} clips into its epoch: {e}; resume on "
                                    f"{lay.world_size} ranks") from None
    step = int(client["step"])
    reseed(seed, step, layout.rank)
    if compressor is not None:
        _restart_compressor(compressor, step)
    if layout.rank == 0:
        log.info("resuming %s, written by %d ranks, on %d ranks: global batch %d kept (micro-batch %d x accumulation "
                 "%d x %d ranks; it was %d x %d x %d); the epoch continues after its first %d clips, the rest "
                 "re-sharded over %d ranks (each clip once, the same clips per step); per-rank RNGs re-seeded from "
                 "(seed %d, step %d, rank)%s; BatchNorm statistics, dropout draws and the gradient summation order "
                 "differ from a run on %d ranks", tag_dir, lay.world_size, layout.world, lay.global_batch,
                 layout.micro, layout.accum, layout.world, lay.micro_batch, lay.accumulation, lay.world_size,
                 consumed, layout.world, seed, step,
                 "; 1-bit compressor error feedback restarts at zero" if compressor is not None else "",
                 lay.world_size)
    return client, {"rng": rng_state(), "epoch": int(client["epoch"]), "micro_in_epoch": micro_here,
                    "rank": layout.rank}
