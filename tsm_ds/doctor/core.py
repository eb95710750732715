"""The doctor's frame: settings, the run context, the one section schema, the section list, the run.

A section is a function ``run(ctx, results) -> dict`` registered as a :class:`Section`. It gets
the :class:`Context` (settings, rank / world size, device, cores, progress) and the results of
the sections before it (``{name: section dict}``), and returns one section dict built with
:func:`section_result` (the schema below). The runner times it, turns an exception into a
``failed`` section (the other sections still run), and under the ``deepspeed`` launcher runs it on
rank 0 only (``ranks="rank0"``, the others wait at a barrier) or on every rank (``ranks="all"``,
for collectives and per-device measurements done at the same time; rank 0's dict is kept).

Section dict (every section, one JSON schema)::

    {"name": "compute", "title": "Compute", "status": "ok" | "failed" | "not_measured" | "skipped",
     "seconds": 12.3,                  # wall time of the section
     "summary": "one line for a person",
     "values": {"clips_per_s": 3.2, ...},   # flat: numbers, strings, booleans, None; what the
                                            # verdict and the tests read (ratios live here); the
                                            # verdict's "advice" list is the one nested value
     "rows": [{...}, ...],            # flat dicts: the section's table
     "notes": ["..."],                # caveats, how to measure what was not measured
     "error": None | "ExceptionType: message"}

``failed`` means a check failed (the command exits 1); ``not_measured`` says why and how to
measure it in ``notes`` (communication at world size 1); ``skipped`` is a section that does not
apply (``--only``, no data).

Extension point (the cluster section of issue 15 is meant to be added this way): write
``tsm_ds/doctor/cluster.py`` with ``def run(ctx, results) -> dict`` returning
``section_result("cluster", ...)``, then add to :data:`tsm_ds.doctor.SECTIONS`, before the
verdict, ``Section("cluster", "Cluster", cluster.run, enabled=lambda s: bool(s.extra.get("hostfile")))``;
the command passes ``--hostfile`` in ``DoctorSettings.extra``. Reports (JSON, markdown, the plot)
render any section from the schema alone; the verdict reads the sections it knows by name.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from tsm_ds.utils.node import default_recipe, usable_cores

__all__ = ["STATUSES", "DoctorSettings", "Context", "Section", "Progress", "section_result",
           "run_sections", "cores_available"]

_LOG = logging.getLogger(__name__)

#: the values a section's ``status`` takes
STATUSES = ("ok", "failed", "not_measured", "skipped")


@dataclass
class DoctorSettings:
    """What the user asked for (``tsm-ds doctor`` flags); None means "the default for this device".

    Attributes:
        data: a data folder as training's ``--data`` takes it (None: ``$TSM_DS_DATA``, then
            ../shared/data/videos; no data: the data section is skipped).
        recipe: engine JSON by name or path (None: ``cpu_fp32`` on CPU, ``gpu_fp16`` on CUDA, as
            training); its precision is the one compute is measured at.
        arch, num_segments, img_size: the model (None: resnet50, 8, 224; ``quick``: resnet18, 8, 64).
        micro_batch: clips per device per step (None: the recipe's fixed micro-batch, else 8 on
            CUDA, 2 on CPU; ``quick``: 1 on CPU).
        num_classes: classifier rows (400, Kinetics).
        channels_last / compile: also measure compute with ``torch.channels_last`` memory format
            (model and input) / ``torch.compile``.
        precisions: more precisions to measure compute at (``fp32``, ``bf16``, ``fp16``,
            ``autocast_bf16``), besides the recipe's.
        workers: DataLoader worker counts to measure (None: 0, 1, 2, 4, ... up to the cores per device).
        reencode_clips: clips re-encoded with ``tsm-ds prepare`` for the measured advice (0: off).
        short_side, keyint: the re-encoding's options (``tsm-ds prepare --short-side --keyint``).
        comm_methods: all-reduce variants under the launcher (``bench.comm.METHODS`` names).
        recipes: run the recipe smoke section; recipe_names: only these recipes;
            recipe_steps: optimizer steps per recipe; recipe_arch: the smoke's (small) model.
        quick: short time boxes and small defaults (tests): about a minute on a 2-core CPU.
        only: run only these sections (names), None: the default ones.
        out: output folder (doctor.json, doctor.md, doctor.png).
        extra: options of sections added later (``{"hostfile": ...}``), passed through.
    """
    data: str | None = None
    recipe: str | None = None
    arch: str | None = None
    num_segments: int | None = None
    img_size: int | None = None
    micro_batch: int | None = None
    num_classes: int = 400
    channels_last: bool = False
    compile: bool = False
    precisions: tuple[str, ...] = ()
    workers: tuple[int, ...] | None = None
    reencode_clips: int | None = None
    short_side: int = 256
    keyint: int = 16
    comm_methods: tuple[str, ...] = ("fp32", "bf16", "onebit")
    recipes: bool = False
    recipe_names: tuple[str, ...] | None = None
    recipe_steps: int = 3
    recipe_arch: str = "resnet18"
    quick: bool = False
    only: tuple[str, ...] | None = None
    out: str = "doctor_out"
    extra: dict[str, Any] = field(default_factory=dict)

    def resolved(self, cuda: bool) -> "DoctorSettings":
        """A copy with every None default filled for a CUDA (``cuda``) or CPU device."""
        s = DoctorSettings(**asdict(self))
        s.arch = s.arch or ("resnet18" if s.quick else "resnet50")
        s.num_segments = s.num_segments or 8
        s.img_size = s.img_size or (64 if s.quick else 224)
        s.recipe = s.recipe or default_recipe("cuda" if cuda else "cpu")   # training's default
        if s.reencode_clips is None:
            s.reencode_clips = 1 if s.quick else 3
        return s

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values."""
        return asdict(self)


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask), at least 1 (:func:`tsm_ds.utils.node.usable_cores`)."""
    return usable_cores()


class Progress:
    """A progress bar over the sections: tqdm on stderr when importable, else one stderr line per
    step. ``enabled=False`` (other ranks, ``--no-progress``) prints nothing.

    ``start(total)``, ``step(text)`` (the section now running), ``note(text)`` (what it is
    measuring), ``close()``.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._bar = None
        self._done = 0
        self._total = 0
        self._label = ""

    def start(self, total: int) -> None:
        """Open the bar for ``total`` sections."""
        self._total = total
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # the plain line below
            return
        self._bar = tqdm(total=total, desc="doctor", unit="section", file=sys.stderr,
                         bar_format="{desc}: {n_fmt}/{total_fmt} |{bar:20}| {elapsed} {postfix}")

    def step(self, label: str) -> None:
        """A new section starts (the previous one is complete)."""
        if self._label:
            self._done += 1
            if self._bar is not None:
                self._bar.update(1)
        self._label = label
        self.note("")

    def note(self, text: str) -> None:
        """What the running section measures now."""
        if not self.enabled:
            return
        line = f"{self._label}: {text}" if text else self._label
        if self._bar is not None:
            self._bar.set_postfix_str(line, refresh=True)
        else:
            print(f"doctor [{self._done}/{self._total}] {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Count the last section as done and close the bar."""
        if self._label:
            self._done += 1
            if self._bar is not None:
                self._bar.update(1)
            self._label = ""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@dataclass
class Context:
    """What every section gets besides the results before it.

    Attributes:
        settings: :class:`DoctorSettings`, defaults filled (:meth:`DoctorSettings.resolved`).
        rank, world: this process's rank and the world size (1 without the launcher).
        local_world: ranks on this machine (devices in use here).
        cuda: a CUDA device is used.
        cores: CPU cores this process may use; cores_per_device: cores / local ranks (>= 1).
        out: the output folder (created).
        progress: :class:`Progress`; log: progress lines (the command's stderr or a logger).
        shared: objects a section hands on to later ones (the compute section's warmed
            ``train_step``, which the data section's pipeline reuses).
    """
    settings: DoctorSettings
    rank: int = 0
    world: int = 1
    local_world: int = 1
    cuda: bool = False
    cores: int = 1
    cores_per_device: int = 1
    out: Path = Path("doctor_out")
    progress: Progress = field(default_factory=lambda: Progress(False))
    log: Callable[[str], Any] = _LOG.info
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self):
        """The torch device measured on: ``cuda:<local rank>`` or ``cpu``."""
        import torch
        if self.cuda:
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")

    def budget(self, what: str) -> float:
        """Seconds one measurement may take (quick: a tenth of the full time box), by kind:
        ``compute`` (all compute variants together), ``loader`` (one worker count),
        ``pipeline``, ``reencode`` (the timed comparison)."""
        full = {"compute": 45.0, "loader": 12.0, "pipeline": 30.0, "reencode": 20.0}[what]
        return full / 10.0 if self.settings.quick else full


