"""Divergence guard: decide, once per optimizer step and the same on every rank, that a run diverged.

A step has diverged when (checked in this order):

1. its loss (mean over the step's micro-batches on all ranks) is not finite;
2. its gradient norm (after the all-reduce, where the trainer sees the reduced gradient) is not
   finite;
3. its loss is far above where a healthy run can be: ``loss > factor x max(running median of the
   last ``window`` healthy step losses, ln(num_classes))``. ``ln(K)`` is the loss of a uniform
   prediction (chance); a run whose loss is ``factor`` times that is confidently wrong on almost
   every clip, which only a blown-up model is. The median keeps a healthy early spike from
   raising the bar; the chance floor keeps a converged run (median 0.01) from firing on one noisy
   batch;
4. the engine skipped its update (fp16 loss-scale overflow, or DeepSpeed's bf16 optimizer finding
   non-finite gradients) ``max_skipped`` steps in a row: a healthy dynamic loss scale recovers in a
   handful of steps;
5. the run is stuck above chance: after the lr warm-up, its loss stayed above
   ``stuck_factor x ln(K)`` for ``stuck_steps`` optimizer steps in a row. Rule 3 misses a loss that
   climbs step by step (the median climbs with it): SGD with the linear lr rule at batch 128 rose
   from 1.4 to 32-35 (ln 4 = 1.39) and stayed there, lr 0.03 at batch 8 drifted to ~10x chance;
   both were at chance for good. A healthy run starts near ``ln(K)`` (a uniform guess) and goes
   down; one step at or below the floor starts the count again. Steps of the warm-up are not
   counted (the loss of a large-lr warm-up may rise for a while and recover).

Rules 1-3 and 5 are decided before the update (the trainer then does not call ``engine.step()``);
rule 4 after it (a skipped step changed nothing). The trainer feeds values that are already reduced
over ranks, so every rank decides the same.

The thresholds are flags of ``tsm_ds/train.py`` (``--divergence-factor``, ``--max-skipped-steps``,
``--stuck-factor``, ``--stuck-steps``); the defaults were chosen not to fire on the quickstart, the
demo (checked on its first steps by the tests) or healthy large-batch runs, whose losses stay within
a few times ``ln(K)``. Rule 5 rather than "a running median frozen above chance": the median of a
stuck run is not frozen but climbing (run (a) above), and the consecutive count needs no notion of
"the first good steps", which a run that climbs from its first step does not have.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable, Sequence

import torch

# EXIT_DIVERGED (3): the exit status of ``tsm_ds.train`` when the guard stopped the run (the run's
# ``result.json`` says ``diverged``; ``tsm-ds bench large-batch`` reports it as a result)
from tsm_ds.utils.exits import EXIT_DIVERGED  # noqa: F401  (re-exported for the large-batch runner)


class DivergenceError(RuntimeError):
    """A diverged run, stopped before its update. Attributes name what the log reports.

    Attributes:
        reason: which rule fired, with the numbers (e.g. ``"loss is nan"``).
        step: the optimizer step that would have been applied (1-based: steps done + 1).
        loss: that step's mean loss over all ranks (may be nan / inf).
        grad_norm: the global gradient norm when the trainer saw it, else None.
        lrs: the per-group learning rates of the step ({group name: lr}).
        last_good: the newest complete checkpoint directory (None when there is none).
        applied: whether the engine had already taken the step's update (rules checked after
            ``engine.step()``; the weights are then never saved).
        context: extra lines for the report (e.g. the rollbacks used).
    """

    def __init__(self, reason: str, *, step: int, loss: float, grad_norm: float | None,
                 lrs: dict[str, float], last_good: str | None, applied: bool = False):
        self.reason, self.step, self.loss, self.grad_norm = reason, step, loss, grad_norm
        self.lrs, self.last_good, self.applied = dict(lrs), last_good, applied
        self.context: list[str] = []
        #: the fixes to suggest (the trainer narrows them to what the run did not already do)
        self.fixes: list[str] = ["a lower --lr (or the recipe's lr)", "a longer --warmup-steps",
                                 "gradient_clipping in the engine JSON",
                                 "--on-divergence rollback to reload the last good checkpoint with a lower lr"]
        super().__init__(reason)

    def __str__(self) -> str:
        return self.describe()

    def narrow_fixes(self, *, clip: float, rollback: bool, has_checkpoint: bool) -> None:
        """Keep only the fixes the run did not already apply: gradient clipping when ``clip`` is 0,
        rollback unless it was asked for; with rollback and no checkpoint, suggest saving more often."""
        drop = {"gradient_clipping in the engine JSON"} if clip > 0 else set()
        if rollback:
            drop.add(self.fixes[-1])
            if not has_checkpoint:
                self.fixes.append("--save-every-steps N so that a rollback has a checkpoint to reload")
        self.fixes = [f for f in self.fixes if f not in drop]
        if clip > 0:
            self.fixes[0] += f" (gradient_clipping is {clip:g} already)"

    def describe(self) -> str:
        """The multi-line report: what, where, the last good checkpoint, the likely fix."""
        lr = ", ".join(f"{k} {v:.3g}" for k, v in self.lrs.items()) or "unknown"
        gn = "not seen (reduced inside DeepSpeed)" if self.grad_norm is None else f"{self.grad_norm:.4g}"
        return (f"training diverged at optimizer step {self.step}: {self.reason}\n"
                f"  loss {self.loss:.4g}, gradient norm {gn}, lr {lr}\n"
                f"  last good checkpoint: {self.last_good or 'none yet'} ("
                + ("the engine had taken the update; " if self.applied else f"the update of step {self.step} was not "
                   "applied; ") + "nothing non-finite was saved)\n"
                + "".join(f"  {line}\n" for line in self.context)
                + "  likely fix: " + "; or ".join(self.fixes))


@dataclass
class GuardSettings:
    """Thresholds of the guard.

    Attributes:
        factor: rule 3's multiple of max(median, ln K); 0 turns rule 3 off.
        window: optimizer steps in the running median (>= 1).
        max_skipped: rule 4's run of consecutive skipped steps; 0 turns rule 4 off.
        stuck_factor: rule 5's floor as a multiple of ln K (the chance loss); 0 turns rule 5 off.
        stuck_steps: rule 5's run of consecutive optimizer steps above the floor (>= 1).

    Raises:
        ValueError: a threshold out of its range (the message names the flag).
    """

    factor: float = 10.0
    window: int = 50
    max_skipped: int = 20
    stuck_factor: float = 3.0
    stuck_steps: int = 20

    @classmethod
    def from_config(cls, g) -> "GuardSettings":
        """The thresholds of the tree's ``guard`` section (:class:`tsm_ds.config.tree.GuardConfig`:
        ``--divergence-factor``, ``--max-skipped-steps``, ``--stuck-factor``, ``--stuck-steps``).
        Raises ValueError as the class."""
        return cls(factor=g.divergence_factor, max_skipped=g.max_skipped_steps, stuck_factor=g.stuck_factor,
                   stuck_steps=g.stuck_steps)

    def __post_init__(self):
        if self.factor < 0 or self.window < 1 or self.max_skipped < 0:
            raise ValueError(f"divergence guard: factor >= 0, window >= 1 and max_skipped >= 0 needed, got "
                             f"factor={self.factor}, window={self.window}, max_skipped={self.max_skipped}")
        if not self.stuck_factor >= 0:
            raise ValueError(f"--stuck-factor {self.stuck_factor}: give a multiple of ln(classes) >= 0 (0: off)")
        if self.stuck_steps < 1:
            raise ValueError(f"--stuck-steps {self.stuck_steps}: give a number of optimizer steps >= 1")


class DivergenceGuard:
    """The per-step decision (see the module docstring).

    Args:
        settings: :class:`GuardSettings`.
        num_classes: K, for the chance loss ln(K) (>= 2).
        warmup_steps: the run's lr warm-up in optimizer steps (:func:`lr_warmup_steps`): rule 5
            counts only the steps after it (0: every step).
    """

    def __init__(self, settings: GuardSettings, num_classes: int, *, warmup_steps: int = 0):
        self.s = settings
        self.chance = math.log(max(2, int(num_classes)))
        self.warmup_steps = max(0, int(warmup_steps))
        self.history: deque[float] = deque(maxlen=settings.window)
        self.skipped_run = 0
        self._last_skipped: int | None = None
        self.stuck_run = 0   # rule 5: consecutive counted steps above the floor

    def threshold(self) -> float:
        """Rule 3's loss limit now (inf when rule 3 is off)."""
        if not self.s.factor:
            return math.inf
        base = median(self.history) if self.history else 0.0
        return self.s.factor * max(base, self.chance)

    def stuck_floor(self) -> float:
        """Rule 5's loss floor, ``stuck_factor x ln K`` (inf when rule 5 is off)."""
        return self.s.stuck_factor * self.chance if self.s.stuck_factor else math.inf

    def before_update(self, loss: float, grad_norm: float | None = None, *, step: int | None = None) -> str | None:
        """Rules 1-3 and 5 for a step's reduced loss and gradient norm (None: not seen).

        Args:
            loss: the step's mean loss over all ranks (nats per clip).
            grad_norm: its global gradient norm, or None when not seen.
            step: the 1-based optimizer step (rule 5 skips the warm-up's steps; None: counted).

        Returns the reason when the step diverged (the history is then left unchanged), else None
        after adding ``loss`` to the running history.
        """
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"gradient norm is {grad_norm}"
        limit = self.threshold()
        if loss > limit:
            return (f"loss {loss:.4g} > {self.s.factor:g} x max(running median "
                    f"{median(self.history) if self.history else float('nan'):.4g}, "
                    f"chance ln K {self.chance:.4g}) = {limit:.4g} (--divergence-factor)")
        reason = self._stuck(float(loss), step)
        if reason:
            return reason
        self.history.append(float(loss))
        return None

    def _stuck(self, loss: float, step: int | None) -> str | None:
        """Rule 5: count the step when it is past the warm-up; the reason once the run is long enough."""
        floor = self.stuck_floor()
        if step is not None and step <= self.warmup_steps:
            return None
        self.stuck_run = self.stuck_run + 1 if loss > floor else 0
        if self.stuck_run < self.s.stuck_steps:
            return None
        where = "" if step is None else f"steps {step - self.stuck_run + 1}-{step}, "
        return (f"stuck above chance: loss above {self.s.stuck_factor:g} x chance ln K {self.chance:.4g} = "
                f"{floor:.4g} for {self.stuck_run} optimizer steps in a row ({where}after the {self.warmup_steps} "
                f"warm-up steps), now {loss:.4g} (--stuck-factor, --stuck-steps)")

    def after_update(self, skipped_steps: int) -> str | None:
        """Rule 4, given the engine's cumulative count of skipped updates; the reason or None."""
        if self._last_skipped is not None and skipped_steps > self._last_skipped:
            self.skipped_run += 1
        else:
            self.skipped_run = 0
        self._last_skipped = int(skipped_steps)
        if self.s.max_skipped and self.skipped_run >= self.s.max_skipped:
            return (f"{self.skipped_run} optimizer steps in a row were skipped (non-finite gradients / loss-scale "
                    f"overflow) (--max-skipped-steps {self.s.max_skipped})")
        return None

    def state_dict(self) -> dict:
        """The running history (saved in checkpoints so that a resumed run decides the same)."""
        return {"history": list(self.history), "skipped_run": self.skipped_run, "last_skipped": self._last_skipped,
                "stuck_run": self.stuck_run}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.history = deque((float(x) for x in state.get("history", [])), maxlen=self.s.window)
        self.skipped_run = int(state.get("skipped_run", 0))
        self._last_skipped = state.get("last_skipped")
        self.stuck_run = int(state.get("stuck_run", 0))   # (older checkpoints: a fresh count)


