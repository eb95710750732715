"""The multigrid shape schedule: which clip shape, global batch and lr factor each epoch and optimizer
step of a run trains with.

Source: Wu, Girshick, He, Feichtenhofer, Krahenbuhl, "A Multigrid Method for Efficiently Training
Video Models" (CVPR 2020), Sec. 3 (long and short cycles, batch scaled inversely to the shape, the
lr scaled with the long-cycle batch) and Sec. 4 (the default factors); PySlowFast
``slowfast/utils/multigrid.py`` (``MultigridSchedule.init_multigrid``, ``get_long_cycle_schedule``,
``get_current_long_cycle_shape``) and ``slowfast/datasets/multigrid_helper.py``
(``ShortCycleBatchSampler``); the defaults of ``slowfast/config/defaults.py`` (``_C.MULTIGRID``).

Why here (``engine/loop``) and not in ``data``: the schedule decides optimizer-step boundaries, the
global batch and the lr, which are the training loop's (the data layer only learns to cut an item
at a given (T, crop): :meth:`tsm_ds.data.dataset.VideoClipDataset.__getitem__` with an
``(index, T, crop)`` tuple); its sampler (:mod:`tsm_ds.engine.loop.multigrid_sampler`) is the sibling
of the trainer's resumable sampler and re-shards with :mod:`tsm_ds.engine.checkpoint.reshard`.
This module is pure: no torch, no I/O.

The rule, for a base shape (T frames, S px crop) and base global batch B:

- **Long cycle** (per stepwise lr stage): the shapes ``(round(T t_f), round(S s_f))`` of
  :data:`LONG_CYCLE_FACTORS` ((1/4, 1/sqrt 2), (1/2, 1/sqrt 2), (1/2, 1), (1, 1)), each at global batch
  ``B x round(T S^2 / (t s^2))`` so clips x frames x pixels per step stay about constant (factors 8, 4,
  2, 1 for 8 x 224). Each lr stage of E epochs gives shape j ``E b_j / sum(b)`` epochs (b_j: the
  shape's mean batch factor over its short cycle): every shape gets the same number of optimizer
  steps (PySlowFast's allotment). The lr of shape j is ``gamma^stage x`` its long-cycle batch factor
  (the linear rule on the long cycle only).
- **Final stage** (on by default, as PySlowFast): the last lr stage (after the last lr step) trains
  at the base shape only, for as many fewer steps as the long cycles saved; its first half keeps the
  previous stage's lr, its second half decays (PySlowFast's ``SOLVER.STEPS[-1]`` and ``LRS`` edit).
  Off: the long cycle runs in the last lr stage too.
- **Epoch factor**: every stage's epochs are scaled so the run trains ``epochs x epoch_factor``
  epochs (PySlowFast's ``EPOCH_FACTOR`` 1.5: more epochs, still fewer steps); stage ends are the
  rounded cumulative epochs, so each stage is whole epochs.
- **Short cycle** (per optimizer step, cycling): crops ``round(S x 1/2)``, ``round(S / sqrt 2)`` and the
  long-cycle crop, at the long-cycle batch x ``round((s_long / s)^2)`` (x4, x2, x1 at the base shape);
  the lr is not scaled for it. The cycle restarts with every epoch (PySlowFast's sampler counter).

Rounding (this package's choices): T is an integer >= ``min_frames`` (default 2: the classes need
motion; PySlowFast has no floor), even when the model pools in time; a crop that is not the base
crop is rounded to a multiple of ``crop_multiple`` (8: 224/sqrt 2 gives 160, PySlowFast 158; each of
ResNet's first three stride-2 stages then halves it exactly); the batch factors are integers >= 1
computed from the rounded shapes, so a stage's per-rank micro-batch is the base micro-batch times
the factor (:meth:`MultigridSchedule.micro_batch`).

The global batch and DeepSpeed (0.19.8, ``deepspeed/runtime/engine.py``): ``train_batch_size =
micro x gradient_accumulation_steps x world`` is asserted once, when the config is built
(``runtime/config.py`` ``_batch_assertion``). At step time the engine never looks at a batch's size:
``backward`` divides the loss by ``gradient_accumulation_steps`` (``loss / self.gradient_accumulation_steps()``),
the all-reduce averages over the data-parallel ranks (``1 / dp_world_size``), and
``is_gradient_accumulation_boundary`` counts micro-steps. ``train_batch_size()`` is read only for
bookkeeping: ``global_samples`` (``+= train_batch_size()`` per step, TensorBoard's x-axis, saved in
checkpoints), the throughput timer, and the lr scheduler's fallback ``step(train_batch_size())``
(not ours: :class:`~tsm_ds.engine.loop.optim.WarmupStepLR` steps by count); ``train_micro_batch_size_per_gpu()``
only by ``deepspeed_io`` (not ours), random-LTD at set-up and ``set_train_batch_size``. So the design: the
accumulation and the world size stay fixed, every rank's micro-batch is the base micro-batch x the
step's batch factor, all micro-batches of one optimizer step have the same size on every rank
(the sampler makes it so), and the loss stays the mean over the micro-batch: the update is then the
exact mean over the step's global batch. ``engine.set_train_micro_batch_size(m)`` (keeps the
accumulation) can keep ``global_samples`` honest; DeepSpeed's config stays valid as built.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["MODES", "LONG_CYCLE_FACTORS", "SHORT_CYCLE_FACTORS", "StepShape", "Stage", "StepPosition",
           "MultigridSchedule", "build_schedule"]

#: ``--multigrid`` values: no schedule, long cycle, short cycle, both
MODES = ("none", "long", "short", "long+short")
#: (T factor, crop factor) of the long cycle, smallest shape first (PySlowFast ``LONG_CYCLE_FACTORS``)
LONG_CYCLE_FACTORS = ((0.25, 0.5 ** 0.5), (0.5, 0.5 ** 0.5), (0.5, 1.0), (1.0, 1.0))
#: crop factors of the short cycle's extra shapes, relative to the base crop (PySlowFast ``SHORT_CYCLE_FACTORS``)
SHORT_CYCLE_FACTORS = (0.5, 0.5 ** 0.5)


@dataclass(frozen=True)
class StepShape:
    """The clip shape and batch of one optimizer step.

    Attributes:
        frames: T, frames per clip (int >= 1).
        crop: crop side in pixels (clips (N, T, 3, crop, crop)).
        batch_factor: global batch / the base global batch (int >= 1).
        global_batch: clips per optimizer step over all ranks (base global batch x batch_factor).
    """

    frames: int
    crop: int
    batch_factor: int
    global_batch: int

    @property
    def cost(self) -> int:
        """Clips x frames x pixels of one step (the ideal cost, the schedule keeps it about constant)."""
        return self.global_batch * self.frames * self.crop * self.crop


@dataclass(frozen=True)
class Stage:
    """A range of whole epochs at one long-cycle shape and one lr factor.

    Attributes:
        epoch_start, epoch_end: epochs [start, end) of the schedule (0-based).
        lr_stage: the stepwise lr stage whose decay applies (gamma ** lr_stage in ``lr_factor``).
        long_cycle: index into the long-cycle factors (None: the base shape of the final stage or of
            a run without long cycle).
        shapes: the optimizer steps' shapes, cycled step by step from each epoch's start (one shape
            without short cycle; the two short-cycle crops then the long-cycle crop with it).
        lr_factor: lr / the base lr (the lr of the base global batch): gamma ** lr_stage x the
            long-cycle batch factor (short cycles not counted).
    """

    epoch_start: int
    epoch_end: int
    lr_stage: int
    long_cycle: int | None
    shapes: tuple[StepShape, ...]
    lr_factor: float

    @property
    def epochs(self) -> int:
        """Epochs in the stage."""
        return self.epoch_end - self.epoch_start


@dataclass(frozen=True)
class StepPosition:
    """Where optimizer step ``step`` (0-based: the step about to run) sits in the schedule.

    Attributes:
        step: the global optimizer step; epoch: its epoch; step_in_epoch: steps of the epoch before it;
        clips_before: clips all ranks consumed in the epoch before it (the data position P of
            :mod:`tsm_ds.engine.checkpoint.reshard`); stage: index into :attr:`MultigridSchedule.stages`;
        shape: its :class:`StepShape`; lr_factor: its stage's lr factor.
    """

    step: int
    epoch: int
    step_in_epoch: int
    clips_before: int
    stage: int
    shape: StepShape
    lr_factor: float


def _round_frames(x: float, min_frames: int, even: bool) -> int:
    if even:
        return max(2 * math.ceil(min_frames / 2), 2 * int(round(x / 2)))
    return max(min_frames, int(round(x)))


def _round_crop(x: float, multiple: int) -> int:
    return max(multiple, multiple * int(round(x / multiple)))


def _batch_factor(frames: int, crop: int, base_frames: int, base_crop: int) -> int:
    return max(1, int(round(base_frames * base_crop ** 2 / (frames * crop ** 2))))


@dataclass(frozen=True)
class MultigridSchedule:
    """A run's stages (:func:`build_schedule` makes it) and the lookups of its optimizer steps.

    Attributes:
        base_frames, base_crop, base_batch: the base shape T, S and the base global batch B.
        mode: one of :data:`MODES`.
        stages: the stages in epoch order, contiguous from epoch 0.
        epochs: the schedule's epochs (the last stage's end).
    """

    base_frames: int
    base_crop: int
    base_batch: int
    mode: str
    stages: tuple[Stage, ...]
    _ends: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_ends", tuple(s.epoch_end for s in self.stages))

    @property
    def epochs(self) -> int:
        """Epochs of the schedule (``epochs x epoch_factor`` rounded, for a long or short cycle)."""
        return self.stages[-1].epoch_end

    def stage_index(self, epoch: int) -> int:
        """Index of the stage that trains ``epoch`` (0-based); epochs past the end: the last stage
        (as PySlowFast's ``get_current_long_cycle_shape``). Raises ValueError for a negative epoch."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        return min(bisect.bisect_right(self._ends, epoch), len(self.stages) - 1)

    def micro_batch(self, shape: StepShape, *, world: int, accum: int) -> int:
        """Clips per rank per micro-batch at ``shape``: global batch / (world x accum).

        Raises:
            ValueError: the global batch does not divide (the base batch must be micro x accum x world).
        """
        if shape.global_batch % (world * accum):
            raise ValueError(f"global batch {shape.global_batch} does not split over {world} ranks x {accum} "
                             f"micro-batches: the base batch {self.base_batch} must be a multiple of {world * accum}")
        return shape.global_batch // (world * accum)

    def step_shape(self, epoch: int, step_in_epoch: int) -> StepShape:
        """The shape of step ``step_in_epoch`` (0-based) of ``epoch``: the stage's shapes cycled from the
        epoch's start."""
        shapes = self.stages[self.stage_index(epoch)].shapes
        return shapes[int(step_in_epoch) % len(shapes)]

    def epoch_steps(self, epoch: int, epoch_clips: int, *, start_step: int = 0) -> list[StepShape]:
        """The shapes of the optimizer steps of ``epoch``, from its step ``start_step`` on.

        Args:
            epoch: the epoch (0-based).
            epoch_clips: clips left for those steps over all ranks: ``DistributedSampler``'s padded
                epoch, ``ceil(N / world) x world`` (less the consumed prefix after a resume).
            start_step: steps of the epoch already done (the short cycle goes on from there).

        Returns:
            One :class:`StepShape` per step; the clips that do not fill the next step's batch are
            dropped (PySlowFast's sampler with ``drop_last``, the trainer's incomplete micro-batches).
        """
        shapes = self.stages[self.stage_index(epoch)].shapes
        out, left, k = [], int(epoch_clips), int(start_step)
        while left >= shapes[k % len(shapes)].global_batch:
            sh = shapes[k % len(shapes)]
            out.append(sh)
            left -= sh.global_batch
            k += 1
        return out

    def _steps_per_epoch(self, i: int, epoch_clips: int) -> list[StepShape]:
        steps = self.epoch_steps(self.stages[i].epoch_start, epoch_clips)
        if not steps:
            raise ValueError(f"--batch-size {self.base_batch}: stage {i} (epochs {self.stages[i].epoch_start}-"
                             f"{self.stages[i].epoch_end}) needs {self.stages[i].shapes[0].global_batch} clips a step "
                             f"and an epoch has {epoch_clips}: lower the batch or add data")
        return steps

    def total_steps(self, epoch_clips: int) -> int:
        """Optimizer steps of the whole schedule with ``epoch_clips`` clips per epoch (see
        :meth:`epoch_steps`). Raises ValueError when a stage's epoch does not fill one step."""
        return sum(s.epochs * len(self._steps_per_epoch(i, epoch_clips)) for i, s in enumerate(self.stages))

    def locate(self, step: int, epoch_clips: int) -> StepPosition:
        """The stage, shape and data position of optimizer step ``step`` (0-based; a checkpoint
        written after S steps resumes at ``locate(S)``) at ``epoch_clips`` clips per epoch.

        Raises:
            ValueError: step < 0, step >= :meth:`total_steps`, or an epoch without a single step.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        done = 0
        for i, s in enumerate(self.stages):
            steps = self._steps_per_epoch(i, epoch_clips)
            if step < done + s.epochs * len(steps):
                epoch_off, j = divmod(step - done, len(steps))
                return StepPosition(step=step, epoch=s.epoch_start + epoch_off, step_in_epoch=j,
                                    clips_before=sum(x.global_batch for x in steps[:j]), stage=i, shape=steps[j],
                                    lr_factor=s.lr_factor)
            done += s.epochs * len(steps)
        raise ValueError(f"step {step} is past the schedule's {done} optimizer steps")

    def table(self, epoch_clips: int | None = None) -> list[dict]:
        """One row per stage and shape, for reports (``tsm-ds config``, the docs): epochs, T, crop,
        global batch, lr factor and, with ``epoch_clips``, optimizer steps per epoch of the stage."""
        rows = []
        for i, s in enumerate(self.stages):
            per_epoch = len(self.epoch_steps(s.epoch_start, epoch_clips)) if epoch_clips else None
            for sh in s.shapes:
                rows.append({"stage": i, "epochs": f"{s.epoch_start}-{s.epoch_end}", "lr_stage": s.lr_stage,
                             "frames": sh.frames, "crop": sh.crop, "global_batch": sh.global_batch,
                             "lr_factor": s.lr_factor, "steps_per_epoch": per_epoch})
        return rows


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def build_schedule(*, frames: int, crop: int, global_batch: int, epochs: int, lr_steps: Sequence[float] = (),
                   gamma: float = 0.1, mode: str = "long", final_stage: bool = True, min_frames: int = 2,
                   even_frames: bool = False, epoch_factor: float = 1.5, crop_multiple: int = 8,
                   long_factors: Sequence[tuple[float, float]] = LONG_CYCLE_FACTORS,
                   short_factors: Sequence[float] = SHORT_CYCLE_FACTORS) -> MultigridSchedule:
    """The multigrid stages of a run (the module docstring says the rule).

    Args:
        frames: T of the base shape (``--num-segments``); crop: S, its crop side (``--img-size``).
        global_batch: B, the base global batch (``train_batch_size``, clips per optimizer step).
        epochs: the run's planned epochs (``--epochs``); lr_steps: epochs of the stepwise lr decays
            (``--lr-steps``; those >= epochs never apply and are dropped); gamma: the decay factor.
        mode: ``--multigrid``: "none" (one stage per lr stage at the base shape, epochs unchanged),
            "long", "short" or "long+short".
        final_stage: ``--multigrid-final-stage``: the last lr stage at the base shape (long cycle only).
        min_frames: ``--multigrid-min-frames``: the smallest T of a shape (>= 1).
        even_frames: T even in every shape (a model with temporal pooling needs it).
        epoch_factor: ``--multigrid-epoch-factor``: the schedule trains epochs x this (> 0; long or short
            cycle only).
        crop_multiple: crops other than S are multiples of this (1: PySlowFast's rounding to the pixel).
        long_factors, short_factors: the cycles' factors (defaults PySlowFast's).

    Returns:
        the :class:`MultigridSchedule`; with the defaults and T=8, S=224, B=64, 50 epochs, steps 20 40,
        long cycle: shapes (2, 160, x8), (4, 160, x4), (4, 224, x2), (8, 224, x1) per lr stage, then
        the base shape (tested).

    Raises:
        ValueError: a value out of range, naming its flag; ``final_stage`` with a long cycle and no
            lr step before the last epoch (the whole run would be the final stage).
    """
    _check(mode in MODES, f"--multigrid: {mode!r} is not one of {', '.join(MODES)}")
    _check(int(frames) >= 1, f"--num-segments {frames}: T must be >= 1")
    _check(int(crop) >= 1, f"--img-size {crop}: the crop must be >= 1 px")
    _check(int(global_batch) >= 1, f"--batch-size {global_batch}: the global batch must be >= 1")
    _check(int(epochs) >= 1, f"--epochs {epochs}: must be >= 1")
    _check(int(min_frames) >= 1, f"--multigrid-min-frames {min_frames}: must be >= 1")
    _check(float(epoch_factor) > 0, f"--multigrid-epoch-factor {epoch_factor}: must be > 0")
    _check(int(crop_multiple) >= 1, f"crop_multiple {crop_multiple}: must be >= 1")
    _check(not even_frames or frames % 2 == 0, f"--num-segments {frames}: temporal pooling needs an even T")
    T, S, B = int(frames), int(crop), int(global_batch)
    steps = sorted(float(e) for e in lr_steps if 0 < float(e) < epochs)
    bounds = [0.0, *steps, float(epochs)]          # lr stage i: [bounds[i], bounds[i + 1])
    long = mode in ("long", "long+short")
    short = mode in ("short", "long+short")

    def cycle(t: int, s: int) -> tuple[StepShape, ...]:
        """The steps' shapes at long-cycle shape (t, s): short-cycle crops first, as PySlowFast."""
        b = _batch_factor(t, s, T, S)
        crops = [_round_crop(S * f, crop_multiple) for f in short_factors] if short else []
        # ShortCycleBatchSampler: the long-cycle batch x round((long-cycle crop / short crop)^2)
        pairs = [(c, max(1, int(round((s / c) ** 2)))) for c in crops] + [(s, 1)]
        return tuple(StepShape(t, c, b * k, B * b * k) for c, k in pairs)

    if not long:
        e_factor = epoch_factor if short else 1.0
        # PySlowFast's short cycle alone: STEPS and MAX_EPOCH times EPOCH_FACTOR, rounded down
        ends = [int(e * e_factor) for e in bounds[1:]]
        base = cycle(T, S)
        stages = [Stage(int(bounds[0] * e_factor) if i == 0 else ends[i - 1], ends[i], i, None, base, gamma ** i)
                  for i in range(len(ends))]
        return MultigridSchedule(T, S, B, mode, tuple(s for s in stages if s.epochs > 0))

    shapes = []
    for tf, sf in long_factors:
        t = T if tf == 1 else _round_frames(T * tf, min_frames, even_frames)
        s = S if sf == 1 else _round_crop(S * sf, crop_multiple)
        shapes.append(cycle(t, s))
    avg = [sum(x.batch_factor for x in c) / len(c) for c in shapes]
    n_cycle = len(bounds) - 1 - (1 if final_stage else 0)
    _check(n_cycle >= 1, f"--multigrid-final-stage: the final stage at the base shape needs an lr step before "
           f"epoch {epochs} (--lr-steps), else the whole run is the final stage; or --no-multigrid-final-stage")
    # PySlowFast's allotment: per lr stage, epochs in proportion to the mean batch -> equal steps per shape
    raw = []   # (lr_stage, long-cycle index, shapes, epochs before the epoch factor, lr factor)
    for i in range(n_cycle):
        e = bounds[i + 1] - bounds[i]
        for j, c in enumerate(shapes):
            raw.append((i, j, c, e * avg[j] / sum(avg), gamma ** i * c[-1].batch_factor))
    if final_stage:
        iters = sum(r[3] / avg[r[1]] for r in raw)
        saving = bounds[n_cycle] / iters
        base = cycle(T, S)
        ft = (bounds[-1] - bounds[n_cycle]) / saving * (sum(x.batch_factor for x in base) / len(base))
        raw.append((n_cycle, None, base, ft, None))
    x = epochs * epoch_factor / sum(r[3] for r in raw)
    stages, total, start = [], 0.0, 0
    for lr_stage, j, c, e, lr in raw:
        total += e * x
        end = int(round(total))
        if lr is None:   # the final stage: first half at the previous lr, second half decayed
            mid = (start + end) // 2
            stages.append(Stage(start, mid, lr_stage - 1, None, c, gamma ** (lr_stage - 1)))
            stages.append(Stage(mid, end, lr_stage, None, c, gamma ** lr_stage))
        else:
            stages.append(Stage(start, end, lr_stage, j, c, lr))
        start = end
    return MultigridSchedule(T, S, B, mode, tuple(s for s in stages if s.epochs > 0))