def section_result(name: str, *, title: str | None = None, status: str = "ok", summary: str = "",
                   values: dict[str, Any] | None = None, rows: list[dict[str, Any]] | None = None,
                   notes: list[str] | None = None, error: str | None = None,
                   seconds: float | None = None) -> dict[str, Any]:
    """One section dict in the doctor's schema (module docstring).

    Raises:
        ValueError: ``status`` is not one of :data:`STATUSES`.
    """
    if status not in STATUSES:
        raise ValueError(f"section {name}: status {status!r} is not one of {STATUSES}")
    return {"name": name, "title": title or name.capitalize(), "status": status, "seconds": seconds,
            "summary": summary, "values": dict(values or {}), "rows": list(rows or []),
            "notes": list(notes or []), "error": error}


@dataclass(frozen=True)
class Section:
    """A doctor section: its name (JSON key, ``--only`` name), title, function, who runs it.

    Attributes:
        name, title: identifiers for JSON / ``--only`` and the markdown heading.
        run: ``run(ctx, results) -> section dict`` (:func:`section_result`).
        ranks: ``"rank0"`` (others wait at a barrier) or ``"all"`` (every rank, at once).
        enabled: ``enabled(settings) -> bool``: part of a run without ``--only`` (default: always).
    """
    name: str
    title: str
    run: Callable[[Context, dict[str, dict[str, Any]]], dict[str, Any]]
    ranks: str = "rank0"
    enabled: Callable[[DoctorSettings], bool] = lambda s: True


