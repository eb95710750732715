"""Unreadable videos of a training run counted as distinct files over DataLoader workers and ranks.

:class:`~tsm_ds.data.dataset.VideoClipDataset` replaces an unreadable file by another sample and
names it in the item (``"bad_files"``: a JSON list of ``[path, reason]``; ``"bad"``: how many). Each
DataLoader worker, each epoch's new workers and each rank would see the same file again: counting
``"bad"`` counts *encounters* (a file that fails in every epoch on 8 ranks counts many times) and
warning in the workers repeats one warning per worker. :class:`BadVideoTracker` keeps the files
themselves: the trainer feeds it every batch (:meth:`~BadVideoTracker.add`), sums the number of
files each rank saw for the first time into the step's existing all-reduce
(:meth:`~BadVideoTracker.num_pending`), and only when that sum is not zero do the ranks exchange
the new names (:meth:`~BadVideoTracker.sync`, one ``all_gather_object``): no extra collective in a
step without a new bad file. Rank 0 then warns once per file per run, with its reason; the
distinct count is ``data/bad_videos``, the encounters ``data/bad_video_encounters``. The set is
saved in checkpoints (:meth:`~BadVideoTracker.state_dict`), so a resumed run does not warn again.

A replaced item is data lost. The data-loss budget (``--max-bad-fraction``, default
:data:`DEFAULT_MAX_BAD_FRACTION`) bounds it: :func:`check_data_loss` raises :class:`DataLossError`
when the distinct unreadable files of a split exceed that fraction of the split's files; the
trainer checks it where the tracker syncs (every optimizer step) and after every evaluation,
``tsm-ds eval`` after scoring (exit :data:`tsm_ds.utils.exits.EXIT_DATA_LOSS`). Within the budget
:func:`loss_report` is what ``result.json`` and ``metrics.json`` record.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Mapping

__all__ = ["BadVideoTracker", "parse_bad_files", "DataLossError", "DEFAULT_MAX_BAD_FRACTION", "check_fraction",
           "loss_report", "check_data_loss", "describe_loss", "run_loss_reports"]

#: default data-loss budget: distinct unreadable files / files of the split (1 %)
DEFAULT_MAX_BAD_FRACTION = 0.01
#: files named in reports and messages (all of them are counted)
_NAMED = 20

log = logging.getLogger("tsm_ds.data")


def parse_bad_files(entries: Any) -> dict[str, str]:
    """``{path: reason}`` from an item's or a batch's ``"bad_files"`` value.

    Args:
        entries: one item's string (a JSON list of ``[path, reason]`` pairs, or ``""``), a list or
            tuple of such strings (a batch collated by the default ``collate_fn``), or None.

    Returns:
        path -> reason of every named file (the first reason of a file named twice).
    """
    if entries is None:
        return {}
    texts = [entries] if isinstance(entries, str) else list(entries)
    out: dict[str, str] = {}
    for text in texts:
        for path, reason in (json.loads(text) if text else []):
            out.setdefault(str(path), str(reason))
    return out


class BadVideoTracker:
    """Distinct unreadable files of a run (all workers, all ranks) and their encounters.

    Args:
        datasets: datasets whose own per-process warnings are turned off (their
            ``warn_bad_files`` attribute set to False): the tracker warns instead.
        rank, world_size: this rank and the number of ranks (1: no exchange).
        warn: warn (rank 0 only) once per newly seen file, naming it and the reason.

    Attributes:
        files: path -> reason of every unreadable file of the run known to all ranks (after the
            last :meth:`sync`); ``len(files)`` is the distinct count.
        pending: path -> reason seen on this rank and not yet exchanged.
        encounters: replaced samples of the run on all ranks (the items' ``"bad"``, summed over
            ranks by the caller and passed to :meth:`sync`).
    """

    def __init__(self, *datasets, rank: int = 0, world_size: int = 1, warn: bool = True):
        for ds in datasets:
            if ds is not None and hasattr(ds, "warn_bad_files"):
                ds.warn_bad_files = False
        self.rank, self.world_size, self.warn = int(rank), int(world_size), warn
        self.files: dict[str, str] = {}
        self.pending: dict[str, str] = {}
        self.encounters = 0

    def add(self, batch: Mapping) -> int:
        """Note a batch's unreadable files (``batch["bad_files"]``); returns its encounters (the sum
        of ``batch["bad"]``, 0 when absent), which the caller sums over ranks as before."""
        import torch

        for path, reason in parse_bad_files(batch.get("bad_files")).items():
            if path not in self.files:
                self.pending.setdefault(path, reason)
        return int(torch.as_tensor(batch.get("bad", 0)).sum())

    def num_pending(self) -> int:
        """Files this rank saw that the run did not know yet (to be summed over ranks)."""
        return len(self.pending)

    def sync(self, pending_all_ranks: float, encounters_all_ranks: float = 0) -> tuple[int, int]:
        """Merge every rank's new files; call on every rank after the step's all-reduce.

        Args:
            pending_all_ranks: :meth:`num_pending` summed over ranks. When it is 0 nothing is
                exchanged; otherwise every rank must call this (it runs one
                ``torch.distributed.all_gather_object`` when ``world_size`` > 1).
            encounters_all_ranks: the step's encounters (:meth:`add`'s returns) summed over ranks.

        Returns:
            (distinct unreadable files of the run so far, encounters so far): the same on every rank;
            ``data/bad_videos`` and ``data/bad_video_encounters``.
        """
        self.encounters += int(encounters_all_ranks)
        if pending_all_ranks <= 0:
            return len(self.files), self.encounters
        if self.world_size > 1:
            import torch.distributed as dist

            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, self.pending)
        else:
            gathered = [self.pending]
        new = []
        for part in gathered:
            for path, reason in (part or {}).items():
                if path not in self.files:
                    self.files[path] = reason
                    new.append(path)
        self.pending = {}
        if self.warn and self.rank == 0:
            first = len(self.files) - len(new)
            for j, path in enumerate(new):
                log.warning("unreadable video, replaced by another sample (warned once per run; %d distinct "
                            "so far): %s: %s", first + j + 1, path, self.files[path])
        return len(self.files), self.encounters

    def state_dict(self) -> dict:
        """``{"files": {path: reason}, "encounters": n}`` (for checkpoints)."""
        return {"files": dict(self.files), "encounters": self.encounters}

    def load_state_dict(self, state: Mapping | int | None) -> None:
        """Restore :meth:`state_dict`; files named there are not warned again. None: nothing known
        yet; an int: a checkpoint written before files were tracked (its encounters)."""
        if not isinstance(state, Mapping):
            state = {"encounters": int(state or 0)}
        self.files = dict(state.get("files") or {})
        self.encounters = int(state.get("encounters", 0))
        self.pending = {p: r for p, r in self.pending.items() if p not in self.files}


def check_fraction(max_fraction: float) -> float:
    """``max_fraction`` as a float in [0, 1]; ValueError naming ``--max-bad-fraction`` otherwise."""
    try:
        f = float(max_fraction)
    except (TypeError, ValueError):
        f = float("nan")
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"--max-bad-fraction {max_fraction}: give the share of a split's files that may be "
                         "unreadable, from 0 (any unreadable file stops the run) to 1 (no limit)")
    return f


def loss_report(files: Mapping[str, str], total: int) -> dict:
    """What a run or an evaluation lost, for ``result.json`` / ``metrics.json``.

    Args:
        files: path -> reason of every distinct unreadable file of the split.
        total: files in the split (the denominator of the budget).

    Returns:
        ``{"count": distinct files, "total": total, "fraction": count / total (0.0 for an empty
        split), "files": {path: reason} of every file}``.
    """
    n = len(files)
    return {"count": n, "total": int(total), "fraction": n / total if total else 0.0,
            "files": {str(k): str(v) for k, v in sorted(files.items())}}


def describe_loss(split: str, report: Mapping) -> str:
    """One line: ``"<split>: 3 of 17 files unreadable (17.6 %), replaced: a (why); b (why); ..."``
    (``left out`` for an evaluation split; the first 20 files named), or ``"<split>: no file lost"``."""
    if not report["count"]:
        return f"{split}: no file lost"
    named = list(report["files"].items())
    more = f"; and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
    done = "replaced" if split == "train" else "left out"   # evaluation scores each clip once or not at all
    return (f"{split}: {report['count']} of {report['total']} files unreadable ({100 * report['fraction']:.1f} %), "
            f"{done}: " + "; ".join(f"{p} ({r})" for p, r in named[:_NAMED]) + more)


class DataLossError(RuntimeError):
    """More of a split's files were unreadable than the data-loss budget allows.

    Attributes:
        split: ``"train"`` or ``"val"``; report: :func:`loss_report`; max_fraction: the budget;
        step: the optimizer step where it was found (None outside training).
    """

    def __init__(self, split: str, report: dict, max_fraction: float, step: int | None = None):
        self.split, self.report, self.max_fraction, self.step = split, report, float(max_fraction), step
        super().__init__(self.describe())

    def describe(self) -> str:
        """The message: the count, the fraction, the budget, the first files and what to do."""
        at = f" at step {self.step}" if self.step is not None else ""
        return (f"data loss{at}: {describe_loss(self.split, self.report)}; over the budget "
                f"--max-bad-fraction {self.max_fraction:g} ({100 * self.max_fraction:g} %). Fix or remove the files "
                "(tsm-ds check-videos lists them), or raise --max-bad-fraction to train on what is readable")


def check_data_loss(split: str, files: Mapping[str, str], total: int, max_fraction: float, *,
                    step: int | None = None) -> dict:
    """The :func:`loss_report` of ``files`` among ``total``; raises when it exceeds the budget.

    Args:
        split: ``"train"`` / ``"val"`` (named in the message); files: path -> reason, distinct
            unreadable files of the split on all ranks; total: files in the split;
        max_fraction: the budget in [0, 1] (0: any unreadable file is too many); step: named.

    Raises:
        DataLossError: ``len(files) / total > max_fraction``.
    """
    report = loss_report(files, total)
    if report["count"] and report["fraction"] > max_fraction:
        raise DataLossError(split, report, max_fraction, step)
    return report


def run_loss_reports(train_files: Mapping[str, str], train_total: int, val_lost: Mapping | None = None) -> dict:
    """``{"train": report[, "val": report]}`` (:func:`loss_report`) of a finished run: the tracker's
    training files among ``train_total``, and the last evaluation's ``lost`` (``{"files", "total"}``,
    :func:`tsm_ds.engine.loop.evaluate.gather_predictions`) when there was one."""
    out = {"train": loss_report(train_files, train_total)}
    if val_lost:
        out["val"] = loss_report(val_lost["files"], val_lost["total"])
    return out
