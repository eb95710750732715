"""The components a training run gets by default (:func:`default_hooks`): the stop signal, the hang
watchdog, the TensorBoard monitor, the validation cadence, and the test hooks and step callback its
settings ask for; each one is a :class:`tsm_ds.engine.loop.hooks.TrainHook` handed to the trainer when it
is built."""
from __future__ import annotations

import os

from tsm_ds.engine.guards.preempt import StopSignal
from tsm_ds.engine.guards.watchdog import Watchdog
from tsm_ds.engine.loop.cadence import EvalCadence
from tsm_ds.engine.loop.hooks import Hooks, NanInjection, StepCallback, TrainHook
from tsm_ds.engine.loop.monitor import Monitor
from tsm_ds.engine.loop.settings import TrainSettings

__all__ = ["default_hooks"]


def default_hooks(s: TrainSettings, *, extra: tuple[TrainHook, ...] = ()) -> Hooks:
    """The run's components from its settings, in calling order.

    - :class:`~tsm_ds.engine.guards.preempt.StopSignal` of ``s.stop_signals`` (save and stop, exit 75);
    - :class:`~tsm_ds.engine.guards.watchdog.Watchdog` with ``s.step_timeout`` / ``s.startup_timeout`` (rank and
      world size from the launcher's ``RANK`` / ``WORLD_SIZE`` until set-up knows them);
    - :class:`~tsm_ds.engine.loop.monitor.Monitor` (TensorBoard scalars on rank 0);
    - :class:`~tsm_ds.engine.loop.cadence.EvalCadence` of ``s.eval_every`` (when to validate);
    - :class:`~tsm_ds.engine.loop.hooks.NanInjection` when ``s.inject_nan_step`` is set (test hook);
    - :class:`~tsm_ds.engine.loop.hooks.StepCallback` of ``s.step_callback`` when set;
    - ``extra`` (e.g. :class:`~tsm_ds.engine.loop.hooks.SignalSelf`, the stop-signal test hook).
    """
    hooks: list[TrainHook] = [
        StopSignal(tuple(s.stop_signals)),
        Watchdog(s.run_dir, rank=int(os.environ.get("RANK", "0")),
                 world_size=int(os.environ.get("WORLD_SIZE", "0")) or None,
                 step_timeout=s.step_timeout, startup_timeout=s.startup_timeout, test_hang=s.test_hang),
        Monitor(),
        EvalCadence(s.eval_every),
    ]
    if s.inject_nan_step is not None:
        hooks.append(NanInjection(s.inject_nan_step, s.inject_nan_rank))
    if s.step_callback is not None:
        hooks.append(StepCallback(s.step_callback))
    return Hooks([*hooks, *extra])
