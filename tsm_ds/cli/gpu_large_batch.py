"""``launch/gpu_large_batch.sh``'s entry point: the large-batch study on one GPU
(:func:`tsm_ds.experiments.large_batch.gpu.main`). The script turns its flags into ``KEY=VALUE``
words (:data:`tsm_ds.experiments.large_batch.gpu.MAIN_KEYS`); no option is declared here.

    python -m tsm_ds.cli.gpu_large_batch mode=smoke out=DIR workers=16
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run :func:`tsm_ds.experiments.large_batch.gpu.main` with the ``KEY=VALUE`` words of ``argv``.
    Returns its status; 2 for a word that is not one of its keywords."""
    from tsm_ds.experiments.large_batch.gpu import kwargs_of
    from tsm_ds.experiments.large_batch.gpu import main as run

    try:
        kw = kwargs_of(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"gpu_large_batch: {e}", file=sys.stderr)
        return 2
    return run(**kw)


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
