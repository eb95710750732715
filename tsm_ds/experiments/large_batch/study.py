"""The study from end to end: data, the base-batch SGD lr sweep, the grid, the report.

Finished runs are kept as ``<out>/rows/<run>.json``; a second call with the same settings reuses
every run whose command is unchanged (a long study that was stopped goes on where it was).
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .grid import RECIPES, RunSpec, StudySettings, plan_grid, plan_sweep
from .study_report import aggregate, plot_study, points_table, sweep_table, verdict_lines, verdicts
from .runs import read_run, run_env, run_one, train_command

__all__ = ["PILOT_TOP1", "choose_lr", "run_study"]

#: the pilot's bar: (b) at the base batch must reach this val top-1 (%) for the grid to mean anything
PILOT_TOP1 = 80.0


def choose_lr(sweep_rows: Sequence[dict]) -> tuple[float, str]:
    """The SGD lr for (a) / (b): the highest last-epoch val top-1 among completed sweep runs (ties:
    the higher best-epoch top-1, then the smaller lr). Returns (lr, why). With no completed run:
    the smallest lr tried, and why says so.

    Raises:
        ValueError: no sweep rows.
    """
    if not sweep_rows:
        raise ValueError("choose_lr: no sweep runs")
    done = [r for r in sweep_rows if r["status"] == "completed" and r["val_top1"] is not None]
    if not done:
        lr = min(r["base_lr"] for r in sweep_rows)
        return lr, f"no sweep run completed; the smallest lr {lr:g} is used"
    best = max(done, key=lambda r: (r["val_top1"], r["best_val_top1"] or 0.0, -r["base_lr"]))
    return best["base_lr"], (f"highest val top-1 at the base batch ({best['val_top1']:.1f}%) of "
                             f"{len(sweep_rows)} lrs tried")


def _runner(settings: StudySettings, data: Mapping[str, Any], out: Path, env: Mapping[str, str], *,
            overwrite: bool, keep_checkpoints: bool, log: Callable[[str], Any]) -> Callable[[Sequence[RunSpec]], list]:
    from tsm_ds.utils.io import atomic_write_text

    rows_dir, run_root, log_dir = out / "rows", out / "runs", out / "logs"
    counter = {"done": 0}

    def one(spec: RunSpec, total: int) -> dict:
        cmd = train_command(spec, settings, data, run_root)
        cached = rows_dir / f"{spec.name}.json"
        if not overwrite and cached.is_file():
            try:
                row = json.loads(cached.read_text())
            except ValueError:
                row = None
            if row and row.get("cmd") == cmd and row.get("status") in ("completed", "diverged"):
                if (run_root / spec.name / "config.json").is_file():
                    row.update(read_run(run_root / spec.name))   # read back again: the files are the truth
                counter["done"] += 1
                log(f"[{counter['done']}/{total}] {spec.name}: recorded in {cached}")
                return row
        row = run_one(spec, cmd, run_root, log_dir, env, keep_checkpoints=keep_checkpoints)
        atomic_write_text(cached, json.dumps(row, indent=2) + "\n")
        counter["done"] += 1
        top1 = f"val top-1 {row['val_top1']:.1f}%" if row["val_top1"] is not None else row["status"]
        extra = f" at step {row['diverged_at']}" if row["status"] == "diverged" else ""
        log(f"[{counter['done']}/{total}] {spec.name}: {top1}{extra} ({row['steps']} steps of {row['global_batch']} "
            f"clips = {row['micro_batch']} x {row['accum']}, lr {row['lr']}, {row['wall_s']:.0f} s)")
        return row

    def run_many(specs: Sequence[RunSpec]) -> list[dict]:
        counter["done"] = 0
        with ThreadPoolExecutor(max_workers=settings.parallel) as pool:
            return list(pool.map(lambda s: one(s, len(specs)), specs))

    return run_many


def run_study(out: str | Path, settings: StudySettings = StudySettings(), *,
              recipes: Sequence[str] = tuple(RECIPES), overwrite: bool = False, keep_checkpoints: bool = False,
              record: Mapping[str, Any] | None = None, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Generate the demo data, sweep the SGD lr at the base batch, run the grid, write the report.

    Args:
        out: output folder: ``data/``, ``recipes/`` (the engine JSONs), ``runs/``, ``logs/``,
            ``rows/``, ``large_batch.json`` / ``.md`` / ``.png``.
        settings: the study's size and values (:class:`StudySettings`; ``QUICK`` for ``--quick``).
        recipes: subset of :data:`RECIPES`.
        overwrite: rerun runs already recorded in ``rows/``.
        keep_checkpoints: keep every run's checkpoints and exported models (deleted otherwise).
        record: stored as ``args`` in the JSON (the command line).
        log: progress lines.

    Returns:
        {"settings", "data", "sweep" (rows), "sgd_lr", "sgd_lr_why", "rows" (every run), "points",
        "verdicts", "pilot", "json", "md", "png", "total_wall_s", "markdown"}.

    Raises:
        ValueError: bad settings or recipe names.
        tsm_ds.engine.recipes.ConfigError: a template recipe is not shipped.
    """
    from tsm_ds.data.synthetic import make_demo_dataset
    from tsm_ds.utils.io import atomic_write_text, machine_info

    settings.check()
    bad = [r for r in recipes if r not in RECIPES]
    if bad or not recipes:
        raise ValueError(f"recipes {list(recipes)}: use a non-empty subset of {', '.join(RECIPES)}")
    recipes = [r for r in RECIPES if r in recipes]
    out = Path(out).resolve()
    t0 = time.perf_counter()
    s = settings
    data = make_demo_dataset(out / "data", seed=s.data_seed, classes=s.classes, train_per_class=s.train_per_class,
                             val_per_class=s.val_per_class, num_frames=s.num_frames, size=s.size, speed=s.speed,
                             radius=s.radius, workers=s.parallel)
    chance = 100.0 / len(s.classes)
    log(f"data: {data['root']} ({s.train_clips} training clips, {s.val_per_class * len(s.classes)} validation; "
        f"{time.perf_counter() - t0:.0f} s); every run: {s.epochs} epochs = {s.epochs * s.train_clips} clips, "
        f"batches {list(s.batches)} (micro-batch {s.micro_batch}), "
        f"largest batch {s.epochs * s.train_clips // s.batches[-1]} steps")
    run_many = _runner(s, data, out, run_env(s), overwrite=overwrite, keep_checkpoints=keep_checkpoints, log=log)

    # first the SGD sweep and the recipes that do not depend on its outcome, in one pool
    sgd = tuple(r for r in recipes if r.startswith("sgd_"))
    other = tuple(r for r in recipes if r not in sgd)
    sweep_specs = plan_sweep(s, out) if sgd else []
    if sgd:
        log(f"SGD lr sweep at batch {s.base_batch}: {', '.join(f'{x:g}' for x in s.sgd_lrs)}")
    first = run_many(sweep_specs + (plan_grid(s, out, None, other) if other else []))
    sweep, rows = first[:len(sweep_specs)], first[len(sweep_specs):]
    sgd_lr, why = None, "no SGD recipe in the study"
    if sgd:
        sgd_lr, why = choose_lr(sweep)
        log(f"SGD lr {sgd_lr:g}: {why}")
        rows = run_many(plan_grid(s, out, sgd_lr, sgd)) + rows   # the chosen sweep run is reused

    points = aggregate(rows, recipes, s.batches)
    v = verdicts(points, s.base_batch, chance)
    base_b = next((p for p in points if p["recipe"] == "sgd_linear" and p["batch"] == s.base_batch), None)
    pilot = {"criterion": f"(b) at batch {s.base_batch} reaches {PILOT_TOP1:.0f}% val top-1",
             "top1": base_b["mean_top1"] if base_b else None,
             "passed": bool(base_b and base_b["mean_top1"] is not None and base_b["mean_top1"] >= PILOT_TOP1)}
    total = round(time.perf_counter() - t0, 1)
    unique = {r["name"]: r for r in [*sweep, *rows]}
    run_sum = round(sum(float(r["wall_s"]) for r in unique.values()), 1)
    title = (f"TSM {s.arch} T={s.num_segments} {s.img_size}px, motion demo data, "
             f"{s.epochs * s.train_clips} clips per run, micro-batch {s.micro_batch}")
    png = plot_study(points, out / "large_batch.png", chance=chance, title=title)
    lr_rule = "; ".join(f"{r}: {RECIPES[r].template} rule {RECIPES[r].rule}" for r in recipes)
    md = "\n".join([
        "# tsm-ds bench large-batch", "", title + f"; world size 1; chance {chance:.0f}%.", "",
        f"SGD lr sweep at batch {s.base_batch} ({len(sweep)} runs, counted below): {why}.", "",
        sweep_table(sweep, sgd_lr) if sweep else "(no sweep)\n",
        "Val top-1 after the last epoch against the global batch (only the documented rules change the lr: "
        f"{lr_rule}; warm-up {s.warmup_fraction:.0%} of each run's steps, cosine decay):", "",
        points_table(points), *verdict_lines(v, s.batches), "",
        f"Pilot: {pilot['criterion']}: {'-' if pilot['top1'] is None else format(pilot['top1'], '.1f') + '%'} "
        f"({'passed' if pilot['passed'] else 'NOT passed'}).",
        f"{len(unique)} runs, {s.parallel} at a time with {s.threads} thread(s) each: {run_sum:.0f} s of run "
        f"wall time in all (runs reused from rows/ included); this invocation {total:.0f} s.", ""])
    payload = {"name": "large_batch", "settings": asdict(s), "recipes": recipes, "data": data, "chance_top1": chance,
               "sweep": sweep, "sgd_lr": sgd_lr, "sgd_lr_why": why, "points": points, "verdicts": v,
               "pilot": pilot, "rows": rows, "total_wall_s": total, "run_wall_sum_s": run_sum, "args": dict(record or {}),
               "machine": machine_info()}
    json_path = atomic_write_text(out / "large_batch.json", json.dumps(payload, indent=2, default=str) + "\n")
    md_path = atomic_write_text(out / "large_batch.md", md)
    return {**payload, "json": json_path, "md": md_path, "png": png, "markdown": md}
