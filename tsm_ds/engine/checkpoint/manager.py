"""Checkpoints: DeepSpeed engine state + client state + per-rank state, kept safe across failures.

Layout under ``<run dir>/checkpoints``::

    step00000120/                 one tag per saved optimizer step
        mp_rank_00_model_states.pt    DeepSpeed: module, optimizer, lr schedule, client state
        ...                           (ZeRO: one optimizer-state file per rank)
        rank00000.pt ...              ours, one per rank: RNG states, sampler position, compressor
        complete.json                 written last: the tag is whole; lists every file with its
                                      size and CRC-32 (the manifest), the world size, batch
                                      layout and epoch position (tsm_ds.engine.checkpoint.reshard)
    latest                        tag of the newest complete checkpoint (DeepSpeed's format)

DeepSpeed writes client state from rank 0 only, so everything that differs per rank (RNG
states, data position, compressor error-feedback buffers) lives in the ``rank*.pt`` files. A save
that fails half-way leaves a tag without ``complete.json``; ``latest`` and older tags are only
touched after every rank has finished, so the previous checkpoint always survives. All files we
write go through a temporary name and ``os.replace``. A save that fails on any rank (disk full,
quota, I/O error) fails on every rank alike: the partial tag is removed and
:class:`CheckpointSaveError` names the cause and the intact previous checkpoint.

Resuming checks a tag's files against its manifest before loading (:meth:`CheckpointManager.verify`):
a newest checkpoint that was truncated or corrupted after it was completed is skipped with a
warning, and ``--resume auto`` falls back to the previous complete one. Computing the manifest
reads the files back once (CRC-32, about 1 GB/s; the files are still in the page cache).

Resuming never runs code from the files (:mod:`tsm_ds.engine.checkpoint.safe_load`): every ``*.pt`` of the tag
is first loaded weights-only (a file asking for a global outside the allowlist is refused, naming
it), then DeepSpeed's ``load_checkpoint`` runs with its ``torch.load`` calls forced weights-only,
and the ``rank*.pt`` files are read weights-only; ``trust=True`` (``--trust-checkpoint``) lifts that.

Kept whole: saving, verifying, pruning and loading a tag are one protocol over one layout (the
manifest, ``latest``, every rank agreeing) and change together; reading the other checkpoint kinds
is already apart (:mod:`tsm_ds.engine.checkpoint.reader`).
"""
from __future__ import annotations

import json
import random
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tsm_ds.engine.checkpoint.reader import COMPLETE, CheckpointContents, read_checkpoint, wrapper_mismatch_cause  # noqa: F401 (re-exported)
from tsm_ds.engine.checkpoint.safe_load import check_files, load_file, weights_only_loading
from tsm_ds.models.official import NotOfficialNameError
from tsm_ds.utils.io import atomic_torch_save, atomic_write_text


class CheckpointResumeError(RuntimeError):
    """The checkpoint asked for cannot be resumed from (damaged, other world size); says what to do."""


class CheckpointSaveError(RuntimeError):
    """Writing a checkpoint failed (on some rank); the message names the cause and the previous
    complete checkpoint, which is untouched."""


def _file_crc(path: Path, chunk: int = 1 << 22) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def manifest(tag_dir: str | Path) -> dict[str, list[int]]:
    """``{relative path: [size in bytes, CRC-32]}`` of every file in a tag directory except
    ``complete.json``, sorted by path."""
    tag_dir = Path(tag_dir)
    files = sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != COMPLETE)
    return {str(p.relative_to(tag_dir)): [p.stat().st_size, _file_crc(p)] for p in files}


