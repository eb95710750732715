"""The multigrid study's settings, its runs, their training commands, the per-step cost of a run, and
the study's cost estimate.

The task is the large-batch study's (:class:`tsm_ds.experiments.large_batch.grid.StudySettings`: the
motion demo data at preset ``hard``, 5,120 training and 2,000 validation clips, TSM-ResNet-18 T=4 at
32 px, from scratch, world size 1, one OpenMP thread); its data generator, run command, process and
read-back are imported from :mod:`tsm_ds.experiments.large_batch`, not copied.

The recipe (both arms): the SGD that learned this task at batch 8 in its calibration of 2026-12-02
(``ds_configs/cpu_sgd_cosine.json``'s optimizer: momentum 0.9, weight decay 1e-4, no zero-init
residual, lr 0.003 at batch 8, the new fc at x5 / its bias x10: 72.4 % after 3,200 steps), the lr
stated at the base batch by the linear rule, a **stepwise** lr (``tsm_ds.lr_schedule`` type ``step``,
x0.1 at ``lr_steps``, as PySlowFast's and mmaction2's multigrid require), no warm-up at the base batch.
The large-batch study's ``cpu_sgd_large_batch`` (zero-init residual gamma, head at x1) sat at chance
for 2,880 steps at lr 0.0025 and for 5,120 at 0.005 on 2026-12-05: a base at chance would make the
comparison empty. Arms, per seed:

- ``base``: one shape (T=4, 32 px) at the base global batch, ``epochs`` epochs;
- ``mg_x<f>``: the same recipe with ``--multigrid <mode>`` and ``--multigrid-epoch-factor f`` (1.0:
  equal epochs; 1.5: PySlowFast's ``EPOCH_FACTOR``), Wu et al., "A Multigrid Method for Efficiently
  Training Video Models" (CVPR 2020), Sec. 3-4.

Both are evaluated at the base shape after precise BatchNorm statistics over ``precise_bn_batches``
training micro-batches (``--precise-bn-batches``, given to both arms: the trainer then recomputes
them for the one-shape base too), so BatchNorm's running averages cannot favour either arm.

Why the long cycle alone (``mode`` "long"): at this base shape (T=4, 32 px) the short cycle's crops
are 16 and 24 px, so ``long+short`` would train a third of its steps on 16 px clips (a quarter of the
base's pixels, 1 x 1 after ResNet-18's 32x downsampling, as 32 px is) and 2/3 of them at a larger batch
of full-T clips: the loader's cost follows clips x T, not pixels (docs/multigrid.md, "Step time per
shape"), so those steps cost the loader up to 4x the base step's for no model saving. The long
cycle alone is the part whose saving is in optimizer steps of about equal cost; the paper's 4.5x
combines both cycles, so this study measures less than the paper's whole method (said in its report).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tsm_ds.experiments.large_batch.grid import QUICK as LB_QUICK
from tsm_ds.experiments.large_batch.grid import RunSpec, StudySettings

__all__ = ["MGSettings", "QUICK", "Arm", "arms", "check_runs", "lb_settings", "write_recipe", "train_command",
           "schedule_for", "step_costs", "cost_to_step", "COST_S", "estimate_seconds", "estimate_text"]


@dataclass(frozen=True)
class MGSettings:
    """The study's values (the defaults are the full study).

    Attributes:
        task: the large-batch study's task (data generator, model, threads, decode cache); its
            batches, epochs and lrs are not used.
        base_batch: the base global batch (= the micro-batch: one BatchNorm group of 8 clips, as the
            large-batch study's base).
        epochs: the base recipe's epochs; lr_steps: its x``gamma`` lr steps (epochs);
            lr: SGD's lr at ``base_batch``; gamma: the step factor.
        head_lr_mults: ``--head-lr-mults`` of every run ("on": the new fc at x5, its bias x10, the
            official recipe's, as in the 2026-12-02 calibration of this task; from scratch the
            trainer's default is off).
        mode: ``--multigrid`` of the multigrid arms; epoch_factors: their ``--multigrid-epoch-factor``
            values, one arm each.
        seeds: training seeds (every arm runs every seed).
        eval_every, eval_max_clips: ``--eval-every`` / ``--eval-max-clips`` (the last evaluation scores
            every validation clip).
        precise_bn_batches: ``--precise-bn-batches`` of every run (micro-batches of ``base_batch``
            clips before each evaluation).
    """

    task: StudySettings = StudySettings()
    base_batch: int = 8
    epochs: int = 10
    lr_steps: tuple[float, ...] = (6.0, 8.0)
    lr: float = 0.003
    head_lr_mults: str = "on"
    gamma: float = 0.1
    mode: str = "long"
    epoch_factors: tuple[float, ...] = (1.5, 1.0)
    seeds: tuple[int, ...] = (0, 1)
    eval_every: str = "0.5"
    eval_max_clips: int | None = 500
    precise_bn_batches: int = 50

    @property
    def train_clips(self) -> int:
        """Training clips of an epoch (world size 1)."""
        return self.task.train_clips

    @property
    def val_clips(self) -> int:
        """Validation clips (the final evaluation scores them all)."""
        return self.task.val_clips

    @property
    def chance(self) -> float:
        """Chance top-1 (%)."""
        return 100.0 / len(self.task.classes)

    def check(self) -> None:
        """Refuse values the study cannot run (ValueError naming the value): the base batch must divide
        the training set, the lr steps must lie inside the run, the schedule must build and fill a step
        in every stage."""
        if self.train_clips % self.base_batch:
            raise ValueError(f"base_batch {self.base_batch} does not divide {self.train_clips} training clips")
        if not self.seeds or not self.epoch_factors or any(f <= 0 for f in self.epoch_factors):
            raise ValueError("need >= 1 seed and epoch factors > 0")
        if any(not 0 < e < self.epochs for e in self.lr_steps) or list(self.lr_steps) != sorted(self.lr_steps):
            raise ValueError(f"lr_steps {self.lr_steps}: ascending epochs inside (0, {self.epochs})")
        for f in self.epoch_factors:
            schedule_for(self, f).total_steps(self.train_clips)   # ValueError: a stage without a step


#: ``--quick``: the plumbing (both arms through the trainer, precise BatchNorm for both, the rows, the
#: report), not accuracy: the large-batch study's quick task (16 clips of 4 classes, T=2), batch 2,
#: 4 epochs with lr steps at 2 and 3, one seed, the 1.5 epoch factor only
QUICK = MGSettings(task=LB_QUICK, base_batch=2, epochs=4, lr_steps=(2.0, 3.0), lr=0.01, epoch_factors=(1.5,),
                   seeds=(0,), eval_every="0.5", eval_max_clips=2, precise_bn_batches=2)


@dataclass(frozen=True)
class Arm:
    """One run of the study: ``name`` (its run folder and row), ``arm`` ("base" or "mg_x<f>"),
    ``seed``, ``epoch_factor`` (None for the base: no schedule)."""

    name: str
    arm: str
    seed: int
    epoch_factor: float | None

    @property
    def multigrid(self) -> bool:
        """Whether the run trains with the shape schedule."""
        return self.epoch_factor is not None


def arms(settings: MGSettings) -> list[Arm]:
    """The study's runs in run order: per seed, the base then the multigrid arms in ``epoch_factors``
    order (the first seed's rows land first, so a study cut short still compares every arm)."""
    out = []
    for seed in settings.seeds:
        out.append(Arm(f"base_s{seed}", "base", seed, None))
        out += [Arm(f"mg_x{f:g}_s{seed}", f"mg_x{f:g}", seed, float(f)) for f in settings.epoch_factors]
    return out



def check_runs(settings: MGSettings, names) -> None:
    """``--runs``: every name must be a planned run (:func:`arms`).

    Raises:
        ValueError: an unknown name (the message lists the study's runs).
    """
    planned = [a.name for a in arms(settings)]
    unknown = sorted(set(names or ()) - set(planned))
    if unknown:
        raise ValueError(f"--runs {','.join(unknown)}: not a run of this study; its runs: {', '.join(planned)}")

def lb_settings(settings: MGSettings) -> StudySettings:
    """The large-batch study's settings that make its :func:`~tsm_ds.experiments.large_batch.runs.train_command`
    write this study's base run: one batch (``base_batch`` = the micro-batch, no ghost BatchNorm, no
    warm-up), ``epochs`` epochs, this study's evaluation cadence."""
    b = settings.base_batch
    return dataclasses.replace(settings.task, batches=(b,), micro_batch=b, max_micro_batch=b,
                               ghost_bn_clips=b, min_steps=settings.epochs * settings.train_clips // b,
                               eval_every=settings.eval_every, eval_max_clips=settings.eval_max_clips)


def write_recipe(out_dir: Path, settings: MGSettings) -> Path:
    """Write ``<out_dir>/recipes/sgd_step_lr<lr>.json``: ``ds_configs/cpu_sgd_cosine.json`` with the
    linear rule stated from ``lr`` at ``base_batch`` and the stepwise lr (decay epochs from the run's
    ``--lr-steps``, warm-up "auto": none at the base batch). Returns the path.

    Raises:
        tsm_ds.engine.config.recipes.ConfigError: the template is not shipped.
    """
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.utils.io import atomic_write_text

    cfg: dict[str, Any] = load_config("cpu_sgd_cosine")
    cfg["_comment"] = (f"tsm-ds bench multigrid: ds_configs/cpu_sgd_cosine.json's SGD, linear rule from lr "
                       f"{settings.lr:g} at {settings.base_batch} clips, step decay x{settings.gamma:g} at --lr-steps. "
                       + str(cfg.get("_comment", "")))
    tsm = cfg.setdefault("tsm_ds", {})
    tsm["lr_scaling"] = {"rule": "linear", "base_lr": float(settings.lr), "base_batch": int(settings.base_batch)}
    tsm["lr_schedule"] = {"type": "step", "decay_epochs": "auto", "gamma": float(settings.gamma),
                          "warmup_steps": "auto"}
    path = Path(out_dir) / "recipes" / f"sgd_step_lr{settings.lr:g}.json"
    atomic_write_text(path, json.dumps(cfg, indent=2) + "\n")
    return path


def train_command(arm: Arm, settings: MGSettings, recipe: Path | str, data: Mapping[str, Any],
                  run_root: Path | str) -> list[str]:
    """The ``python -m tsm_ds.train`` command of ``arm``: the large-batch study's base-run command
    (:func:`tsm_ds.experiments.large_batch.runs.train_command` with :func:`lb_settings`) and this
    study's flags, written by :func:`tsm_ds.config.to_argv`: ``--lr-steps``, ``--head-lr-mults``,
    ``--multigrid`` (``none`` for the base), ``--multigrid-epoch-factor`` (multigrid arms) and
    ``--precise-bn-batches`` (every arm)."""
    from tsm_ds.config import Config, to_argv
    from tsm_ds.config.commands import TRAIN
    from tsm_ds.experiments.large_batch.runs import train_command as lb_command

    lb = lb_settings(settings)
    spec = RunSpec(arm.name, "sgd", str(recipe), settings.base_batch, arm.seed, settings.lr, arm.arm)
    values: dict[str, Any] = {"schedule.lr_steps": [float(x) for x in settings.lr_steps],
                              "schedule.head_lr_mults": settings.head_lr_mults,
                              "schedule.multigrid": settings.mode if arm.multigrid else "none",
                              "schedule.precise_bn_batches": int(settings.precise_bn_batches)}
    if arm.multigrid:
        values["schedule.multigrid_epoch_factor"] = float(arm.epoch_factor)
    return [*lb_command(spec, lb, data, Path(run_root)), *to_argv(TRAIN, Config, values, only_changed=False)]


def schedule_for(settings: MGSettings, epoch_factor: float | None):
    """The run's :class:`~tsm_ds.engine.loop.multigrid.MultigridSchedule` as the trainer builds it
    (:func:`tsm_ds.engine.loop.build.multigrid_schedule`: base T and crop, the base batch, ``epochs``,
    ``lr_steps``, ``gamma``, ``mode``, the epoch factor); None for the base (``epoch_factor`` None)."""
    if epoch_factor is None:
        return None
    from tsm_ds.engine.loop.multigrid import build_schedule

    t = settings.task
    return build_schedule(frames=t.num_segments, crop=t.img_size, global_batch=settings.base_batch,
                          epochs=settings.epochs, lr_steps=settings.lr_steps, gamma=settings.gamma,
                          mode=settings.mode, epoch_factor=float(epoch_factor))


def step_costs(settings: MGSettings, epoch_factor: float | None) -> list[tuple[int, int, int]]:
    """Every optimizer step's ``(global batch, T, crop)`` in run order: ``epochs`` x steps per epoch of
    the base shape for the base, the schedule's steps (:meth:`MultigridSchedule.epoch_steps` epoch by
    epoch) for a multigrid arm. Its length is the run's planned steps; a step's clips x frames x pixels
    is ``batch * T * crop ** 2``."""
    t, b = settings.task, settings.base_batch
    sch = schedule_for(settings, epoch_factor)
    if sch is None:
        return [(b, t.num_segments, t.img_size)] * (settings.epochs * (settings.train_clips // b))
    out = []
    for e in range(sch.epochs):
        out += [(s.global_batch, s.frames, s.crop) for s in sch.epoch_steps(e, settings.train_clips)]
    return out


#: per-unit costs (seconds of one core, one OpenMP thread, through the trainer with --cache-decoded),
#: measured by the pilot (``studies/multigrid_pilot.py``, ``results/multigrid/pilot.json``) on 2026-12-05
#: on the project's 2-core AMD EPYC machine while another study and a test suite shared it:
#: ``base_step`` one optimizer step at the base shape (8 clips, T=4, 32 px: 0.2456 s over 320 steps),
#: ``small_step`` one step at a shape with a smaller crop (the long cycle's 32 clips x 2 frames x 24 px:
#: 0.3117 s over 160 steps, 1.27x the base step for 1.125x its clips x frames x pixels); other shapes
#: cost ``base_step`` x their clips x frames x pixels over the base's (16 x 2 x 32 px: the base's);
#: ``eval_clip`` one evaluated clip (0.0077 s), ``bn_clip`` one clip of precise BatchNorm (0.008 s),
#: ``run_start`` a run's start-up (imports, the engine, decoding the 7,120 videos into the cache: 81 s)
COST_S = {"base_step": 0.2456, "small_step": 0.3117, "eval_clip": 0.0077, "bn_clip": 0.008, "run_start": 85.0}


def _step_s(step: tuple[int, int, int], settings: MGSettings, c: Mapping[str, float]) -> float:
    """Estimated seconds of one optimizer step of shape (global batch, T, crop) (:data:`COST_S`)."""
    t = settings.task
    b, frames, crop = step
    if crop < t.img_size:
        return c["small_step"]
    return c["base_step"] * b * frames * crop * crop / (settings.base_batch * t.num_segments * t.img_size ** 2)


def _evals(settings: MGSettings, steps_per_epoch: float, epochs: int) -> int:
    """Intermediate evaluations of a run (the final one excluded)."""
    from fractions import Fraction

    from tsm_ds.config.cadence import parse_eval_every

    kind, value = parse_eval_every(settings.eval_every)
    if kind == "epoch":
        per = 1
    elif kind == "steps":
        per = max(1, int(steps_per_epoch // int(value)))
    else:
        per = max(1, int(1 / Fraction(value)))
    return max(0, per * epochs - 1)


def estimate_seconds(settings: MGSettings, cost: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The study's time from per-unit costs (:data:`COST_S`, or ``cost``).

    Returns:
        {"runs", "per_arm": {arm: {"steps", "train_s", "eval_s", "run_s"}} (one seed), "cpu_s" (all
        runs, one core), "speed": {arm: its train_s over the base's} (the training-time ratio these
        costs predict)}.
    """
    c = {**COST_S, **(cost or {})}
    s = settings
    cap = min(s.val_clips, s.eval_max_clips or s.val_clips)
    per_eval = cap * c["eval_clip"] + s.precise_bn_batches * s.base_batch * c["bn_clip"]
    per_arm: dict[str, dict[str, float]] = {}
    for f in (None, *s.epoch_factors):
        sch = schedule_for(s, f)
        costs = step_costs(s, f)
        steps = len(costs)
        epochs = s.epochs if sch is None else sch.epochs
        train = sum(_step_s(x, s, c) for x in costs)
        evals = _evals(s, steps / epochs, epochs) * per_eval + per_eval - cap * c["eval_clip"] \
            + s.val_clips * c["eval_clip"]
        per_arm["base" if f is None else f"mg_x{f:g}"] = {"steps": steps, "train_s": train, "eval_s": evals,
                                                          "run_s": train + evals + c["run_start"]}
    one_seed = sum(v["run_s"] for v in per_arm.values())
    speed = {k: round(v["train_s"] / per_arm["base"]["train_s"], 3) for k, v in per_arm.items() if k != "base"}
    return {"runs": len(arms(s)), "per_arm": per_arm, "cpu_s": one_seed * len(s.seeds), "speed": speed}


def estimate_text(settings: MGSettings) -> str:
    """One sentence of :func:`estimate_seconds` (``--help`` and the study's log print it)."""
    e = estimate_seconds(settings)
    arms_txt = ", ".join(f"{k} {v['steps']} steps ~{v['run_s'] / 60:.0f} min" for k, v in e["per_arm"].items())
    sp = ", ".join(f"{k} {v:.2f}x" for k, v in e["speed"].items())
    return (f"{e['runs']} runs ({arms_txt}; per seed), {e['cpu_s'] / 3600:.1f} h of one core, one run at a time; "
            f"training time over the base's by these costs: {sp}")


def _sum_costs(costs: Sequence[tuple[int, int, int]]) -> int:
    return sum(b * t * c * c for b, t, c in costs)


def cost_to_step(costs: Sequence[tuple[int, int, int]], step: int) -> int:
    """Clips x frames x pixels of the first ``step`` optimizer steps of ``costs`` (:func:`step_costs`)."""
    return _sum_costs(costs[: max(0, int(step))])
