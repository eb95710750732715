"""``tsm-ds bench models``: throughput, cost and gradient size of TSM against its baselines
(:mod:`tsm_ds.bench.models`). Writes models.json/.md, shift_overhead.* and shift_op.* to ``--out``.

Options: :data:`tsm_ds.config.tools.BENCH_MODELS` (section ``bench_models``, the zoo's
``--img-size`` and ``--num-classes``).
"""
from __future__ import annotations

import argparse
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_MODELS

#: the fields this command uses
COMMAND = BENCH_MODELS


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds bench models`` argument parser (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str] | None = None) -> int:
    """Run the models benchmark; writes models.json/.md, shift_overhead.*, shift_op.* to --out.

    Returns 0, or 2 for an unknown ``--models`` label.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    b = cfg.bench_models
    from tsm_ds.bench.models import run_models_bench, zoo_labels

    models = list(b.models) if b.models else None
    unknown = [m for m in models or () if m not in zoo_labels()]
    if unknown:
        print(f"tsm-ds bench models: unknown --models {unknown}; choose from {','.join(zoo_labels())}",
              file=sys.stderr)
        return 2
    run_models_bench(b.out_dir, img_size=cfg.data.img_size, batch=b.batch, frames=b.frames,
                     video_frames=b.video_frames, reps=b.reps, shift_sizes=list(b.shift_sizes),
                     shift_batch=b.shift_batch, num_classes=cfg.model.num_classes, models=models,
                     skip=list(b.skip), threads=b.threads, quick=b.quick, log=print)
    print(f"reports written to {b.out_dir}/")
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