def _any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank (a collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def rng_state() -> dict:
    """This process's RNG states (python, numpy, torch CPU, and CUDA when present)."""
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def tag_for_step(step: int) -> str:
    """Checkpoint tag of optimizer step ``step``: ``step00000120``."""
    return f"step{int(step):08d}"


class CheckpointManager:
    """Save, find and load the run's checkpoints; keep the last N complete ones plus the best.

    Args:
        ckpt_dir: ``<run dir>/checkpoints`` (shared by all ranks: on several machines it must be
            a shared filesystem).
        keep_last: complete checkpoints kept besides the best (>= 1).
        rank, world_size: this process's data-parallel rank and the world size.
        trust: :meth:`load` unpickles in full what weights-only loading refuses, after a warning
            (``--trust-checkpoint``); by default such a checkpoint is refused.
    """

    def __init__(self, ckpt_dir: str | Path, *, keep_last: int = 2, rank: int = 0, world_size: int = 1,
                 trust: bool = False):
        self.dir = Path(ckpt_dir)
        self.keep_last = max(1, int(keep_last))
        self.rank, self.world = rank, world_size
        self.trust = bool(trust)
        if rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
        _barrier()

    # -- discovery
    def complete_tags(self) -> list[str]:
        """Tags with ``complete.json``, oldest first (by step: tag names sort by step)."""
        if not self.dir.is_dir():
            return []
        return sorted(p.name for p in self.dir.iterdir()
                      if p.is_dir() and (p / COMPLETE).is_file() and not p.name.endswith(".damaged"))

    def resume_candidates(self) -> list[str]:
        """Complete tags to try for ``--resume auto``, best first: ``latest``, then newest to oldest."""
        first = self.latest_tag()
        return ([first] if first else []) + [t for t in reversed(self.complete_tags()) if t != first]

    def pick_resume_tag(self, resume: str, *, warn=None) -> str | None:
        """The tag to resume from, its files verified against the manifest.

        ``"auto"``: the first undamaged tag of :meth:`resume_candidates` (each damaged one is
        reported through ``warn(message, ...)`` when given); None when there is no complete tag yet.
        A tag name / path: that tag. The decision reads shared files only: the same on every rank.

        Raises:
            FileNotFoundError: an explicit tag that is missing or incomplete.
            CheckpointResumeError: the explicit tag is damaged, or every complete tag is.
        """
        if resume != "auto":
            tag = self.resolve(resume)
            problem = self.verify(tag)
            if problem:
                raise CheckpointResumeError(f"--resume {resume}: {problem}; use --resume auto to fall back to an "
                                   "older complete checkpoint")
            return tag
        candidates = self.resume_candidates()
        for tag in candidates:
            problem = self.verify(tag)
            if not problem:
                return tag
            if warn is not None:
                warn("--resume auto: checkpoint %s is damaged (%s); falling back to the previous complete one "
                     "(the damaged one is kept as %s.damaged, never pruned nor resumed)", self.dir / tag, problem,
                     self.dir / tag)
            if self.rank == 0:   # out of the rotation: kept for inspection, not counted among the last N
                (self.dir / tag).rename(self.dir / f"{tag}.damaged")
        if candidates:
            raise CheckpointResumeError(f"--resume auto: every complete checkpoint in {self.dir} is damaged "
                               f"({', '.join(candidates)}; see the warnings above): move them away to start "
                               "afresh, or restore one from a backup")
        return None

    def verify(self, tag: str) -> str | None:
        """What is wrong with a complete tag's files (missing, size or CRC-32 differs from the
        manifest, unreadable ``complete.json``), or None when they match. Tags written before the
        manifest existed are accepted as they are."""
        try:
            meta = json.loads((self.dir / tag / COMPLETE).read_text())
        except (OSError, ValueError) as e:
            return f"{COMPLETE} unreadable ({e})"
        for rel, (size, crc) in (meta.get("files") or {}).items():
            f = self.dir / tag / rel
            if not f.is_file():
                return f"{rel} is missing"
            if f.stat().st_size != size:
                return f"{rel} has {f.stat().st_size} bytes, the manifest says {size} (truncated?)"
            if _file_crc(f) != crc:
                return f"{rel} does not match its CRC-32 (corrupted)"
        return None

    def latest_tag(self) -> str | None:
        """The tag named by ``latest`` when complete, else the newest complete tag, else None."""
        f = self.dir / "latest"
        if f.is_file():
            t = f.read_text().strip()
            if (self.dir / t / COMPLETE).is_file():
                return t
        tags = self.complete_tags()
        return tags[-1] if tags else None

    def resolve(self, resume: str) -> str | None:
        """Tag to resume from: ``"auto"`` -> latest complete (None when there is none yet); a tag
        name or a path to a tag directory inside this run's checkpoints.

        Raises:
            FileNotFoundError: an explicit tag that is missing or incomplete.
        """
        if resume == "auto":
            return self.latest_tag()
        t = Path(resume).name
        if not (self.dir / t / COMPLETE).is_file():
            raise FileNotFoundError(f"--resume {resume}: no complete checkpoint {self.dir / t} "
                                    f"(complete tags: {self.complete_tags()}); use --resume auto")
        return t

    # -- save / load
    def save(self, engine, *, step: int, client_state: dict, rank_state: dict, best_tag: str | None,
             meta: dict | None = None) -> str:
        """Save a checkpoint on every rank (collective: all ranks must call it).

        Args:
            engine: the DeepSpeed engine.
            step: optimizer steps done (names the tag).
            client_state: rank-0 state stored by DeepSpeed (epoch, step, best top-1, class names...).
            rank_state: this rank's state (RNG, sampler position, compressor), saved per rank.
            best_tag: the tag to keep besides the last N.
            meta: more keys for ``complete.json`` (the batch layout and data position that
                :mod:`tsm_ds.engine.checkpoint.reshard` reads before any engine exists).

        Returns:
            The tag written.

        Raises:
            CheckpointSaveError: on every rank, when writing failed on any rank (the partial tag
                is removed; ``latest`` still names the previous complete checkpoint).
        """
        tag = tag_for_step(step)
        tag_dir = self.dir / tag
        if self.rank == 0 and (tag_dir / COMPLETE).is_file():
            (tag_dir / COMPLETE).unlink()  # re-saving a step: it is incomplete until done again
        _barrier()
        error = None
        try:
            engine.save_checkpoint(str(self.dir), tag=tag, client_state=client_state, save_latest=False)
            tag_dir.mkdir(parents=True, exist_ok=True)
            atomic_torch_save(rank_state, tag_dir / f"rank{self.rank:05d}.pt")
        except (OSError, RuntimeError) as e:   # torch.save reports a failed write as RuntimeError
            error = e
        if not _any_rank(error is not None) and self.rank == 0:
            try:
                atomic_write_text(tag_dir / COMPLETE, json.dumps(
                    {"step": int(step), "world_size": self.world, **(meta or {}), "files": manifest(tag_dir)}) + "\n")
                atomic_write_text(self.dir / "latest", tag)
            except OSError as e:
                error = e
        if _any_rank(error is not None):
            if self.rank == 0:
                shutil.rmtree(tag_dir, ignore_errors=True)
                latest = self.dir / "latest"
                if latest.is_file() and latest.read_text().strip() == tag:
                    latest.unlink()
            _barrier()
            prev = self.latest_tag()
            raise CheckpointSaveError(
                f"saving checkpoint {tag_dir} failed: "
                + (f"{type(error).__name__}: {error}" if error is not None else "on another rank (see its log)")
                + self._space_note(prev)
                + f"; the previous checkpoint {self.dir / prev if prev else '(none)'} is intact: free space in "
                f"{self.dir} and continue with --resume auto")
        if self.rank == 0:
            self._prune(best_tag, current=tag)
        _barrier()
        return tag

    def _space_note(self, prev: str | None) -> str:
        """'; N MB free on that filesystem' plus 'the disk is full' when a checkpoint (sized from the
        previous one's manifest) no longer fits: torch reports a full disk as an obscure write error."""
        try:
            free = shutil.disk_usage(self.dir).free
        except OSError:
            return ""
        need = 0
        if prev:
            try:
                need = sum(v[0] for v in json.loads((self.dir / prev / COMPLETE).read_text()).get("files", {}).values())
            except (OSError, ValueError):
                need = 0
        full = need and free < need
        return (f" ({free / 1e6:.0f} MB free on that filesystem"
                + (f", a checkpoint takes {need / 1e6:.0f} MB: the disk is full)" if full else ")"))

    def _prune(self, best_tag: str | None, current: str) -> None:
        tags = self.complete_tags()
        keep = set(tags[-self.keep_last:]) | {current}
        if best_tag:
            keep.add(best_tag)
        for t in tags:
            if t not in keep:
                shutil.rmtree(self.dir / t, ignore_errors=True)
        # leftovers of failed saves (no complete.json) older than the current tag
        for p in self.dir.iterdir():
            if p.is_dir() and not (p / COMPLETE).is_file() and p.name < current and not p.name.endswith(".damaged"):
                shutil.rmtree(p, ignore_errors=True)

    def load(self, engine, tag: str, *, other_world: bool = False) -> tuple[dict, dict | None]:
        """Load engine state (module, optimizer, lr schedule) and this rank's state.

        Args:
            other_world: accept a checkpoint written by another world size: the engine state is
                loaded, the per-rank state is not (None); :func:`tsm_ds.engine.checkpoint.reshard.load` builds it.

        Every file is loaded weights-only (module docstring); the files of the tag are checked
        first on every rank, so that all ranks refuse alike, naming the file.

        Returns:
            (client_state, rank_state).

        Raises:
            CheckpointResumeError: the checkpoint was written by another world size and
                ``other_world`` is false (its per-rank data positions would not match).
            tsm_ds.engine.checkpoint.safe_load.UntrustedCheckpointError: (without ``trust``) a file of the tag
                asks to unpickle a global outside the allowlist; the message names the file, the
                global and ``--trust-checkpoint``.
        """
        tag_dir = self.dir / tag
        meta = json.loads((tag_dir / COMPLETE).read_text())
        if int(meta["world_size"]) != self.world and not other_world:
            raise CheckpointResumeError(f"checkpoint {tag_dir} was written by {meta['world_size']} ranks, this run "
                               f"has {self.world}: resume with the same number of ranks, or start a new run "
                               f"with --tune-from {tag_dir}")
        check_files(sorted(tag_dir.rglob("*.pt")), trust=self.trust)
        with weights_only_loading(tag_dir, trust=self.trust):
            path, client = engine.load_checkpoint(str(self.dir), tag=tag, load_optimizer_states=True,
                                                  load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag_dir}")
        if int(meta["world_size"]) != self.world:
            return dict(client or {}), None   # rank*.pt belong to the old ranks
        rank_state = load_file(tag_dir / f"rank{self.rank:05d}.pt", trust=self.trust)
        return dict(client or {}), rank_state


def plain_state_dict(module: torch.nn.Module) -> dict:
    """The module's state dict on CPU with floating tensors in float32 (bf16/fp16 engines), keys of the
    bare model: a ``torch.compile`` wrapper's ``_orig_mod.`` (also of a compiled submodule) removed."""
    return {re.sub(r"(^|\.)_orig_mod\.", r"\1", k): (v.detach().float().cpu() if v.is_floating_point()
                                                      else v.detach().cpu())
            for k, v in module.state_dict().items()}


def save_weights_export(path: str | Path, module: torch.nn.Module, *, class_names: list[str],
                        extra: dict | None = None) -> None:
    """Write the plain model file the eval / predict / export tools read (atomically): the weights
    export ``<run>/best_model.pt`` / ``last_model.pt`` (not :func:`tsm_ds.inference.export.export_model`,
    which writes torch.export / ONNX files).

    Format (the team contract): ``{"state_dict": ..., "model_config": module.config (or None),
    "class_names": [...], **extra}``; rebuild with ``build_model(**model_config)``.
    """
    obj = {"state_dict": plain_state_dict(module), "model_config": getattr(module, "config", None),
           "class_names": list(class_names)}
    obj.update(extra or {})
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(obj, p)


def load_finetune_weights(model: torch.nn.Module, path: str | Path, *,
                          official_overrides: dict | None = None, trust: bool = False) -> dict:
    """Load weights for fine-tuning (``--tune-from``); the classifier is skipped when shapes differ.

    Accepts every kind :func:`read_checkpoint` reads (:mod:`tsm_ds.engine.checkpoint.reader`): our
    exports (``RUN/best_model.pt``), a run directory / its ``checkpoints/`` (the tag ``latest``
    names) / a tag directory (ZeRO-3 too), a plain state dict file, an official TSM ``.pth``
    (``official_overrides``: the model options used only for an official file whose name says
    nothing; a file that names its options is read as it says).

    Args:
        model: the freshly built model to fine-tune (loaded in place).
        path: the checkpoint.
        trust: load what weights-only loading refuses with full unpickling, after a warning
            (``--trust-checkpoint``; see :func:`read_checkpoint`).

    Returns:
        ``{"loaded": n, "skipped": [keys with another shape (the head when the class count
        differs)], "source": "tsm_ds export" / "state dict" / "DeepSpeed checkpoint" / "official
        TSM checkpoint", "path": the file read}``.

    Raises:
        FileNotFoundError, ValueError, tsm_ds.models.weights.CheckpointError: from
        :func:`read_checkpoint` (missing path, not a checkpoint, a file that asks to unpickle code:
        :class:`~tsm_ds.engine.checkpoint.safe_load.UntrustedCheckpointError`, ...; the message names the file).
        RuntimeError: a non-head parameter is missing (wrong arch).
    """
    try:
        contents = read_checkpoint(path, trust=trust)   # a file that says what it is: read as it says
    except NotOfficialNameError:
        if not official_overrides:
            raise
        contents = read_checkpoint(path, official_overrides=official_overrides, trust=trust)   # a renamed official file
    source = {"deepspeed": "DeepSpeed checkpoint", "official": "official TSM checkpoint"}.get(
        contents.source, "tsm_ds export" if contents.model_config else "state dict")
    own = model.state_dict()
    take, skipped = {}, []
    for k, v in contents.state_dict.items():
        if k in own and own[k].shape == v.shape:
            take[k] = v
        elif k in own:
            skipped.append(k)
    missing = [k for k in own if k not in take and k not in skipped]
    if missing:
        cause = wrapper_mismatch_cause(contents.state_dict, own)
        raise RuntimeError(f"{contents.path}: {len(missing)} parameters of this model are not in the checkpoint "
                           f"(first: {missing[:3]}); " + (f"cause: {cause}" if cause else
                                                         "is --arch / --shift the same as the checkpoint's?"))
    model.load_state_dict({**own, **take})
    return {"loaded": len(take), "skipped": skipped, "source": source, "path": str(contents.path)}