class EngineGuard:
    """:class:`DivergenceGuard` wired to a DeepSpeed engine: what each recipe lets it see.

    Where the trainer reduces the gradient itself (``manual_comm``: ZeRO stage 0 without
    DeepSpeed's bf16 optimizer, or the 1-bit compressor) it checks the loss and the global gradient
    norm before the update. Under ZeRO / DeepSpeed's bf16 optimizer the gradient is reduced inside
    DeepSpeed: the loss is checked before the update, DeepSpeed's own gradient norm and the skipped
    updates after it. fp16 gradients are not checked (an overflow is DeepSpeed's to skip; a run of
    skips is rule 4). Before every save or export the weights are checked on every recipe.

    Args:
        engine: the DeepSpeed engine.
        guard: the decision rules.
        manual_comm: the trainer all-reduces the gradient itself (see above).
        reduce: ``f([floats]) -> [sums over ranks]`` (a collective; identity for one rank).
        last_good: ``f() -> newest complete checkpoint dir or None``, for the report.
    """

    def __init__(self, engine: Any, guard: DivergenceGuard, *, manual_comm: bool,
                 reduce: Callable[[list[float]], list[float]], last_good: Callable[[], str | None]):
        self.engine, self.rules, self.manual_comm = engine, guard, manual_comm
        self.reduce, self.last_good = reduce, last_good
        self.loss: float = float("nan")         # the last checked step's reduced loss
        self.grad_norm: float | None = None     # and gradient norm (None: not seen)

    def _grad_norm(self, params: Sequence[torch.nn.Parameter]) -> float | None:
        if not self.manual_comm or self.engine.fp16_enabled():
            return None
        grads = [p.grad for p in params if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0

    def before_update(self, loss_sum: float, n: float, params: Sequence[torch.nn.Parameter], *, step: int,
                      lrs: dict[str, float]) -> None:
        """Rules 1-3 and 5 for the step about to be applied; the same decision on every rank.

        Args:
            loss_sum, n: this rank's sum of per-clip losses and clip count over the step's
                micro-batches (reduced here).
            params: the trainable parameters (their ``.grad`` is the reduced gradient when
                ``manual_comm``).
            step: the 1-based number of the step; lrs: its per-group lrs (for the report).

        Raises:
            DivergenceError: the step diverged; the caller must not apply it.
        """
        gn = self._grad_norm(params)
        bad_gn = 0.0 if gn is None or math.isfinite(gn) else 1.0
        loss_sum, n, bad_gn = self.reduce([float(loss_sum), float(n), bad_gn])
        loss = loss_sum / max(n, 1.0)
        if gn is not None and bad_gn:
            gn = float("nan")
        self.loss, self.grad_norm = loss, gn
        reason = self.rules.before_update(loss, gn, step=step)
        if reason:
            raise DivergenceError(reason, step=step, loss=loss, grad_norm=gn, lrs=lrs, last_good=self.last_good())

    def after_update(self, *, step: int, lrs: dict[str, float]) -> None:
        """Rule 4, and DeepSpeed's own gradient norm where it reduced the gradient itself (both are
        the same on every rank: DeepSpeed reduces them). Raises DivergenceError (``applied``)."""
        eng = self.engine
        reason = self.rules.after_update(int(eng.skipped_steps))
        gn = None
        if reason is None and not self.manual_comm and not eng.fp16_enabled():
            gn = eng.get_global_grad_norm()
            gn = None if gn is None else float(gn)
            if gn is not None and not math.isfinite(gn):
                reason = f"gradient norm is {gn} (DeepSpeed's, after the update)"
        if reason:
            raise DivergenceError(reason, step=step, loss=self.loss, grad_norm=gn, lrs=lrs,
                                  last_good=self.last_good(), applied=True)

    def check_weights(self, before: str, *, step: int, lrs: dict[str, float]) -> None:
        """Raise DivergenceError (on every rank alike) when a floating parameter or buffer of the
        engine's module is not finite; ``before`` names what was about to happen (a save...)."""
        module = self.engine.module
        bad = sum(int(not bool(torch.isfinite(t).all()))
                  for t in [*module.parameters(), *module.buffers()] if t.is_floating_point())
        if self.reduce([float(bad)])[0] > 0:
            raise DivergenceError(f"non-finite weights before {before}", step=step, loss=self.loss,
                                  grad_norm=None, lrs=lrs, last_good=self.last_good(), applied=True)

    def scaled_step(self, scale: float) -> None:
        """``engine.step()`` with every group's lr multiplied by ``scale`` (after a rollback).

        The schedulers used here set absolute lrs at each step; the scale is applied to what they
        set and taken off again when no scheduler replaced it (constant lr), so it never compounds.
        """
        if scale == 1.0:
            self.engine.step()
            return
        groups = self.engine.optimizer.param_groups
        before = [g["lr"] for g in groups]
        scaled = [lr * scale for lr in before]
        for g, lr in zip(groups, scaled):
            g["lr"] = lr
        self.engine.step()
        for g, lr0, lr1 in zip(groups, before, scaled):
            if g["lr"] == lr1:   # not replaced by a scheduler step
                g["lr"] = lr0

    def state_dict(self) -> dict:
        """The rules' running state (see :meth:`DivergenceGuard.state_dict`)."""
        return self.rules.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.rules.load_state_dict(state)


def lr_warmup_steps(ds_config: dict, tsm: dict) -> int:
    """The lr warm-up of a resolved recipe, in optimizer steps (rule 5 counts the steps after it).

    Args:
        ds_config: the resolved DeepSpeed config (``scheduler.params.warmup_num_steps``);
        tsm: its resolved ``tsm_ds`` block (``lr_schedule.warmup_steps``, which wins).

    Returns:
        The warm-up steps (int >= 0); 0 without a warm-up (constant lr, step decay, OneCycle).
    """
    ls = tsm.get("lr_schedule") or {}
    if "warmup_steps" in ls:
        return max(0, int(ls["warmup_steps"]))
    params = (ds_config.get("scheduler") or {}).get("params") or {}
    return max(0, int(params.get("warmup_num_steps", 0) or 0))


def decide_rollback(err: DivergenceError, *, policy: str, rollbacks: int, max_rollbacks: int, has_checkpoint: bool,
                    clip: float) -> bool:
    """Whether a diverged run rolls back (``--on-divergence rollback`` with rollbacks left and a
    checkpoint to go back to). When it does not, ``err`` is annotated for the report: the rollbacks
    used and the fixes that apply to this run (:meth:`DivergenceError.narrow_fixes`).

    Args:
        err: the divergence; policy: ``"stop"`` or ``"rollback"``; rollbacks: done so far;
        max_rollbacks: allowed; has_checkpoint: a complete checkpoint exists; clip: the run's
        ``gradient_clipping`` (0: off).
    """
    if policy == "rollback" and rollbacks < max_rollbacks and has_checkpoint:
        return True
    if policy == "rollback":
        err.context.append(f"rollbacks used: {rollbacks} of {max_rollbacks}"
                           + ("" if has_checkpoint else "; no checkpoint to roll back to"))
    err.narrow_fixes(clip=clip, rollback=policy == "rollback", has_checkpoint=has_checkpoint)
    return False
