"""Runnable shim: ``deepspeed tsm_ds/train.py ...`` and ``deepspeed --module tsm_ds.train ...``.

The command lives in :mod:`tsm_ds.cli.train` (flags: ``python -m tsm_ds.train --help``). Run as a
file, Python puts this file's folder (``tsm_ds/``) first on ``sys.path``, where ``utils``,
``data``, ``models``... would shadow top-level modules of those names; the shim replaces it with
the folder above, so ``import tsm_ds`` also works from a source checkout that is not installed.
This is the only place in the package that edits ``sys.path``.
"""
import os
import sys

if __name__ == "__main__" and not __package__:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from tsm_ds.cli.train import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
