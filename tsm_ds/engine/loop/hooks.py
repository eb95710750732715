"""The trainer's one hook interface: components that watch or steer a run without the loop knowing
them (the hang watchdog, the stop signal, the TensorBoard monitor, test hooks, callbacks).

A component subclasses :class:`TrainHook` and overrides what it needs; the trainer calls every
hook of its :class:`Hooks` at these points, always with plain values (never the trainer):

- ``on_setup_start(run_dir)``: before set-up (op builds, ``deepspeed.initialize``, resume);
- ``on_setup_end(rank, world)``: the engine exists, the world size is known;
- ``on_loss(loss, step, rank) -> loss``: each micro-batch's loss before backward (fault injection);
- ``on_step(step, info)``: after each optimizer step; ``info``: ``{"metrics", "lrs", "rank", "world",
  "epoch"}``;
- ``on_metrics(values, step)``: scalars to log (``{"train/loss": ...}``, ``{"val/top1": ...}``);
- ``on_progress(what)``: an evaluation batch (``"eval"``) or a checkpoint write (``"checkpoint"``);
- ``on_epoch_end(epoch, step)``: after an epoch's validation;
- ``on_rollback(step)``: a diverged run reloaded the checkpoint of optimizer step ``step``;
- ``validation_due(step, epoch_step, steps_per_epoch) -> bool | None``: asked after each optimizer
  step inside an epoch and at each epoch's end (``epoch_step == steps_per_epoch``): validate now?
  None = no opinion; the first hook with one decides, else every epoch's end (the cadence:
  :class:`tsm_ds.engine.loop.cadence.EvalCadence`). The run's end is validated whatever they say;
- ``checkpoint_due(step, epoch_step, steps_per_epoch) -> bool | None``: asked as ``validation_due``
  (after validation): save now? None = no opinion; the first hook with one decides, else every
  epoch's end (:class:`CheckpointCadence`, ``--save-every-steps``). The run's end, a stop signal
  and a rollback's source are saved whatever they say;
- ``best_due(select_top1, best_top1) -> bool | None``: after each validation: export
  ``best_model.pt``? None = no opinion, else a higher top-1 than the best so far
  (:class:`BestModel`);
- ``stop_requested() -> str | None``: asked once per optimizer step: a reason (e.g. ``"SIGUSR1"``)
  makes the run save at that step and stop (summed over ranks with the step's statistics, so that
  every rank stops at the same step);
- ``on_end()``: the run returned or raised (always called once).
"""
from __future__ import annotations

import os
import signal
from typing import Callable, Iterable, Iterator

import torch

__all__ = ["TrainHook", "Hooks", "CheckpointCadence", "BestModel", "NanInjection", "StepCallback", "SignalSelf"]


class TrainHook:
    """Base of the trainer's components: every method does nothing."""

    def on_setup_start(self, run_dir) -> None:
        """Before set-up."""

    def on_setup_end(self, rank: int, world: int) -> None:
        """After set-up: the rank and world size are known."""

    def on_loss(self, loss: torch.Tensor, step: int, rank: int) -> torch.Tensor:
        """A micro-batch's loss (scalar tensor) of 1-based optimizer step ``step``; returns the loss to use."""
        return loss

    def on_step(self, step: int, info: dict) -> None:
        """After optimizer step ``step`` (1-based)."""

    def on_metrics(self, values: dict, step: int) -> None:
        """Scalars ``{tag: float or None}`` at optimizer step ``step``."""

    def on_progress(self, what: str) -> None:
        """Progress other than a step: ``"eval"`` (a batch) or ``"checkpoint"``."""

    def on_epoch_end(self, epoch: int, step: int) -> None:
        """After an epoch's validation."""

    def on_rollback(self, step: int) -> None:
        """The run rolled back to the checkpoint of optimizer step ``step``."""

    def validation_due(self, step: int, epoch_step: int, steps_per_epoch: int) -> bool | None:
        """Validate after global optimizer step ``step`` (1-based), ``epoch_step`` of the epoch's
        ``steps_per_epoch`` done? None: no opinion."""
        return None

    def checkpoint_due(self, step: int, epoch_step: int, steps_per_epoch: int) -> bool | None:
        """Save a checkpoint after global optimizer step ``step``, ``epoch_step`` of the epoch's
        ``steps_per_epoch`` done? None: no opinion."""
        return None

    def best_due(self, select_top1: float, best_top1: float) -> bool | None:
        """Export ``best_model.pt`` for a validation scoring ``select_top1`` (%) when the best so far
        is ``best_top1`` (-1 before any)? None: no opinion."""
        return None

    def stop_requested(self) -> str | None:
        """A reason once this rank wants the run saved and stopped, else None."""
        return None

    def on_end(self) -> None:
        """The run returned or raised."""


