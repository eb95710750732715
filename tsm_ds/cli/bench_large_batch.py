"""``tsm-ds bench large-batch``: does TSM's accuracy hold as the global batch grows, in the
paper's regime? (:mod:`tsm_ds.experiments.large_batch`)

Trains TSM on the motion demo data (preset ``hard``) at global batches 8 / 64 / 256 with three
recipes ((a) SGD with the linear rule, (b) LARS, (c) LAMB), each stage once the stages it reads have
ended (:func:`tsm_ds.experiments.large_batch.study.run_stages`), every run
``python -m tsm_ds.train``; writes ``large_batch.json`` / ``.md`` / ``.png`` into ``--out-dir``
after every stage (and with ``--results-dir`` copies them and ``rows/`` into a tracked folder).
Options: :data:`tsm_ds.config.tools.BENCH_LARGE_BATCH`.

    tsm-ds bench large-batch --quick --out-dir /tmp/lb     # plumbing only
    nohup nice -n 5 tsm-ds bench large-batch --out-dir bench_out/large_batch_v2 --parallel 2 &   # the study, resumable
    tsm-ds bench large-batch --report-only --out-dir bench_out/large_batch_v2 --results-dir results/large_batch
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_LARGE_BATCH, command_values
from tsm_ds.experiments.large_batch.grid import QUICK, RECIPES, StudySettings

#: the fields this command uses
COMMAND = BENCH_LARGE_BATCH

#: options of the ``bench_large_batch`` section that replace a :class:`StudySettings` value when given
_SETTINGS = ("batches", "min_steps", "train_per_class", "sgd_lrs", "lars_lrs", "lamb_lrs", "seeds",
             "warmup_epochs", "max_micro_batch", "parallel", "threads", "headroom")


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds bench large-batch`` command line (generated from :data:`COMMAND`; defaults: the
    full study)."""
    return build_parser_for(COMMAND, Config)


def settings_from(cfg: Config) -> StudySettings:
    """The :class:`StudySettings` of a parsed command line: ``--quick``'s or the full study's, with
    every option given replacing its value (``--micro-batch-size``: ``schedule.micro_batch_size``;
    ``--difficulty``: every generator field of the preset, and its name)."""
    from tsm_ds.data.synthetic.presets import difficulty_params

    b = cfg.bench_large_batch
    base = QUICK if b.quick else StudySettings()
    over = {k: getattr(b, k) for k in _SETTINGS if getattr(b, k) is not None}
    if b.difficulty is not None:
        over.update(difficulty_params(b.difficulty), difficulty=b.difficulty)
    if cfg.schedule.micro_batch_size is not None:
        over["micro_batch"] = cfg.schedule.micro_batch_size
    if not b.cache:
        over["cache_decoded"] = False
    return dataclasses.replace(base, **over)


def main(argv: list[str] | None = None) -> int:
    """Run the study (or, with ``--report-only``, report the runs recorded so far). Returns 0; 1
    when a run failed (not diverged: a diverged run is a result); 2 for bad options.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    b = cfg.bench_large_batch
    recipes = list(b.recipes)
    try:
        settings = settings_from(cfg)
        settings.check()
        if not recipes or any(r not in RECIPES for r in recipes):
            raise ValueError(f"--recipes {','.join(recipes)!r}: use a subset of {','.join(RECIPES)}")
    except ValueError as e:
        print(f"tsm-ds bench large-batch: {e}", file=sys.stderr)
        return 2
    from tsm_ds.experiments.large_batch.study import run_study

    res = run_study(b.out_dir, settings, recipes=recipes, overwrite=b.overwrite,
                    keep_checkpoints=b.keep_checkpoints, report_only=b.report_only,
                    results_dir=b.results_dir, record=command_values(COMMAND, cfg),
                    log=lambda s: print(s, flush=True))
    print("\n" + res["markdown"], flush=True)
    print(f"wrote {res['json']}, {res['md']}" + (f", {res['png']}" if res["png"] else "")
          + (f"; copied to {b.results_dir}" if res["published"] else ""), flush=True)
    failed = sorted(r["name"] for r in res["rows"] if r["status"] == "failed")
    if failed:
        print(f"tsm-ds bench large-batch: {len(failed)} run(s) failed: {', '.join(failed)}; "
              f"see {b.out_dir}/logs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
