"""``tsm-ds doctor``: which of the three bottlenecks (data loading, communication, compute) binds on
this machine and this data, by what factor, and what to change, each change with its measured effect.

Sections, in order (:data:`SECTIONS`; each its own module, one JSON schema: :mod:`.core`):

- ``environment`` (:mod:`.environment`): versions, accelerator, DeepSpeed's op report, cores,
  memory, GPUs, the recipe validated for this device;
- ``compute`` (:mod:`.compute`): training clips/s per device on synthetic input at the recipe's
  precision (and ``--channels-last`` / ``--compile`` / more ``--precisions``);
- ``data`` (:mod:`.data`): loader clips/s on the user's clips for 0..N workers, the workers needed
  per device, a re-encoded sample (``tsm-ds prepare``), the whole pipeline sharing the cores;
- ``communication`` (:mod:`.comm`): the gradient all-reduce under the launcher, fp32 / bf16 / 1-bit;
  "not measured" at world size 1, with the command that measures it;
- ``verdict`` (:mod:`.verdict`): the bound, its factor, the advice (every factor a stored ratio);
- ``recipes`` (:mod:`.recipes`, with ``--recipes``): every shipped recipe for this device trains
  a few steps; ``onebit`` (:mod:`.onebit`, ``--only onebit``): the 1-bit compressor on this
  device's tensors (the GPU proof, ``launch/gpu_check.sh``).

Extension point: a new section is a module with ``run(ctx, results) -> dict``
(:func:`.core.section_result`) and one :class:`.core.Section` line in :data:`SECTIONS` (before
``verdict`` when the verdict should see it); its options travel in ``DoctorSettings.extra``. The
reports render it from the schema. See :mod:`.core` for the schema and the cluster example.

Under the ``deepspeed`` launcher (``deepspeed --num_gpus 2 --module tsm_ds.cli.doctor ...``) every
rank runs :func:`run_doctor`; rank 0 writes the reports.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from tsm_ds.doctor import cluster, comm, compute, data, environment, onebit, recipes, verdict
from tsm_ds.doctor.core import (
    STATUSES,
    Context,
    DoctorSettings,
    Progress,
    Section,
    cores_available,
    run_sections,
    section_result,
)
from tsm_ds.doctor.doctor_report import SCHEMA, build_report, write_report
from tsm_ds.utils.node import threads_per_rank

__all__ = ["SECTIONS", "SCHEMA", "STATUSES", "DoctorSettings", "Context", "Progress", "Section",
           "section_result", "run_doctor"]

#: every section, in run order; ``enabled`` says which run without ``--only``
SECTIONS: list[Section] = [
    Section("environment", "Environment", environment.run),
    Section("compute", "Compute", compute.run, ranks="all"),
    Section("data", "Data", data.run),
    Section("communication", "Communication", comm.run, ranks="all"),
    Section("recipes", "Recipes", recipes.run, ranks="all", enabled=lambda s: s.recipes),
    Section("onebit", "1-bit compressor on this device", onebit.run, enabled=lambda s: False),
    Section("cluster", "Cluster", cluster.run, enabled=lambda s: bool(s.extra.get("hostfile"))),
    Section("verdict", "Verdict", verdict.run, enabled=lambda s: not s.recipes),
]


def run_doctor(settings: DoctorSettings, *, progress: bool = True, log: Callable[[str], Any] | None = None,
               sections: list[Section] | None = None) -> tuple[dict[str, Any] | None, dict[str, Path]]:
    """Measure, decide, write the reports.

    Starts alone (world size 1) or under a launcher (``WORLD_SIZE`` > 1: the process group is
    joined, each rank gets its share of the cores). ``--recipes`` alone runs the environment and
    recipes sections (the measurements and the verdict need no recipe smoke).

    Args:
        settings: what to measure (:class:`DoctorSettings`; None fields get this device's defaults).
        progress: a progress bar on stderr (rank 0).
        log: progress lines; sections: override :data:`SECTIONS` (tests, added sections).

    Returns:
        (the ``doctor.json`` payload, {"json", "md", "png": paths}) on rank 0; (None, {}) on the others.

    Raises:
        ValueError: ``settings.only`` names an unknown section.
        ConfigError: the recipe cannot be read (missing file, bad JSON).
    """
    import torch

    from tsm_ds.engine.comm.dist import init_distributed, set_accelerator_env, set_threads

    set_accelerator_env()
    world = int(os.environ.get("WORLD_SIZE") or 1)
    rank = 0
    if world > 1:
        set_threads()
        rank, world = init_distributed()
    local = int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 1)
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"
    s = settings.resolved(cuda)
    if s.recipes and not s.only:
        s.only = ("environment", "recipes")
    cores = cores_available()
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(settings=s, rank=rank, world=world, local_world=local, cuda=cuda, cores=cores,
                  cores_per_device=threads_per_rank(cores, local), out=out,
                  progress=Progress(progress and rank == 0), log=log or (lambda line: None))
    results = run_sections(ctx, sections if sections is not None else SECTIONS)
    if rank != 0:
        return None, {}
    report = build_report(s.as_dict(), results)
    return report, write_report(report, out)
