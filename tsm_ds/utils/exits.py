"""Exit statuses of training (``tsm_ds.train``) and the launch scripts: one table, no torch.

The engine raises; :mod:`tsm_ds.cli.train` turns each failure into one of these statuses; the
launch scripts read them through ``python -m tsm_ds.cli.launch_helper exit-code NAME`` (the SLURM
script's requeue on :data:`EXIT_PREEMPTED`) and explain a launcher's status with
``explain-exit CODE``. The launcher passes the ranks' status on, except DeepSpeed's multi-host
launcher, whose status is pdsh's (:func:`describe` says what 255 means).
"""
from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_CONFIG", "EXIT_DIVERGED", "EXIT_SAVE_FAILED", "EXIT_RENDEZVOUS", "EXIT_HUNG",
           "EXIT_DATA_LOSS", "EXIT_PREEMPTED", "EXIT_CODES", "MEANINGS", "describe"]

#: the run finished
EXIT_OK = 0
#: a configuration, data or resume error (the message names the option or file)
EXIT_CONFIG = 2
#: the divergence guard stopped the run before a non-finite update (``tsm_ds.engine.guards.divergence``)
EXIT_DIVERGED = 3
#: a checkpoint could not be written (``tsm_ds.engine.checkpoint.manager.CheckpointSaveError``)
EXIT_SAVE_FAILED = 4
#: not every rank joined within ``--dist-timeout`` (``tsm_ds.engine.comm.rendezvous``)
EXIT_RENDEZVOUS = 5
#: a rank made no progress within ``--step-timeout`` / ``--startup-timeout`` (``tsm_ds.engine.guards.watchdog``)
EXIT_HUNG = 6
#: more files of a split were unreadable than ``--max-bad-fraction`` allows
#: (``tsm_ds.data.bad_videos.DataLossError``); not requeued: the data needs fixing
EXIT_DATA_LOSS = 7
#: the stop signal (SLURM's time-limit warning) made every rank save and stop: resume with
#: ``--resume auto`` (EX_TEMPFAIL of sysexits.h; ``tsm_ds.engine.guards.preempt``)
EXIT_PREEMPTED = 75

#: name -> status, the names ``launch_helper exit-code`` takes
EXIT_CODES: dict[str, int] = {"ok": EXIT_OK, "config": EXIT_CONFIG, "diverged": EXIT_DIVERGED,
                              "save_failed": EXIT_SAVE_FAILED, "rendezvous": EXIT_RENDEZVOUS, "hung": EXIT_HUNG,
                              "data_loss": EXIT_DATA_LOSS, "preempted": EXIT_PREEMPTED}

#: status -> what it means, for a person
MEANINGS: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_CONFIG: "a configuration, data or resume error: the rank's log names the option or file",
    EXIT_DIVERGED: "the run diverged: the divergence guard stopped it before the update (nothing non-finite saved)",
    EXIT_SAVE_FAILED: "a checkpoint could not be written (disk full or not writable); latest still names the "
                      "previous checkpoint",
    EXIT_RENDEZVOUS: "not every rank joined within --dist-timeout: the message names the missing ranks and hosts",
    EXIT_HUNG: "a rank made no progress within --step-timeout / --startup-timeout: stacks in <run>/stacks/",
    EXIT_DATA_LOSS: "more files were unreadable than --max-bad-fraction allows: the log and result.json name "
                    "the count, the fraction and the files",
    EXIT_PREEMPTED: "the stop signal made every rank save a checkpoint and stop: continue with --resume auto",
}


def describe(code: int) -> str:
    """What an exit status of training or of a launcher means, in one line.

    Args:
        code: the exit status (0-255 as a shell sees it; a negative value is Python's
            ``-signal`` of a killed child).

    Returns:
        The meaning of a status of :data:`MEANINGS`; for the others, what produces them here:
        1 (an uncaught Python error: the traceback is in the rank's log), 255 (pdsh, the status of
        DeepSpeed's multi-host launcher, when ssh could not reach a host or a remote command was
        killed: the ranks' own statuses are pdsh's ``ssh exited with exit code N`` lines), 128 + N
        (killed by signal N), else "not a status tsm_ds sets".
    """
    if code in MEANINGS:
        return MEANINGS[code]
    if code == 1:
        return "an error without a status of its own (a Python traceback): see the rank's log"
    if code == 255:
        return ("pdsh's status (DeepSpeed's multi-host launcher): ssh could not reach a host, or a remote "
                "command was killed; the ranks' own statuses are pdsh's 'ssh exited with exit code N' lines")
    if code < 0:
        code = 128 - code
    if 128 < code < 128 + 65:
        import signal

        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"killed by {name} (128 + {code - 128})"
    return "not a status tsm_ds sets: see the launcher's output"
