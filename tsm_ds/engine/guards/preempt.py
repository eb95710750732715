"""Save and stop on a signal: SLURM's warning before the time limit (``--signal=USR1@120``).

The handler only sets a flag; the trainer reads it at the next optimizer-step boundary, where it
sums the flags of all ranks with the step's statistics (one all-reduce it does anyway), so every
rank sees the same answer at the same step even when the signal reached them at different times.
Then every rank saves the checkpoint of that step (mid-epoch positions included) and the run ends
with :data:`EXIT_PREEMPTED`; ``launch/slurm_train.sbatch`` requeues the job and the new job
continues with ``--resume auto``.

Under the ``deepspeed`` launcher the launcher processes must not die of the signal themselves:
the launch scripts start them with USR1 ignored (``trap '' USR1``), which they inherit, and this
module installs its handler explicitly in the ranks.
"""
from __future__ import annotations

import signal

from tsm_ds.engine.loop.hooks import TrainHook

# EXIT_PREEMPTED (75): the exit status of a run stopped by the signal after saving (sysexits'
# EX_TEMPFAIL: "try again")
from tsm_ds.utils.exits import EXIT_PREEMPTED

__all__ = ["EXIT_PREEMPTED", "Preempted", "StopSignal"]


class Preempted(Exception):
    """The run saved a checkpoint and stopped because a stop signal arrived.

    Attributes:
        step: optimizer step of the checkpoint; tag: its tag; signal_name: e.g. ``"SIGUSR1"``.
    """

    def __init__(self, step: int, tag: str, signal_name: str):
        self.step, self.tag, self.signal_name = int(step), tag, signal_name
        super().__init__(f"{signal_name}: saved checkpoint {tag} (optimizer step {step}) and stopped; "
                         f"continue with --resume auto (exit status {EXIT_PREEMPTED})")


class StopSignal(TrainHook):
    """A flag set by a signal handler (default SIGUSR1).

    Args:
        signals: names of the signals to catch (``"SIGUSR1"``); ``()`` catches none.

    Attributes:
        received: the name of the first signal received, or None.

    Install with :meth:`install` (main thread only, as Python requires); :meth:`restore` puts the
    previous handlers back.
    """

    def __init__(self, signals: tuple[str, ...] = ("SIGUSR1",)):
        self.signals = tuple(signals)
        self.received: str | None = None
        self._old: dict = {}

    def _handler(self, signum, frame):   # async-signal context: set the flag only
        if self.received is None:
            self.received = signal.Signals(signum).name

    def install(self) -> "StopSignal":
        """Catch the signals (a no-op outside the main thread, where Python cannot)."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self.signals:
            sig = getattr(signal, name)
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        """Put the handlers back as they were before :meth:`install`."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    # ---- the trainer's hook interface (tsm_ds.engine.loop.hooks)
    def on_setup_start(self, run_dir) -> None:
        """Catch the signals from set-up on."""
        self.install()

    def stop_requested(self) -> str | None:
        """The signal's name once one arrived (the run saves at this step and stops), else None."""
        return self.received

    def on_end(self) -> None:
        """Put the previous handlers back."""
        self.restore()

    @property
    def flag(self) -> float:
        """1.0 once a signal arrived, else 0.0 (summed over ranks with the step's statistics)."""
        return 1.0 if self.received else 0.0
