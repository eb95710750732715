"""How a command's process ends: :func:`exit_process`, for the entry points only (``tsm-ds``,
``python -m tsm_ds.cli...``, ``tsm_ds/train.py``). Torch-free."""
from __future__ import annotations

import gc
import sys
from typing import NoReturn

__all__ = ["exit_process"]


def exit_process(status: int | None) -> NoReturn:
    """End a command's process with ``status`` (``sys.exit(status)``; None is 0), after
    ``gc.freeze()``: the objects alive now (torch's, DeepSpeed's, the model's) move to the
    collector's permanent generation, so the garbage collections of the interpreter's shutdown do
    not walk them. Measured on the project's 2-core machine (2026-12-05): a process that imported
    DeepSpeed, the trainer, torchvision and PyAV took 0.95 s from its last line to its exit, 0.19 s
    frozen; every rank and every ``tsm-ds`` command paid it.

    Everything else of a normal exit still happens: ``atexit`` handlers (the ranks' /dev/shm
    buffers, logging's flush), ``finally`` blocks and the destructors of objects freed by reference
    count. Objects held only by reference cycles are not collected at exit, which CPython never
    promises anyway: the project closes its files, writers and loaders explicitly. Only for a
    process's entry point (``if __name__ == "__main__"``, the ``tsm-ds`` script), never inside a
    library call: a frozen object stays in memory for the rest of the process.

    Raises:
        SystemExit: always (``status``).
    """
    gc.freeze()
    sys.exit(status)