def _barrier(ctx: Context) -> None:
    if ctx.world > 1:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.barrier()


def run_sections(ctx: Context, sections: list[Section]) -> dict[str, dict[str, Any]]:
    """Run ``sections`` in order; returns ``{name: section dict}`` (rank 0's on every rank).

    A section is run when ``ctx.settings.only`` names it, or (no ``only``) when its ``enabled``
    says so; the others are not in the result. An exception inside a section becomes a
    ``failed`` section with the error and the last traceback line; later sections still run.

    Raises:
        ValueError: ``only`` names a section that does not exist (the message lists them).
    """
    only = ctx.settings.only
    names = [s.name for s in sections]
    if only:
        bad = [n for n in only if n not in names]
        if bad:
            raise ValueError(f"unknown section(s) {bad}; the sections are {', '.join(names)}")
        todo = [s for s in sections if s.name in only]
    else:
        todo = [s for s in sections if s.enabled(ctx.settings)]
    results: dict[str, dict[str, Any]] = {}
    ctx.progress.start(len(todo))
    try:
        for sec in todo:
            ctx.progress.step(sec.title)
            mine = sec.ranks == "all" or ctx.rank == 0
            t0 = time.perf_counter()
            res = None
            if mine:
                try:
                    res = sec.run(ctx, results)
                except Exception as e:  # a failed check, reported; the other sections still run
                    tb = traceback.extract_tb(e.__traceback__)
                    where = f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
                    res = section_result(sec.name, title=sec.title, status="failed",
                                         summary=f"failed: {type(e).__name__}: {e}"[:300],
                                         error=f"{type(e).__name__}: {e}{where}")
                    _LOG.debug("section %s failed", sec.name, exc_info=True)
            _barrier(ctx)
            if res is not None:
                res["title"] = sec.title
                res["seconds"] = round(time.perf_counter() - t0, 2)
                results[sec.name] = res
    finally:
        ctx.progress.close()
    return results
