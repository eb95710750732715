"""The components a training run gets by default (:func:`default_hooks`): the stop signal, the hang
watchdog, the TensorBoard monitor, the validation cadence, and the test hooks and step callback its
settings ask for; each one is a :class:`tsm_ds.engine.loop.hooks.TrainHook` handed to the trainer when it
is built, and each is built from its own section of the run's tree."""
from __future__ import annotations

import os

from tsm_ds.engine.guards.preempt import StopSignal
from tsm_ds.engine.guards.watchdog import Watchdog
from tsm_ds.engine.loop.cadence import EvalCadence
from tsm_ds.engine.loop.hooks import (
    BestModel,
    CheckpointCadence,
    Hooks,
    NanInjection,
    SignalSelf,
    StepCallback,
    TrainHook,
)
from tsm_ds.engine.loop.monitor import Monitor
from tsm_ds.engine.loop.settings import TrainSettings

__all__ = ["default_hooks", "stop_signals"]


def stop_signals(name: str) -> tuple[str, ...]:
    """The signal names of ``--stop-signal`` (``"none"``: no signal; else the name, upper case)."""
    return () if name.lower() == "none" else (name.upper(),)


def default_hooks(s: TrainSettings, *, extra: tuple[TrainHook, ...] = ()) -> Hooks:
    """The run's components from its settings' sections (``c = s.config``), in calling order.

    - :class:`~tsm_ds.engine.guards.preempt.StopSignal` of ``c.distributed.stop_signal`` (save and stop, exit 75);
    - :class:`~tsm_ds.engine.guards.watchdog.Watchdog` with ``c.distributed.step_timeout`` / ``startup_timeout``
      (rank and world size from the launcher's ``RANK`` / ``WORLD_SIZE`` until set-up knows them);
    - :class:`~tsm_ds.engine.loop.monitor.Monitor` (TensorBoard scalars on rank 0);
    - :class:`~tsm_ds.engine.loop.cadence.EvalCadence` of ``c.schedule.eval_every`` (when to validate);
    - :class:`~tsm_ds.engine.loop.hooks.CheckpointCadence` of ``c.output.save_every_steps`` (when to save);
    - :class:`~tsm_ds.engine.loop.hooks.BestModel` (which validation exports ``best_model.pt``);
    - :class:`~tsm_ds.engine.loop.hooks.NanInjection` when ``c.debug.inject_nan_at_step`` is set (test hook);
    - :class:`~tsm_ds.engine.loop.hooks.StepCallback` of ``s.step_callback`` when set;
    - :class:`~tsm_ds.engine.loop.hooks.SignalSelf` when ``c.debug.inject_signal_at_step`` is set and a stop
      signal is on (test hook: that rank signals itself after that step);
    - ``extra``.
    """
    c = s.config
    dist_cfg, dbg, signals = c.distributed, c.debug, stop_signals(c.distributed.stop_signal)
    hooks: list[TrainHook] = [
        StopSignal(signals),
        Watchdog(s.run_dir, rank=int(os.environ.get("RANK", "0")),
                 world_size=int(os.environ.get("WORLD_SIZE", "0")) or None,
                 step_timeout=dist_cfg.step_timeout, startup_timeout=dist_cfg.startup_timeout,
                 test_hang=dbg.test_hang),
        Monitor(),
        EvalCadence(c.schedule.eval_every),
        CheckpointCadence(c.output.save_every_steps),
        BestModel(),
    ]
    if dbg.inject_nan_at_step is not None:
        hooks.append(NanInjection(dbg.inject_nan_at_step, dbg.inject_nan_rank))
    if s.step_callback is not None:
        hooks.append(StepCallback(s.step_callback))
    if dbg.inject_signal_at_step is not None and signals:
        hooks.append(SignalSelf(dbg.inject_signal_at_step, dbg.inject_signal_rank, signals[0]))
    return Hooks([*hooks, *extra])