class Hooks(TrainHook):
    """Several hooks called in order (``on_loss`` chains the loss through them)."""

    def __init__(self, hooks: Iterable[TrainHook] = ()):
        self.hooks = [h for h in hooks if h is not None]

    def call(self, name: str, *args) -> None:
        """Call the notification ``name`` (a :class:`TrainHook` method returning None) on every hook,
        in order: the one dispatch of the notifications below."""
        for h in self.hooks:
            getattr(h, name)(*args)

    def on_setup_start(self, run_dir) -> None:
        self.call("on_setup_start", run_dir)

    def on_setup_end(self, rank: int, world: int) -> None:
        self.call("on_setup_end", rank, world)

    def on_loss(self, loss, step, rank):
        for h in self.hooks:
            loss = h.on_loss(loss, step, rank)
        return loss

    def on_step(self, step: int, info: dict) -> None:
        self.call("on_step", step, info)

    def on_metrics(self, values: dict, step: int) -> None:
        self.call("on_metrics", values, step)

    def on_progress(self, what: str) -> None:
        self.call("on_progress", what)

    def on_epoch_end(self, epoch: int, step: int) -> None:
        self.call("on_epoch_end", epoch, step)

    def on_rollback(self, step: int) -> None:
        self.call("on_rollback", step)

    def validation_due(self, step: int, epoch_step: int, steps_per_epoch: int) -> bool:
        """The first hook's opinion; without one, every epoch's end (and only it)."""
        for h in self.hooks:
            due = h.validation_due(step, epoch_step, steps_per_epoch)
            if due is not None:
                return bool(due)
        return epoch_step >= steps_per_epoch

    def checkpoint_due(self, step: int, epoch_step: int, steps_per_epoch: int) -> bool:
        """The first hook's opinion; without one, every epoch's end (and only it)."""
        return self._first("checkpoint_due", epoch_step >= steps_per_epoch, step, epoch_step, steps_per_epoch)

    def best_due(self, select_top1: float, best_top1: float) -> bool:
        """The first hook's opinion; without one, a higher top-1 than the best so far."""
        return self._first("best_due", select_top1 > best_top1, select_top1, best_top1)

    def _first(self, name: str, default: bool, *args) -> bool:
        for h in self.hooks:
            due = getattr(h, name)(*args)
            if due is not None:
                return bool(due)
        return default

    def stop_requested(self) -> str | None:
        reasons = [h.stop_requested() for h in self.hooks]   # every hook asked (none is skipped)
        return next((r for r in reasons if r), None)

    def on_end(self) -> None:
        self.call("on_end")

    def beating(self, items: Iterable, what: str = "eval") -> Iterator:
        """``items`` passed through, with :meth:`on_progress` after each one (evaluation batches)."""
        for item in items:
            yield item
            self.on_progress(what)


class CheckpointCadence(TrainHook):
    """When to save (mmengine's ``CheckpointHook`` ``interval``): every epoch's end, and every
    ``every_steps`` optimizer steps inside an epoch (``--save-every-steps``; 0: epoch ends only).

    Raises:
        ValueError: ``every_steps`` < 0 (names the flag).
    """

    def __init__(self, every_steps: int = 0):
        if every_steps < 0:
            raise ValueError(f"--save-every-steps {every_steps}: give a number of optimizer steps >= 0 (0: epoch "
                             f"ends only)")
        self.every = int(every_steps)

    def checkpoint_due(self, step: int, epoch_step: int, steps_per_epoch: int) -> bool:
        """Due at an epoch's end (``epoch_step >= steps_per_epoch``) or every ``every`` global steps."""
        return epoch_step >= steps_per_epoch or bool(self.every and step % self.every == 0)


class BestModel(TrainHook):
    """Which validation exports ``best_model.pt``: a top-1 (on the capped subset when there is one)
    strictly above the best so far, as the official code's ``is_best = prec1 > best_prec1``
    (mit-han-lab/temporal-shift-module, ``main.py``)."""

    def best_due(self, select_top1: float, best_top1: float) -> bool:
        """``select_top1 > best_top1``."""
        return select_top1 > best_top1


class NanInjection(TrainHook):
    """Test hook: the loss of every micro-batch of optimizer step ``step`` (1-based) becomes NaN on
    rank ``rank`` only, the first time that step runs (not again after a rollback reloads an
    earlier step)."""

    def __init__(self, step: int, rank: int = 0):
        self.step, self.rank, self.done = int(step), int(rank), False

    def on_loss(self, loss, step, rank):
        if step == self.step and rank == self.rank and not self.done:
            return loss * float("nan")
        return loss

    def on_step(self, step: int, info: dict) -> None:
        self.done = self.done or step >= self.step   # that step was applied (its loss finite elsewhere)

    def on_rollback(self, step: int) -> None:
        self.done = True   # the injected divergence was rolled back: not again


class StepCallback(TrainHook):
    """``fn(step, info)`` after every optimizer step (``info`` as :meth:`TrainHook.on_step`)."""

    def __init__(self, fn: Callable[[int, dict], None]):
        self.fn = fn

    def on_step(self, step: int, info: dict) -> None:
        self.fn(step, info)


class SignalSelf(TrainHook):
    """Test hook: rank ``rank`` sends itself ``signal_name`` after optimizer step ``step``."""

    def __init__(self, step: int, rank: int, signal_name: str):
        self.step, self.rank, self.signal_name = int(step), int(rank), signal_name

    def on_step(self, step: int, info: dict) -> None:
        if step == self.step and info["rank"] == self.rank:
            os.kill(os.getpid(), getattr(signal, self.signal_name))
