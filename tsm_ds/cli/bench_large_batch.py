"""``tsm-ds bench large-batch``: does TSM's accuracy hold as the global batch grows?
(:mod:`tsm_ds.bench.large_batch`)

Trains TSM on the motion demo data at global batches from the base batch up (world size 1, fixed
micro-batch x gradient accumulation, the same clips at every batch) with four recipes: (a) SGD
with the lr swept at the base batch and no scaling, (b) SGD with the linear rule and warm-up,
(c) LARS, (d) LAMB with its square-root rule. Every run is ``python -m tsm_ds.train``. Writes
``large_batch.json`` / ``.md`` / ``.png`` into ``--out-dir``.

    tsm-ds bench large-batch --quick --out-dir /tmp/lb     # plumbing only: 45 s on an idle 2-core CPU
    tsm-ds bench large-batch --out-dir bench_out/large_batch   # the study: 98 min on the shared 2-core CPU
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from tsm_ds.bench.large_batch.grid import QUICK, RECIPES, StudySettings


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds bench large-batch`` command line (defaults: the full study)."""
    d = StudySettings()
    ap = argparse.ArgumentParser(prog="tsm-ds bench large-batch", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", "--out", dest="out_dir", default="bench_out/large_batch",
                    help="output folder (default %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny data and runs: checks batches, accumulation and lrs per run, not accuracy")
    ap.add_argument("--recipes", default=",".join(RECIPES),
                    help="comma-separated subset of the recipes (default %(default)s)")
    ap.add_argument("--batches", type=_ints, default=None,
                    help=f"comma-separated global batches, ascending, the first is the base (default {d.batches})")
    ap.add_argument("--micro-batch", type=int, default=None, help=f"clips per micro-batch (default {d.micro_batch})")
    ap.add_argument("--min-steps", type=int, default=None,
                    help=f"optimizer steps of the largest batch at least (default {d.min_steps})")
    ap.add_argument("--train-per-class", type=int, default=None,
                    help=f"demo training clips per class (default {d.train_per_class})")
    ap.add_argument("--sgd-lrs", type=_floats, default=None,
                    help=f"SGD lrs swept at the base batch, at most 4 (default {d.sgd_lrs})")
    ap.add_argument("--lars-base-lr", type=float, default=None, help=f"LARS lr at the base batch (default {d.lars_base_lr})")
    ap.add_argument("--lamb-base-lr", type=float, default=None, help=f"LAMB lr at the base batch (default {d.lamb_base_lr})")
    ap.add_argument("--seeds", type=_ints, default=None,
                    help=f"training seeds: all at the base and the largest batch, the first elsewhere (default {d.seeds})")
    ap.add_argument("--warmup-fraction", type=float, default=None,
                    help=f"linear warm-up, fraction of each run's optimizer steps (default {d.warmup_fraction})")
    ap.add_argument("--parallel", type=int, default=None, help=f"runs at a time (default {d.parallel})")
    ap.add_argument("--threads", type=int, default=None, help=f"OMP threads per run (default {d.threads})")
    ap.add_argument("--no-cache", action="store_true", help="decode clips per access (no train.py --cache-decoded)")
    ap.add_argument("--overwrite", action="store_true", help="rerun runs already recorded in OUT/rows/")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep every run's checkpoints and models")
    return ap


def settings_from(args: argparse.Namespace) -> StudySettings:
    """The :class:`StudySettings` of parsed options: ``--quick``'s or the full study's, with every
    option given replacing its value."""
    base = QUICK if args.quick else StudySettings()
    over = {k: getattr(args, k) for k in ("batches", "micro_batch", "min_steps", "train_per_class", "sgd_lrs",
                                          "lars_base_lr", "lamb_base_lr", "seeds", "warmup_fraction", "parallel",
                                          "threads") if getattr(args, k) is not None}
    if args.no_cache:
        over["cache_decoded"] = False
    return dataclasses.replace(base, **over)


def main(argv: list[str] | None = None) -> int:
    """Run the study. Returns 0; 1 when a run failed (not diverged: a diverged run is a result);
    2 for bad options."""
    args = build_parser().parse_args(argv)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    try:
        settings = settings_from(args)
        settings.check()
        if not recipes or any(r not in RECIPES for r in recipes):
            raise ValueError(f"--recipes {args.recipes!r}: use a subset of {','.join(RECIPES)}")
    except ValueError as e:
        print(f"tsm-ds bench large-batch: {e}", file=sys.stderr)
        return 2
    from tsm_ds.bench.large_batch.study import run_study

    res = run_study(args.out_dir, settings, recipes=recipes, overwrite=args.overwrite,
                    keep_checkpoints=args.keep_checkpoints, record=vars(args), log=lambda s: print(s, flush=True))
    print("\n" + res["markdown"], flush=True)
    print(f"wrote {res['json']}, {res['md']}" + (f", {res['png']}" if res["png"] else ""), flush=True)
    failed = [r["name"] for r in res["rows"] + res["sweep"] if r["status"] == "failed"]
    if failed:
        print(f"tsm-ds bench large-batch: {len(failed)} run(s) failed: {', '.join(sorted(set(failed)))}; "
              f"see {args.out_dir}/logs/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
