"""The study's settings, its three recipes, its runs in stages, and its cost estimate.

The regime is the paper's (Lin, Gan, Han, "Training Kinetics in 15 Minutes", arXiv:1910.00932,
Sec. 5: 12,288 clips a step, ~20 optimizer steps per Kinetics epoch, the linear rule and a 5-epoch
gradual warm-up of Goyal et al. 2017, Sec. 2.1-2.2), in miniature on the motion demo data:

- the largest batch is >= 32x the base batch (8 / 64 / 256 by default), with >= 20 optimizer steps
  per epoch and >= 300 optimizer steps there (5,120 training clips, 15 epochs: 300 steps of 256);
- every run sees the same clips (``epochs`` x training clips), at world size 1: the global batch
  is a micro-batch x gradient accumulation; BatchNorm normalises over ``ghost_bn_clips`` (8) clips
  at every batch, as the paper's 8 clips per GPU (``--ghost-bn-clips`` inside the larger
  micro-batch of the large batches, which is cheaper per clip on a CPU: docs/large-batch.md);
- warm-up in epochs, not a fraction of the run: ``warmup_epochs`` (5, Goyal et al. Sec. 2.2) at
  every batch above the base batch (``--warmup-epochs``), none at the base batch (the rule does
  not raise the lr there: Goyal et al.'s reference has none);
- the same cosine decay for the three recipes, so that only the optimizer and its lr differ.

Recipes (each an engine JSON derived from a shipped recipe, written into ``<out>/recipes/``):

- ``sgd`` (a), the paper's: ``ds_configs/cpu_sgd_large_batch.json`` (SGD momentum 0.9, the linear
  rule, no weight decay on BatchNorm and biases; its zero-init residual gamma off for every run:
  ``StudySettings.zero_init_residual``), its base lr swept at the
  base batch over ``sgd_lrs`` (3 values a factor 2 apart) and scaled linearly to every batch;
- ``lars`` (b): ``ds_configs/cpu_lars.json`` (You, Gitman, Ginsburg 2017; every group adapted,
  trust ratio clipped at the lr), its lr swept at the largest batch over ``lars_lrs``, as LARS
  papers state their lrs at a large batch;
- ``lamb`` (c): ``ds_configs/cpu_lamb.json`` (You et al. 2020), its lr swept at the largest batch
  over ``lamb_lrs``.

Stages (:func:`plan_stage`): 1 the SGD sweep at the base batch; 2 SGD at the largest batch and the
second seeds; 3 the LARS and LAMB sweeps; 4 the base batch's 2x-longer run (is the base near
convergence?); 5 SGD at the batches in between; 6 a second seed for a LARS / LAMB verdict that
passes on one; 7 if (a) fails, two runs that isolate the cause (half the lr; twice the epochs).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tsm_ds.data.synthetic.presets import DIFFICULTIES

__all__ = ["RECIPES", "Recipe", "StudySettings", "QUICK", "RunSpec", "STAGES", "STAGE_NEEDS", "plan_stage",
           "write_recipe", "warmup_steps_for", "COST_S", "run_seconds", "estimate_seconds", "estimate_text", "lr_tag"]


@dataclass(frozen=True)
class Recipe:
    """One of the three recipes: ``template`` (a shipped recipe name), ``rule`` (``linear``,
    ``sqrt``: :func:`tsm_ds.engine.config.resolve.scaled_lr`), ``label`` (for tables), ``tuned_at``:
    ``"base"`` (the lr is swept at the base batch and scaled by the rule) or ``"largest"`` (swept at
    the largest batch, where the recipe is used)."""

    template: str
    rule: str
    label: str
    tuned_at: str


RECIPES: dict[str, Recipe] = {
    "sgd": Recipe("cpu_sgd_large_batch", "linear", "(a) SGD, linear rule + 5-epoch warm-up (the paper's)", "base"),
    "lars": Recipe("cpu_lars", "linear", "(b) LARS, lr swept at the largest batch", "largest"),
    "lamb": Recipe("cpu_lamb", "sqrt", "(c) LAMB, lr swept at the largest batch", "largest"),
}

_HARD = DIFFICULTIES["hard"]


@dataclass(frozen=True)
class StudySettings:
    """Size and recipe values of a study (the defaults are the full study).

    Attributes:
        batches: global batches, ascending; the first is the base batch, the last the largest.
        micro_batch: clips per micro-batch at the base batch (every batch is a multiple of it).
        max_micro_batch: clips per micro-batch at the larger batches (min(batch, this)); BatchNorm
            there normalises over ``ghost_bn_clips`` clips (``--ghost-bn-clips``).
        ghost_bn_clips: clips per BatchNorm group at every batch (the paper: 8 per GPU).
        min_steps: optimizer steps the largest batch must get at least (sets the epochs).
        min_steps_per_epoch: optimizer steps per epoch the largest batch must get at least (the
            paper: ~20 per Kinetics epoch at 12,288 clips; sets the training set's floor).
        min_ratio: largest / base batch at least (the regime's check; the paper's is 1,536).
        train_per_class, val_per_class: demo clips per class (the final evaluation of every run
            scores every validation clip).
        difficulty: the generator preset's name (:data:`tsm_ds.data.synthetic.DIFFICULTIES`, a
            label); classes, num_frames, size (px), speed (px/frame), radius (px), noise (sigma),
            distractor_prob, clutter, contrast, tint, data_seed: the generator's fields.
        arch, num_segments (T), img_size (crop side, px), shift_div, dropout: the model.
        warmup_epochs: the linear warm-up above the base batch, in epochs (Goyal et al. 2017,
            Sec. 2.2: 5); none at the base batch.
        zero_init_residual: train.py ``--zero-init-residual`` of every run ("off"). Goyal et al.'s
            zero gamma closes every residual branch at the start, and TSM's shift lives in the
            residual branch (``blockres``): from scratch on this task, where only the order of frames
            tells the classes apart, SGD at lr 0.005 sat at chance with it (12.8 % at step 960,
            19.2 % after all 9,600) and reached 49.2 % at step 960 without it (2026-12-05 pilots,
            docs/large-batch.md). The paper fine-tunes from ImageNet weights, where the trainer
            never zero-inits.
        sgd_lrs: (a)'s lrs at the base batch (3, a factor 2 apart), set after a pilot at 0.0025
            (about Goyal et al.'s 0.1 per 256 clips) sat at chance for 2,880 steps, a failure later
            traced to the zero gamma (``zero_init_residual``), not to the lr; the recipe test's 0.02
            at batch 8 learns its easy task.
        lars_lrs, lamb_lrs: (b) / (c) lrs at the largest batch (LARS: up to the linear rule from
            the lr 0.5 that learned best at batch 8 in the study of 2026-12-02, 16 at 256; LAMB:
            around the square-root rule from that study's 0.005 at 8, 0.028 at 256, lower first as
            its pilots at 512 favoured the lower lrs).
        seeds: training seeds: (a) runs every seed at the base and the largest batch; the others
            the first seed (a second one where a verdict passes on one: stage 6).
        eval_every: train.py ``--eval-every`` (time-to-accuracy resolution); eval_max_clips:
            ``--eval-max-clips`` of the intermediate evaluations (the last one scores every clip).
        headroom: epochs factor of the base batch's longer run ((a), chosen lr, first seed: is the
            base near convergence?); 0: none.
        isolate: run stage 7 (two runs isolating the cause) when (a) fails.
        parallel: runs at a time; threads: OMP threads per run; num_workers: DataLoader workers;
        cache_decoded: train.py ``--cache-decoded``.
    """

    batches: tuple[int, ...] = (8, 64, 256)
    micro_batch: int = 8
    max_micro_batch: int = 64
    ghost_bn_clips: int = 8
    min_steps: int = 300
    min_steps_per_epoch: int = 20
    min_ratio: int = 32
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
    warmup_epochs: float = 5.0
    zero_init_residual: str = "off"
    sgd_lrs: tuple[float, ...] = (0.005, 0.01, 0.02)
    lars_lrs: tuple[float, ...] = (4.0, 8.0, 16.0)
    lamb_lrs: tuple[float, ...] = (0.005, 0.01, 0.02)
    seeds: tuple[int, ...] = (0, 1)
    eval_every: str = "0.5"
    eval_max_clips: int | None = 500
    headroom: int = 2
    isolate: bool = True
    parallel: int = 1
    threads: int = 1
    num_workers: int = 0
    cache_decoded: bool = True

    @property
    def base_batch(self) -> int:
        """The smallest global batch (where (a)'s lr is swept)."""
        return self.batches[0]

    @property
    def largest(self) -> int:
        """The largest global batch (where the verdicts are, and (b) / (c)'s lrs are swept)."""
        return self.batches[-1]

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
        return math.ceil(self.min_steps * self.largest / self.train_clips)

    def steps_per_epoch(self, batch: int) -> int:
        """Optimizer steps per epoch at global ``batch`` (the training set is a multiple of it)."""
        return self.train_clips // batch

    def micro_for(self, batch: int) -> int:
        """The micro-batch of a run at global ``batch``: ``micro_batch`` at the base batch, else
        min(batch, ``max_micro_batch``)."""
        return self.micro_batch if batch == self.base_batch else min(batch, self.max_micro_batch)

    def ghost_for(self, batch: int) -> int | None:
        """``--ghost-bn-clips`` of a run at ``batch`` (None: the micro-batch is the BatchNorm group)."""
        return self.ghost_bn_clips if self.micro_for(batch) > self.ghost_bn_clips else None

    def warmup_epochs_for(self, batch: int) -> float:
        """``--warmup-epochs`` of a run at ``batch``: 0 at the base batch, ``warmup_epochs`` above."""
        return 0.0 if batch == self.base_batch else float(self.warmup_epochs)

    def regime(self) -> dict[str, Any]:
        """The paper's regime, checked: {"ratio", "steps_per_epoch", "steps" (at the largest batch),
        "bn_clips", "ok", "text"}; ``ok`` when ratio >= ``min_ratio``, steps per epoch >=
        ``min_steps_per_epoch`` and steps >= ``min_steps``."""
        ratio = self.largest // self.base_batch
        spe = self.steps_per_epoch(self.largest)
        steps = spe * self.epochs
        ok = ratio >= self.min_ratio and spe >= self.min_steps_per_epoch and steps >= self.min_steps
        text = (f"largest batch {self.largest} = {ratio}x the base {self.base_batch} (wanted >= {self.min_ratio}x); "
                f"{spe} optimizer steps per epoch there (>= {self.min_steps_per_epoch}), {steps} in all "
                f"(>= {self.min_steps}); BatchNorm over {self.ghost_bn_clips} clips at every batch")
        return {"ratio": ratio, "steps_per_epoch": spe, "steps": steps, "bn_clips": self.ghost_bn_clips, "ok": ok,
                "text": text}

    def generator(self) -> dict[str, Any]:
        """The keyword arguments of :func:`tsm_ds.data.synthetic.make_demo_dataset` for this study."""
        return {"seed": self.data_seed, "classes": tuple(self.classes), "train_per_class": self.train_per_class,
                "val_per_class": self.val_per_class, "num_frames": self.num_frames, "size": self.size,
                "speed": tuple(self.speed), "radius": tuple(self.radius), "noise": tuple(self.noise),
                "distractor_prob": self.distractor_prob, "clutter": self.clutter, "contrast": self.contrast,
                "tint": self.tint}

    def lrs(self, recipe: str) -> tuple[float, ...]:
        """The swept lrs of ``recipe`` (KeyError: not a recipe)."""
        return {"sgd": self.sgd_lrs, "lars": self.lars_lrs, "lamb": self.lamb_lrs}[recipe]

    def check(self) -> None:
        """Refuse settings the study cannot run (ValueError naming the value and the fix)."""
        b = list(self.batches)
        if len(b) < 2 or b != sorted(set(b)):
            raise ValueError(f"batches {self.batches}: give 2 or more distinct global batches in ascending order")
        bad = [x for x in b if x % self.micro_batch or x % self.micro_for(x)]
        if bad:
            raise ValueError(f"batches {bad} are not multiples of the micro-batch {self.micro_batch} "
                             f"(and of max_micro_batch {self.max_micro_batch} above it)")
        if self.max_micro_batch % self.ghost_bn_clips or self.micro_batch % self.ghost_bn_clips:
            raise ValueError(f"ghost_bn_clips {self.ghost_bn_clips} must divide micro_batch {self.micro_batch} "
                             f"and max_micro_batch {self.max_micro_batch}")
        if self.train_clips % b[-1]:
            raise ValueError(f"{self.train_clips} training clips is not a multiple of the largest batch {b[-1]}: "
                             f"change train_per_class (every batch must see the same clips)")
        for name in ("sgd_lrs", "lars_lrs", "lamb_lrs"):
            if not 1 <= len(getattr(self, name)) <= 4:
                raise ValueError(f"{name} {getattr(self, name)}: sweep 1 to 4 lrs")
        if not self.seeds or self.warmup_epochs < 0 or self.min_steps < 1 or self.parallel < 1:
            raise ValueError("need >= 1 seed, warmup_epochs >= 0, min_steps >= 1, parallel >= 1")
        if self.num_frames <= self.num_segments:
            raise ValueError(f"num_frames {self.num_frames} must exceed num_segments {self.num_segments}")
        if self.headroom < 0 or self.headroom == 1:
            raise ValueError(f"headroom {self.headroom}: give an epochs factor >= 2, or 0 for no longer run")
        if self.eval_max_clips is not None and self.eval_max_clips < 1:
            raise ValueError(f"eval_max_clips {self.eval_max_clips}: give >= 1 clips, or None for the whole set")
        from tsm_ds.config.cadence import parse_eval_every

        parse_eval_every(self.eval_every)


#: ``--quick``: the plumbing (stages, batches, accumulation, ghost BatchNorm, lrs, sweeps, the
#: report), not accuracy: 16 tiny clips of the demo's 4 classes, batches 2 / 8 (micro-batch 2, then
#: 4 with ghost BatchNorm over 2), one seed, no longer run, 2 lrs per recipe, a few steps per run
QUICK = StudySettings(batches=(2, 8), micro_batch=2, max_micro_batch=4, ghost_bn_clips=2, min_steps=2,
                      min_steps_per_epoch=1, min_ratio=4, train_per_class=4, val_per_class=1,
                      classes=DIFFICULTIES["demo"]["classes"], difficulty="quick (demo classes, hard fields)",
                      num_frames=8, size=32, speed=(1.0, 1.5), radius=(4.0, 6.0), num_segments=2, img_size=32,
                      warmup_epochs=0.5, sgd_lrs=(0.01, 0.02), lars_lrs=(1.0,), lamb_lrs=(0.01,), seeds=(0,),
                      eval_every="0.5", eval_max_clips=2, headroom=0, isolate=False, parallel=1)


def warmup_steps_for(settings: StudySettings, batch: int, epochs_factor: int = 1) -> int:
    """Optimizer steps of the linear warm-up of a run at global ``batch``, as the trainer resolves
    ``--warmup-epochs`` (:func:`tsm_ds.engine.config.resolve.warmup_steps_for`: epochs x steps per
    epoch, exact; 0 at the base batch). ``epochs_factor`` does not change it (epochs, not a fraction)."""
    from tsm_ds.engine.config.resolve import warmup_steps_for as resolve_warmup

    spe = settings.steps_per_epoch(batch)
    n, _ = resolve_warmup(flag_steps=None, flag_epochs=settings.warmup_epochs_for(batch), recipe_epochs=None,
                          lr_factor=1.0, steps_per_epoch=spe, total_steps=spe * settings.epochs * epochs_factor)
    return n


#: the study's stages in run order (see the module docstring)
STAGES = ("sgd_sweep", "sgd_grid", "sweeps", "headroom", "middle", "seeds", "isolate")

#: the stages whose rows each stage's plan reads: it is planned once they have all ended, and may
#: run beside the stages it does not need (the LARS / LAMB sweeps beside SGD's; ``--parallel``).
#: ``sgd_grid`` / ``headroom`` / ``middle``: SGD's chosen lr; ``seeds``: the (b) / (c) one-seed
#: verdicts (their sweeps and (a)'s two base seeds); ``isolate``: (a)'s verdict.
STAGE_NEEDS = {"sgd_sweep": (), "sgd_grid": ("sgd_sweep",), "sweeps": (), "headroom": ("sgd_sweep",),
               "middle": ("sgd_sweep",), "seeds": ("sgd_sweep", "sgd_grid", "sweeps"),
               "isolate": ("sgd_sweep", "sgd_grid")}


@dataclass(frozen=True)
class RunSpec:
    """One training run: ``name`` (its run folder), ``recipe`` (a key of :data:`RECIPES`), the
    engine JSON ``recipe_file``, global ``batch``, ``seed``, ``lr``: the recipe's swept lr (at the
    base batch for (a), at the largest batch for (b) / (c)), ``stage`` (:data:`STAGES`),
    ``epochs_factor`` (its epochs are this many times the study's), ``lr_mult`` (the isolation run's
    factor on the rule's lr: ``--lr``), ``role``: "sweep" (one lr of a sweep), "grid" (a chosen-lr
    run), "headroom" (the longer base run), "isolate"."""

    name: str
    recipe: str
    recipe_file: str
    batch: int
    seed: int
    lr: float
    stage: str
    epochs_factor: int = 1
    lr_mult: float = 1.0
    role: str = "grid"


def lr_tag(lr: float) -> str:
    """The lr as it appears in run names (``0.0025`` -> ``0.0025``, ``8.0`` -> ``8``)."""
    return f"{lr:g}"


def write_recipe(out_dir: Path, recipe: str, lr: float, settings: StudySettings) -> Path:
    """Write ``<out_dir>/recipes/<recipe>_lr<lr>.json``: the shipped template of ``recipe`` with its
    rule stated from ``lr`` at the batch it is tuned at (``tsm_ds.lr_scaling``) and the cosine
    schedule with a warm-up the trainer resolves (``warmup_steps`` "auto"; the run's
    ``--warmup-epochs`` sets it). Returns the path.

    Raises:
        tsm_ds.engine.config.recipes.ConfigError: no such shipped recipe.
    """
    from tsm_ds.engine.config.recipes import load_config
    from tsm_ds.utils.io import atomic_write_text

    r = RECIPES[recipe]
    at = settings.base_batch if r.tuned_at == "base" else settings.largest
    cfg: dict[str, Any] = load_config(r.template)
    cfg["_comment"] = (f"tsm-ds bench large-batch: ds_configs/{r.template}.json, {r.rule} rule from lr {lr:g} at "
                       f"{at} clips, cosine decay, warm-up by --warmup-epochs. " + str(cfg.get("_comment", "")))
    tsm = cfg.setdefault("tsm_ds", {})
    tsm["lr_scaling"] = {"rule": r.rule, "base_lr": float(lr), "base_batch": int(at)}
    tsm["lr_schedule"] = {"type": "cosine", "warmup_steps": "auto"}
    path = Path(out_dir) / "recipes" / f"{recipe}_lr{lr_tag(lr)}.json"
    atomic_write_text(path, json.dumps(cfg, indent=2) + "\n")
    return path


def _spec(settings: StudySettings, out: Path, recipe: str, lr: float, batch: int, seed: int, stage: str,
          role: str = "grid", epochs_factor: int = 1, lr_mult: float = 1.0, suffix: str = "") -> RunSpec:
    f = write_recipe(out, recipe, lr, settings)
    return RunSpec(f"{recipe}_lr{lr_tag(lr)}_b{batch}_s{seed}{suffix}", recipe, str(f), batch, seed, lr, stage,
                   epochs_factor, lr_mult, role)


def plan_stage(settings: StudySettings, out: Path, stage: str, chosen: Mapping[str, float | None],
               recipes: Sequence[str] = tuple(RECIPES), *, passes_on_one: Sequence[str] = (),
               sgd_failed: bool = False) -> list[RunSpec]:
    """The runs of one stage (engine JSONs written), in run order.

    Args:
        stage: one of :data:`STAGES`.
        chosen: the lr chosen by each recipe's sweep (absent / None: not chosen yet; the stages
            that need it are then empty).
        recipes: the recipes of the study.
        passes_on_one: (b) / (c) recipes whose one-seed verdict passes (stage ``seeds`` gives them a
            second seed at the largest batch).
        sgd_failed: (a) failed (stage ``isolate`` runs only then).

    Raises:
        ValueError: an unknown stage.
    """
    s, out = settings, Path(out)
    b0, top, s0 = s.base_batch, s.largest, s.seeds[0]
    sgd = chosen.get("sgd")
    if stage == "sgd_sweep":
        return [_spec(s, out, "sgd", lr, b0, s0, stage, "sweep") for lr in s.sgd_lrs] if "sgd" in recipes else []
    if stage == "sgd_grid":
        if "sgd" not in recipes or sgd is None:
            return []
        runs = [_spec(s, out, "sgd", sgd, top, s0, stage)]
        for seed in s.seeds[1:]:
            runs += [_spec(s, out, "sgd", sgd, b0, seed, stage), _spec(s, out, "sgd", sgd, top, seed, stage)]
        return runs
    if stage == "sweeps":
        return [_spec(s, out, r, lr, top, s0, stage, "sweep") for r in ("lars", "lamb") if r in recipes
                for lr in s.lrs(r)]
    if stage == "headroom":
        if "sgd" not in recipes or sgd is None or not s.headroom:
            return []
        return [_spec(s, out, "sgd", sgd, b0, s0, stage, "headroom", epochs_factor=s.headroom,
                      suffix=f"_x{s.headroom}")]
    if stage == "middle":
        if "sgd" not in recipes or sgd is None:
            return []
        return [_spec(s, out, "sgd", sgd, b, s0, stage) for b in s.batches[1:-1]]
    if stage == "seeds":
        return [_spec(s, out, r, chosen[r], top, seed, stage) for r in ("lars", "lamb")
                if r in recipes and r in passes_on_one and chosen.get(r) is not None for seed in s.seeds[1:]]
    if stage == "isolate":
        if not (s.isolate and sgd_failed and sgd is not None):
            return []
        return [_spec(s, out, "sgd", sgd, top, s0, stage, "isolate", lr_mult=0.5, suffix="_halflr"),
                _spec(s, out, "sgd", sgd, top, s0, stage, "isolate", epochs_factor=2, suffix="_x2")]
    raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")


#: per-unit costs of :func:`estimate_seconds` in seconds of one core (resnet18 T=4 at 32 px, one
#: OpenMP thread, through the trainer with --cache-decoded, one run at a time; measured 2026-12-05 on
#: the project's 2-core machine, shared with another session's tests: docs/large-batch.md, "Cost"):
#: ``train_clip`` one training clip at micro-batch 8 = global batch 8 (its optimizer step included:
#: 0.031 s over 300 steps while the cores were shared, 0.017 s in quiet stretches; 0.025 taken),
#: ``train_clip_large`` one clip at micro-batch 64 with ghost BatchNorm over 8 (0.0122 s over 8 steps
#: of 256, accumulation 4), ``opt_step`` one optimizer step above the base batch (in the clip costs;
#: 0), ``eval_clip`` one evaluated clip (0.0035 s), ``decode_video`` one video into the cache (68 s for
#: 7,120: 0.0096 s), ``run_start`` a run's start-up (imports, the engine; DeepSpeed's op already built).
COST_S = {"train_clip": 0.025, "train_clip_large": 0.0122, "opt_step": 0.0, "eval_clip": 0.0035,
          "decode_video": 0.0096, "run_start": 15.0}


def _eval_points(settings: StudySettings, epochs: int, batch: int) -> int:
    """Intermediate evaluations of a run of ``epochs`` epochs at ``batch`` (the last one excluded)."""
    from fractions import Fraction

    from tsm_ds.config.cadence import parse_eval_every

    kind, value = parse_eval_every(settings.eval_every)
    if kind == "epoch":
        per_epoch = 1
    elif kind == "steps":
        per_epoch = max(1, settings.steps_per_epoch(batch) // int(value))
    else:
        per_epoch = max(1, int(1 / Fraction(value)))
    return max(0, per_epoch * epochs - 1)


def run_seconds(settings: StudySettings, batch: int, epochs_factor: int = 1,
                cost: Mapping[str, float] | None = None) -> float:
    """Estimated seconds of one core for one run at ``batch`` (:data:`COST_S`, or ``cost``)."""
    c = {**COST_S, **(cost or {})}
    s = settings
    epochs = s.epochs * epochs_factor
    clips = epochs * s.train_clips
    per_clip = c["train_clip"] if s.micro_for(batch) <= s.micro_batch else c["train_clip_large"]
    cap = min(s.val_clips, s.eval_max_clips or s.val_clips)
    evals = _eval_points(s, epochs, batch) * cap + s.val_clips
    return (clips * per_clip + clips // batch * c["opt_step"] + evals * c["eval_clip"]
            + (s.train_clips + s.val_clips) * c["decode_video"] + c["run_start"])


def estimate_seconds(settings: StudySettings, recipes: Sequence[str] = tuple(RECIPES),
                     cost: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The study's time from per-unit costs (:data:`COST_S`): stages 1-5 (every run planned
    without a condition), and apart the conditional stages 6 (a second seed for each of (b) / (c))
    and 7 (the two isolation runs).

    Returns:
        {"runs": int, "train_clips": int, "opt_steps": int, "cpu_s": float (one core), "wall_s"
        (cpu_s / parallel, the longest run at least), "per_stage": {stage: seconds},
        "conditional_runs": int, "conditional_s": float (one core)}.
    """
    s = settings
    b0, top = s.base_batch, s.largest
    runs: list[tuple[str, int, int]] = []      # (stage, batch, epochs factor)
    if "sgd" in recipes:
        runs += [("sgd_sweep", b0, 1)] * len(s.sgd_lrs)
        runs += [("sgd_grid", top, 1)] + [("sgd_grid", b, 1) for _ in s.seeds[1:] for b in (b0, top)]
    runs += [("sweeps", top, 1)] * sum(len(s.lrs(r)) for r in ("lars", "lamb") if r in recipes)
    if "sgd" in recipes:
        runs += [("headroom", b0, s.headroom)] if s.headroom else []
        runs += [("middle", b, 1) for b in s.batches[1:-1]]
    cond = [("seeds", top, 1)] * (len(s.seeds[1:]) * len([r for r in ("lars", "lamb") if r in recipes]))
    cond += [("isolate", top, 1), ("isolate", top, 2)] if s.isolate and "sgd" in recipes else []
    secs = [run_seconds(s, b, f, cost) for _, b, f in runs]
    per_stage: dict[str, float] = {}
    for (st, _, _), x in zip(runs, secs):
        per_stage[st] = per_stage.get(st, 0.0) + x
    cpu = sum(secs)
    return {"runs": len(runs), "train_clips": sum(f * s.epochs * s.train_clips for _, _, f in runs),
            "opt_steps": sum(f * s.epochs * s.train_clips // b for _, b, f in runs), "cpu_s": cpu,
            "wall_s": max(cpu / s.parallel, max(secs, default=0.0)), "per_stage": per_stage,
            "conditional_runs": len(cond), "conditional_s": sum(run_seconds(s, b, f, cost) for _, b, f in cond)}


def estimate_text(settings: StudySettings, recipes: Sequence[str] = tuple(RECIPES)) -> str:
    """One sentence of :func:`estimate_seconds` (what ``--help`` and the study's log print)."""
    e = estimate_seconds(settings, recipes)
    return (f"{e['runs']} runs, {e['cpu_s'] / 3600:.1f} h of one core, {e['wall_s'] / 3600:.1f} h wall at "
            f"{settings.parallel} run(s) at a time; if needed, {e['conditional_runs']} more runs "
            f"(second seeds, isolation) {e['conditional_s'] / 3600:.1f} h")
