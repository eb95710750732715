"""The study's settings, its four recipes and its run grid (what runs, with which engine JSON).

Every run trains TSM on the motion demo data through ``tsm_ds.train`` at world size 1; the global
batch is the fixed micro-batch x gradient accumulation (BatchNorm sees the same micro-batch at
every global batch, as the paper's 8 clips per GPU), and every run sees the same number of clips
(``epochs`` x training clips), so a run at batch B makes 1/B as many optimizer steps.

Recipes (each an engine JSON derived from a shipped recipe, written into ``<out>/recipes/``, in
which only ``tsm_ds.lr_scaling`` is set; the trainer's ``"auto"`` lr then applies the rule):

- ``sgd_fixed`` (a): SGD momentum 0.9 (``ds_configs/cpu_sgd_cosine.json``), the lr chosen at the
  base batch from ``sgd_lrs`` (at most 4, every one a full run, counted), rule ``none``.
- ``sgd_linear`` (b): the same optimizer and base lr, linear rule (Goyal et al. 2017, Sec. 2.1).
- ``lars`` (c): ``ds_configs/cpu_lars.json`` (timm LARS, trust coefficient 0.001), its linear rule
  from ``lars_base_lr`` at the base batch (You, Gitman, Ginsburg 2017).
- ``lamb`` (d): ``ds_configs/cpu_lamb.json`` (timm LAMB), its square-root rule from
  ``lamb_base_lr`` (You et al. 2020, Sec. 4).

All four use the same cosine decay with a linear warm-up over ``warmup_fraction`` of each run's
optimizer steps (Goyal et al.'s gradual warm-up is counted in epochs, i.e. in clips; here the same
fraction of the same clips at every batch). At the base batch (a) and (b) are the same run (same
lr, same schedule), run once and reported under both.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tsm_ds.data.synthetic.presets import DIFFICULTIES

__all__ = ["RECIPES", "Recipe", "StudySettings", "QUICK", "RunSpec", "plan_sweep", "plan_grid", "plan_headroom",
           "write_recipe", "warmup_steps_for", "COST_S", "estimate_seconds"]


@dataclass(frozen=True)
class Recipe:
    """One of the four recipes: ``template`` (a shipped recipe name), ``rule`` (``none``,
    ``linear``, ``sqrt``: :func:`tsm_ds.engine.config.resolve.scaled_lr`), ``label`` (for tables)."""

    template: str
    rule: str
    label: str


RECIPES: dict[str, Recipe] = {
    "sgd_fixed": Recipe("cpu_sgd_cosine", "none", "(a) SGD, lr tuned at the base batch, no scaling"),
    "sgd_linear": Recipe("cpu_sgd_cosine", "linear", "(b) SGD, linear rule + warm-up"),
    "lars": Recipe("cpu_lars", "linear", "(c) LARS, linear rule + warm-up"),
    "lamb": Recipe("cpu_lamb", "sqrt", "(d) LAMB, square-root rule + warm-up"),
}


_HARD = DIFFICULTIES["hard"]


@dataclass(frozen=True)
class StudySettings:
    """Size and recipe values of a study (the defaults are the full study).

    Attributes:
        batches: global batches, ascending; the first is the base batch (lrs are chosen there).
        micro_batch: clips per micro-batch (every batch must be a multiple of it).
        min_steps: optimizer steps the largest batch must get at least (sets the epochs).
        train_per_class, val_per_class: demo clips per class (the training set must be a
            multiple of the largest batch; the final evaluation scores every validation clip).
        difficulty: the name of the generator preset the fields below came from
            (:data:`tsm_ds.data.synthetic.DIFFICULTIES`; recorded in the report, a label only:
            the fields are what the data is made with). classes, num_frames, size (pixels),
            speed (px/frame), radius (px), noise (sigma), distractor_prob, clutter, contrast,
            tint: the generator's fields (:func:`tsm_ds.data.synthetic.make_demo_dataset`);
            data_seed: the dataset's seed.
        arch, num_segments (T), img_size (crop side, pixels), shift_div, dropout: the model.
        warmup_fraction: linear warm-up length as a fraction of each run's optimizer steps.
        sgd_lrs: the lrs tried at the base batch for (a) / (b) (at most 4). Default: 0.003 alone,
            carried over from the sweep on the first version of the hard task (0.001: 85.4 %,
            0.003: 86.2 %; a pilot at 0.01 learned far slower), not re-swept on the current one.
        lars_base_lr, lamb_base_lr: (c) / (d) lr at the base batch (carried over from the previous, easy
            study's pilot; not re-tuned on the hard task).
        seeds: training seeds; every seed runs at the base and the largest batch, the first one
            at every batch.
        eval_every: train.py ``--eval-every`` of every run ("0.25": four evaluations per epoch,
            the time-to-accuracy resolution); eval_max_clips: ``--eval-max-clips`` (intermediate
            evaluations score a fixed seeded subset; the last one always the whole set).
        headroom: epochs factor of one extra base-batch SGD run at the chosen lr and first seed
            (the calibration check "a longer run still gains"); 0: no such run.
        parallel: runs at a time; threads: OMP threads per run; num_workers: DataLoader workers;
        cache_decoded: train.py ``--cache-decoded``.
    """

    batches: tuple[int, ...] = (8, 64, 512)
    micro_batch: int = 8
    min_steps: int = 50
    train_per_class: int = 640
    val_per_class: int = 250
    difficulty: str = "hard"
    classes: tuple[str, ...] = _HARD["classes"]
    num_frames: int = _HARD["num_frames"]
    size: int = _HARD["size"]
    speed: tuple[float, float] = _HARD["speed"]
    radius: tuple[float, float] = _HARD["radius"]
    noise: tuple[float, float] = _HARD["noise"]
    distractor_prob: float = _HARD["distractor_prob"]
    clutter: float = _HARD["clutter"]
    contrast: float = _HARD["contrast"]
    tint: float = _HARD["tint"]
    data_seed: int = 0
    arch: str = "resnet18"
    num_segments: int = 4
    img_size: int = 32
    shift_div: int = 8
    dropout: float = 0.0
    warmup_fraction: float = 0.1
    sgd_lrs: tuple[float, ...] = (0.003,)
    lars_base_lr: float = 0.5
    lamb_base_lr: float = 0.005
    seeds: tuple[int, ...] = (0, 1)
    eval_every: str = "0.25"
    eval_max_clips: int | None = 500
    headroom: int = 4
    parallel: int = 2
    threads: int = 1
    num_workers: int = 0
    cache_decoded: bool = True

    @property
    def base_batch(self) -> int:
        """The smallest global batch, where the lrs are chosen."""
        return self.batches[0]

    @property
    def train_clips(self) -> int:
        """Training clips of the dataset."""
        return self.train_per_class * len(self.classes)

    @property
    def val_clips(self) -> int:
        """Validation clips of the dataset (the final evaluation of every run scores them all)."""
        return self.val_per_class * len(self.classes)

    @property
    def epochs(self) -> int:
        """Epochs of every run: enough for ``min_steps`` optimizer steps at the largest batch."""
        return math.ceil(self.min_steps * self.batches[-1] / self.train_clips)

    def generator(self) -> dict[str, Any]:
        """The keyword arguments of :func:`tsm_ds.data.synthetic.make_demo_dataset` for this study
        (every generator field, recorded in the report as they are)."""
        return {"seed": self.data_seed, "classes": tuple(self.classes), "train_per_class": self.train_per_class,
                "val_per_class": self.val_per_class, "num_frames": self.num_frames, "size": self.size,
                "speed": tuple(self.speed), "radius": tuple(self.radius), "noise": tuple(self.noise),
                "distractor_prob": self.distractor_prob, "clutter": self.clutter, "contrast": self.contrast,
                "tint": self.tint}

    def check(self) -> None:
        """Refuse settings the study cannot run (ValueError naming the value and the fix)."""
        b = list(self.batches)
        if not b or b != sorted(set(b)):
            raise ValueError(f"batches {self.batches}: give distinct global batches in ascending order")
        bad = [x for x in b if x % self.micro_batch]
        if bad:
            raise ValueError(f"batches {bad} are not multiples of the micro-batch {self.micro_batch}")
        if self.train_clips % b[-1]:
            raise ValueError(f"{self.train_clips} training clips is not a multiple of the largest batch {b[-1]}: "
                             f"change train_per_class (every batch must see the same clips)")
        if not 1 <= len(self.sgd_lrs) <= 4:
            raise ValueError(f"sgd_lrs {self.sgd_lrs}: sweep 1 to 4 lrs at the base batch")
        if not self.seeds or not 0 <= self.warmup_fraction < 1 or self.min_steps < 1 or self.parallel < 1:
            raise ValueError("need >= 1 seed, 0 <= warmup_fraction < 1, min_steps >= 1, parallel >= 1")
        if self.num_frames <= self.num_segments:
            raise ValueError(f"num_frames {self.num_frames} must exceed num_segments {self.num_segments}")
        if self.headroom < 0 or self.headroom == 1:
            raise ValueError(f"headroom {self.headroom}: give an epochs factor >= 2, or 0 for no headroom run")
        if self.eval_max_clips is not None and self.eval_max_clips < 1:
            raise ValueError(f"eval_max_clips {self.eval_max_clips}: give >= 1 clips, or None for the whole set")
        from tsm_ds.config.cadence import parse_eval_every

        parse_eval_every(self.eval_every)


#: ``--quick``: the plumbing (batches, accumulation, lrs, the sweep, intermediate evaluations, the
#: report), not accuracy: 16 tiny clips of the demo's 4 classes, 2 batches, micro-batch 2, one seed, no headroom run,
#: 5 to 7 runs of a few steps (45 s idle)
QUICK = StudySettings(batches=(2, 8), micro_batch=2, min_steps=2, train_per_class=4, val_per_class=1,
                      classes=DIFFICULTIES["demo"]["classes"], difficulty="quick (demo classes, hard fields)",
                      num_frames=8, size=32, speed=(1.0, 1.5), radius=(4.0, 6.0), num_segments=2,
                      img_size=32, sgd_lrs=(0.01,), seeds=(0,), eval_every="0.5", eval_max_clips=2, headroom=0,
                      parallel=2)


def warmup_steps_for(settings: StudySettings, batch: int, epochs_factor: int = 1) -> int:
    """Linear warm-up steps of a run at global ``batch`` over ``epochs_factor`` x the study's
    epochs: ``warmup_fraction`` of its optimizer steps, rounded (0 when the fraction is 0, else at
    least 1)."""
    steps = epochs_factor * settings.epochs * settings.train_clips // batch
    if settings.warmup_fraction <= 0:
        return 0
    return max(1, round(settings.warmup_fraction * steps))


@dataclass(frozen=True)
class RunSpec:
    """One training run: ``name`` (its run folder), the engine JSON ``recipe_file``, ``batch``,
    ``seed``, ``recipes``: the recipe names it stands for (both SGD recipes at the base batch;
    ``()`` for the headroom run, which stands for none), ``base_lr``, and ``epochs_factor``: its
    epochs are this many times the study's (1, or ``headroom`` for the headroom run)."""

    name: str
    recipe_file: str
    batch: int
    seed: int
    recipes: tuple[str, ...]
    base_lr: float
    epochs_factor: int = 1


def write_recipe(out_dir: Path, name: str, template: str, rule: str, base_lr: float, base_batch: int) -> Path:
    """Write ``<out_dir>/recipes/<name>.json``: shipped recipe ``template`` with
    ``tsm_ds.lr_scaling = {rule, base_lr, base_batch}``; nothing else changes. Returns the path.

    Raises:
        tsm_ds.engine.config.recipes.ConfigError: no such shipped recipe.
    """
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.utils.io import atomic_write_text

    cfg: dict[str, Any] = load_config(template)
    cfg["_comment"] = (f"tsm-ds bench large-batch: ds_configs/{template}.json with tsm_ds.lr_scaling "
                       f"{rule} from lr {base_lr:g} at {base_batch} clips. " + str(cfg.get("_comment", "")))
    cfg.setdefault("tsm_ds", {})["lr_scaling"] = {"rule": rule, "base_lr": float(base_lr),
                                                  "base_batch": int(base_batch)}
    path = Path(out_dir) / "recipes" / f"{name}.json"
    atomic_write_text(path, json.dumps(cfg, indent=2) + "\n")
    return path


def _lr_tag(lr: float) -> str:
    return f"{lr:g}"


def plan_sweep(settings: StudySettings, out_dir: Path) -> list[RunSpec]:
    """The base-batch SGD runs, one per lr of ``sgd_lrs``, first seed (engine JSONs written)."""
    b0, seed = settings.base_batch, settings.seeds[0]
    specs = []
    for lr in settings.sgd_lrs:
        f = write_recipe(out_dir, f"sgd_lr{_lr_tag(lr)}", RECIPES["sgd_fixed"].template, "none", lr, b0)
        specs.append(RunSpec(f"sgd_lr{_lr_tag(lr)}_b{b0}_s{seed}", str(f), b0, seed, ("sgd_fixed", "sgd_linear"), lr))
    return specs


def plan_grid(settings: StudySettings, out_dir: Path, sgd_lr: float | None,
              recipes: tuple[str, ...] = tuple(RECIPES)) -> list[RunSpec]:
    """Every run of ``recipes`` once the SGD lr is chosen (the sweep's run at the base batch and
    first seed included, so that the caller can find it already done); engine JSONs written.
    ``sgd_lr`` may be None when ``recipes`` holds no SGD recipe.

    Seeds: every seed at the base and the largest batch, the first seed at the others.

    Raises:
        ValueError: an SGD recipe without ``sgd_lr``.
    """
    b0 = settings.base_batch
    sgd = [r for r in recipes if r.startswith("sgd_")]
    if sgd and sgd_lr is None:
        raise ValueError("plan_grid: the SGD recipes need the lr chosen by the sweep")
    base_lrs = {"sgd_fixed": sgd_lr, "sgd_linear": sgd_lr, "lars": settings.lars_base_lr,
                "lamb": settings.lamb_base_lr}
    files = {r: write_recipe(out_dir, r, RECIPES[r].template, RECIPES[r].rule, base_lrs[r], b0) for r in recipes}
    if sgd:
        sgd_base = write_recipe(out_dir, f"sgd_lr{_lr_tag(sgd_lr)}", RECIPES["sgd_fixed"].template, "none",
                                sgd_lr, b0)
    specs: list[RunSpec] = []
    for batch in settings.batches:
        seeds = settings.seeds if batch in (b0, settings.batches[-1]) else settings.seeds[:1]
        for seed in seeds:
            if batch == b0 and sgd:   # (a) and (b) coincide at the base batch: one run for both
                specs.append(RunSpec(f"sgd_lr{_lr_tag(sgd_lr)}_b{b0}_s{seed}", str(sgd_base), b0, seed,
                                     tuple(sgd), sgd_lr))
            for r in recipes:
                if batch == b0 and r in sgd:
                    continue
                specs.append(RunSpec(f"{r}_b{batch}_s{seed}", str(files[r]), batch, seed, (r,), base_lrs[r]))
    return specs


def plan_headroom(settings: StudySettings, out_dir: Path, sgd_lr: float) -> RunSpec | None:
    """The headroom run: base-batch SGD at the chosen lr, first seed, ``headroom`` x the epochs
    (same engine JSON as the sweep's run; warm-up the same fraction of its own steps). None when
    ``settings.headroom`` is 0."""
    if not settings.headroom:
        return None
    b0, seed = settings.base_batch, settings.seeds[0]
    f = write_recipe(out_dir, f"sgd_lr{_lr_tag(sgd_lr)}", RECIPES["sgd_fixed"].template, "none", sgd_lr, b0)
    return RunSpec(f"sgd_lr{_lr_tag(sgd_lr)}_b{b0}_s{seed}_x{settings.headroom}", str(f), b0, seed, (), sgd_lr,
                   epochs_factor=settings.headroom)


#: per-unit costs of :func:`estimate_seconds` in seconds of one core (resnet18 T=4 at 32 px, one
#: thread, the other core busy; docs/large-batch.md): ``train_clip`` one clip's forward + backward
#: (micro-batch 8), ``opt_step`` one optimizer step (the guard's checks, gradient clipping, the
#: update), ``eval_clip`` one evaluated clip, ``decode_video`` one video into the
#: ``--cache-decoded`` cache, ``run_start`` a run's start-up. Split by a cProfile of a batch-8 run
#: (forward + backward 66 %, optimizer step 19 %, DeepSpeed's all-reduce at one rank 15 %, since
#: skipped) and scaled to the batch-8 sweep runs of the first hard task (900-909 s for 25,600
#: clips, all-reduce included).
COST_S = {"train_clip": 0.0196, "opt_step": 0.046, "eval_clip": 0.004, "decode_video": 0.012, "run_start": 15.0}


def _eval_points(settings: StudySettings, epochs: int, batch: int) -> int:
    """Intermediate evaluations of a run of ``epochs`` epochs at ``batch`` (the last one excluded)."""
    from fractions import Fraction

    from tsm_ds.config.cadence import parse_eval_every

    kind, value = parse_eval_every(settings.eval_every)
    steps_per_epoch = settings.train_clips // batch
    if kind == "epoch":
        per_epoch = 1
    elif kind == "steps":
        per_epoch = max(1, steps_per_epoch // int(value))
    else:
        per_epoch = max(1, int(1 / Fraction(value)))
    return max(0, per_epoch * epochs - 1)


def estimate_seconds(settings: StudySettings, recipes: tuple[str, ...] = tuple(RECIPES),
                     cost: dict[str, float] | None = None) -> dict[str, Any]:
    """The study's CPU time from per-unit costs (:data:`COST_S`): every run's training clips and
    optimizer steps, evaluated clips (intermediate evaluations capped at ``eval_max_clips``, the last one on the
    whole set), decoded videos and start-up, summed, then over ``parallel`` runs at a time.

    Returns:
        {"runs": int (the sweep, the grid and the headroom run, each once), "train_clips": int,
        "opt_steps": int, "eval_clips": int, "cpu_s": float (one core), "wall_s": float (cpu_s / parallel, the
        longest run at least: the runs are independent processes on ``parallel`` cores)}.
    """
    c = {**COST_S, **(cost or {})}
    s = settings
    b0, last = s.base_batch, s.batches[-1]
    sgd = any(r.startswith("sgd_") for r in recipes)
    other = len([r for r in recipes if not r.startswith("sgd_")])
    runs: list[tuple[int, int]] = [(b0, 1)] * (len(s.sgd_lrs) if sgd else 0)     # (batch, epochs factor)
    for b in s.batches:
        seeds = len(s.seeds) if b in (b0, last) else 1
        per_seed = (int(sgd) + other) if b == b0 else len(recipes)
        runs += [(b, 1)] * (seeds * per_seed)
    if sgd:
        runs.remove((b0, 1))                  # the chosen sweep run is a grid run
        if s.headroom:
            runs.append((b0, s.headroom))
    val = s.val_clips
    cap = min(val, s.eval_max_clips or val)
    train = sum(f * s.epochs * s.train_clips for _, f in runs)
    steps = sum(f * s.epochs * s.train_clips // b for b, f in runs)
    evals = sum(_eval_points(s, f * s.epochs, b) * cap + val for b, f in runs)
    per_run = [f * s.epochs * s.train_clips * (c["train_clip"] + c["opt_step"] / b) for b, f in runs]
    cpu = (train * c["train_clip"] + steps * c["opt_step"] + evals * c["eval_clip"]
           + len(runs) * ((s.train_clips + val) * c["decode_video"] + c["run_start"]))
    return {"runs": len(runs), "train_clips": train, "opt_steps": steps, "eval_clips": evals, "cpu_s": cpu,
            "wall_s": max(cpu / s.parallel, max(per_run, default=0.0))}
