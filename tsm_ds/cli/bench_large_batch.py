"""``tsm-ds bench large-batch``: does TSM's accuracy hold as the global batch grows?
(:mod:`tsm_ds.experiments.large_batch`)

Trains TSM on the motion demo data (preset ``hard`` by default) at global batches from the base
batch up (8 / 64 / 512) with four recipes (SGD without and with the linear rule, LARS, LAMB), every
run ``python -m tsm_ds.train``; writes ``large_batch.json`` / ``.md`` / ``.png`` into ``--out-dir``
(and into ``--results-dir``, a tracked folder). Options:
:data:`tsm_ds.config.tools.BENCH_LARGE_BATCH` (section ``bench_large_batch`` and
``--micro-batch-size``).

    tsm-ds bench large-batch --quick --out-dir /tmp/lb     # plumbing only: 45 s on an idle 2-core CPU
    tsm-ds bench large-batch --calibrate-only --out-dir bench_out/large_batch   # part 1: the task's calibration
    tsm-ds bench large-batch --out-dir bench_out/large_batch --results-dir results/large_batch   # the study
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
_SETTINGS = ("batches", "min_steps", "train_per_class", "sgd_lrs", "lars_base_lr", "lamb_base_lr", "seeds",
             "warmup_fraction", "parallel", "threads", "headroom")


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
    """Run the study. Returns 0; 1 when a run failed (not diverged: a diverged run is a result);
    2 for bad options.

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
        if b.calibrate_only and not any(r.startswith("sgd_") for r in recipes):
            raise ValueError("--calibrate-only runs the SGD sweep and the headroom run: keep an SGD recipe")
    except ValueError as e:
        print(f"tsm-ds bench large-batch: {e}", file=sys.stderr)
        return 2
    from tsm_ds.experiments.large_batch.study import run_study

    res = run_study(b.out_dir, settings, recipes=recipes, overwrite=b.overwrite,
                    keep_checkpoints=b.keep_checkpoints, calibrate_only=b.calibrate_only,
                    results_dir=b.results_dir, record=command_values(COMMAND, cfg),
                    log=lambda s: print(s, flush=True))
    print("\n" + res["markdown"], flush=True)
    print(f"wrote {res['json']}, {res['md']}" + (f", {res['png']}" if res["png"] else "")
          + (f"; copied to {b.results_dir}" if res["published"] else ""), flush=True)
    failed = [r["name"] for r in res["rows"] + res["sweep"] + ([res["headroom"]] if res["headroom"] else [])
              if r["status"] == "failed"]
    if failed:
        print(f"tsm-ds bench large-batch: {len(failed)} run(s) failed: {', '.join(sorted(set(failed)))}; "
              f"see {b.out_dir}/logs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
