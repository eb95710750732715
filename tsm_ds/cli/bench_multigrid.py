"""``tsm-ds bench multigrid``: the same top-1 for less compute? The base recipe against the same recipe
with the multigrid shape schedule (:mod:`tsm_ds.experiments.multigrid_study`).

Trains TSM-ResNet-18 (T=4, 32 px) on the large-batch study's task, one run after another, every run
``python -m tsm_ds.train``; writes ``multigrid.json`` / ``.md`` into ``--out-dir`` after every run
(and with ``--results-dir`` copies them and ``rows/`` into a tracked folder). Options:
:data:`tsm_ds.config.tools.BENCH_MULTIGRID`; the study's cost is printed by ``--help``
(:data:`tsm_ds.config.tools.MULTIGRID_ESTIMATE`, from the pilot's measured per-step costs).

    tsm-ds bench multigrid --quick --out-dir /tmp/mg     # plumbing only
    OMP_NUM_THREADS=1 nohup nice -n 5 taskset -c 1 tsm-ds bench multigrid --out-dir bench_out/multigrid \\
        --results-dir results/multigrid &                 # the study (resumable: rerun the same line)
    tsm-ds bench multigrid --report-only --out-dir bench_out/multigrid --results-dir results/multigrid
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_MULTIGRID, command_values
from tsm_ds.experiments.multigrid_study.plan import QUICK, MGSettings, check_runs

#: the fields this command uses
COMMAND = BENCH_MULTIGRID


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds bench multigrid`` command line (generated from :data:`COMMAND`; defaults: the full
    study)."""
    return build_parser_for(COMMAND, Config)


def settings_from(cfg: Config) -> MGSettings:
    """The :class:`MGSettings` of a parsed command line: ``--quick``'s or the full study's, with every
    option given replacing its value (``--epochs``, ``--lr-steps``, ``--lr`` (at the base batch),
    ``--multigrid``, ``--precise-bn-batches``, ``--seeds``, ``--epoch-factors``)."""
    b, sch = cfg.bench_multigrid, cfg.schedule
    base = QUICK if b.quick else MGSettings()
    over: dict = {}
    if sch.epochs is not None:
        over["epochs"] = int(sch.epochs)
    if sch.lr_steps is not None:
        over["lr_steps"] = tuple(float(x) for x in sch.lr_steps)
    if sch.lr is not None:
        over["lr"] = float(sch.lr)
    if sch.precise_bn_batches is not None:
        over["precise_bn_batches"] = int(sch.precise_bn_batches)
    if b.seeds is not None:
        over["seeds"] = tuple(b.seeds)
    if b.epoch_factors is not None:
        over["epoch_factors"] = tuple(b.epoch_factors)
    over["mode"] = sch.multigrid
    return dataclasses.replace(base, **over)


def main(argv: list[str] | None = None) -> int:
    """Run the study (or, with ``--report-only``, report the runs recorded so far). Returns 0; 1 when a
    run failed; 2 for bad options.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    b = cfg.bench_multigrid
    try:
        settings = settings_from(cfg)
        if settings.mode == "none":
            raise ValueError("--multigrid none: the study compares a schedule with the base; give long, short or "
                             "long+short")
        settings.check()
        check_runs(settings, b.runs)
    except ValueError as e:
        print(f"tsm-ds bench multigrid: {e}", file=sys.stderr)
        return 2
    from tsm_ds.experiments.multigrid_study.study import run_study

    res = run_study(b.out_dir, settings, overwrite=b.overwrite, keep_checkpoints=b.keep_checkpoints,
                    report_only=b.report_only, results_dir=b.results_dir, record=command_values(COMMAND, cfg),
                    only=b.runs, log=lambda s: print(s, flush=True))
    print("\n" + res["markdown"], flush=True)
    print(f"wrote {res['json']}, {res['md']}" + (f"; copied to {b.results_dir}" if res["published"] else ""),
          flush=True)
    failed = sorted(r["name"] for r in res["rows"] if r["status"] != "completed")
    if failed:
        print(f"tsm-ds bench multigrid: {len(failed)} run(s) did not complete: {', '.join(failed)}; see "
              f"{b.out_dir}/logs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
