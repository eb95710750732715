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

from .grid import RECIPES, RunSpec, StudySettings, estimate_seconds, plan_grid, plan_headroom, plan_sweep
from .runs import read_run, run_env, run_one, same_command, train_command
from .study_report import (
    aggregate,
    calibration,
    plot_study,
    points_table,
    projection,
    readme_table,
    runs_table,
    sweep_table,
    target_top1,
    verdict_lines,
    verdicts,
)

__all__ = ["PILOT_TOP1", "choose_lr", "run_study", "publish"]

#: the pilot's bar: (b) at the base batch must reach this val top-1 (%) for the grid to mean anything
#: (the calibration range's floor: a task may be calibrated and still be hard)
PILOT_TOP1 = 60.0


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
            if row and same_command(row.get("cmd"), cmd) and row.get("status") in ("completed", "diverged"):
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
              calibrate_only: bool = False, results_dir: str | Path | None = None,
              record: Mapping[str, Any] | None = None, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Generate the demo data, sweep the SGD lr at the base batch, run the headroom run and the
    grid, write the report.

    Args:
        out: output folder: ``data/``, ``recipes/`` (the engine JSONs), ``runs/``, ``logs/``,
            ``rows/``, ``large_batch.json`` / ``.md`` / ``.png``.
        settings: the study's size and values (:class:`StudySettings`; ``QUICK`` for ``--quick``).
        recipes: subset of :data:`RECIPES`.
        overwrite: rerun runs already recorded in ``rows/``.
        keep_checkpoints: keep every run's checkpoints and exported models (deleted otherwise).
        calibrate_only: run the SGD sweep and the headroom run only (the task's calibration, the
            study's first part: ~1.0 h of the 2.2 h, the headroom run alone after the sweep), report
            them, stop; a later call without it reuses both.
        results_dir: also copy ``large_batch.json`` / ``.md`` / ``.png`` there (a tracked folder,
            e.g. ``results/large_batch``; see :func:`publish`); None: only ``out``.
        record: stored as ``args`` in the JSON (the command line).
        log: progress lines.

    Returns:
        {"settings", "generator", "data", "sweep" (rows), "sgd_lr", "sgd_lr_why", "headroom" (row
        or None), "rows" (every grid run), "target_top1", "points", "verdicts", "pilot",
        "calibration", "projection", "estimate", "json", "md", "png", "published", "total_wall_s",
        "markdown"}.

    Raises:
        ValueError: bad settings or recipe names; calibrate_only without an SGD recipe.
        tsm_ds.engine.config.recipes.ConfigError: a template recipe is not shipped.
    """
    from tsm_ds.data.synthetic import make_demo_dataset
    from tsm_ds.utils.io import atomic_write_text, machine_info

    settings.check()
    bad = [r for r in recipes if r not in RECIPES]
    if bad or not recipes:
        raise ValueError(f"recipes {list(recipes)}: use a non-empty subset of {', '.join(RECIPES)}")
    recipes = [r for r in RECIPES if r in recipes]
    sgd = tuple(r for r in recipes if r.startswith("sgd_"))
    if calibrate_only and not sgd:
        raise ValueError("calibrate_only: the calibration is the SGD sweep and headroom run; keep an SGD recipe")
    out = Path(out).resolve()
    t0 = time.perf_counter()
    s = settings
    gen = s.generator()
    est = estimate_seconds(s, tuple(recipes))
    data = make_demo_dataset(out / "data", **gen, workers=s.parallel)
    chance = 100.0 / len(s.classes)
    log(f"data: {data['root']} (difficulty {s.difficulty!r}: {s.train_clips} training clips, {s.val_clips} "
        f"validation; {time.perf_counter() - t0:.0f} s); every run: {s.epochs} epochs = {s.epochs * s.train_clips} "
        f"clips, batches {list(s.batches)} (micro-batch {s.micro_batch}), largest batch "
        f"{s.epochs * s.train_clips // s.batches[-1]} steps; estimate for the whole study: {est['runs']} runs, "
        f"{est['cpu_s'] / 3600:.1f} h of one core, {est['wall_s'] / 3600:.1f} h at {s.parallel} at a time")
    run_many = _runner(s, data, out, run_env(s), overwrite=overwrite, keep_checkpoints=keep_checkpoints, log=log)

    # first the SGD sweep and the recipes that do not depend on its outcome, in one pool
    other = tuple(r for r in recipes if r not in sgd)
    sweep_specs = plan_sweep(s, out) if sgd else []
    if sgd:
        log(f"SGD lr sweep at batch {s.base_batch}: {', '.join(f'{x:g}' for x in s.sgd_lrs)}")
    first = run_many(sweep_specs + (plan_grid(s, out, None, other) if other and not calibrate_only else []))
    sweep, rows = first[:len(sweep_specs)], first[len(sweep_specs):]
    sgd_lr, why, headroom = None, "no SGD recipe in the study", None
    if sgd:
        sgd_lr, why = choose_lr(sweep)
        log(f"SGD lr {sgd_lr:g}: {why}")
        head = plan_headroom(s, out, sgd_lr)
        grid = [] if calibrate_only else plan_grid(s, out, sgd_lr, sgd)
        done = run_many(([head] if head else []) + grid)     # the longest run first; the chosen sweep run is reused
        headroom = done[0] if head else None
        rows = done[1 if head else 0:] + rows
    calib = calibration(sweep, headroom, sgd_lr, factor=s.headroom)
    log(f"calibration: {calib['text']}")

    target = target_top1(rows if not calibrate_only else sweep, s.base_batch)
    points = aggregate(rows, recipes, s.batches, target)
    v = verdicts(points, s.base_batch, chance)
    proj = projection(points, s.base_batch, s.batches[-1])
    base_b = next((p for p in points if p["recipe"] == "sgd_linear" and p["batch"] == s.base_batch), None)
    pilot = {"criterion": f"(b) at batch {s.base_batch} reaches {PILOT_TOP1:.0f}% val top-1",
             "top1": base_b["mean_top1"] if base_b else None,
             "passed": bool(base_b and base_b["mean_top1"] is not None and base_b["mean_top1"] >= PILOT_TOP1)}
    total = round(time.perf_counter() - t0, 1)
    unique = {r["name"]: r for r in [*sweep, *rows, *([headroom] if headroom else [])]}
    run_sum = round(sum(float(r["wall_s"]) for r in unique.values()), 1)
    title = (f"TSM {s.arch} T={s.num_segments} {s.img_size}px, motion demo data ({s.difficulty}), "
             f"{s.epochs * s.train_clips} clips per run, micro-batch {s.micro_batch}")
    png = plot_study(points, out / "large_batch.png", chance=chance, title=title)
    lr_rule = "; ".join(f"{r}: {RECIPES[r].template} rule {RECIPES[r].rule}" for r in recipes)
    gen_text = ", ".join(f"{k} {list(v_) if isinstance(v_, tuple) else v_}" for k, v_ in gen.items())
    tgt = "-" if target is None else f"{target:.1f}%"
    md = "\n".join([
        "# tsm-ds bench large-batch" + (" (calibration only)" if calibrate_only else ""), "",
        title + f"; world size 1; chance {chance:.0f}%.", "",
        f"Data: difficulty {s.difficulty!r}, generator fields: {gen_text}; {s.val_clips} validation clips (every "
        f"run's last evaluation scores them all; evaluations every {s.eval_every} epoch(s) in between score "
        f"{s.eval_max_clips or 'all'} of them).", "",
        f"SGD lr sweep at batch {s.base_batch} ({len(sweep)} runs, counted below): {why}.", "",
        sweep_table(sweep, sgd_lr) if sweep else "(no sweep)\n",
        f"Calibration: {calib['text']} ({'passed' if calib['passed'] else 'NOT passed'}).", "",
        "Final val top-1 against the global batch (only the documented rules change the lr: "
        f"{lr_rule}; warm-up {s.warmup_fraction:.0%} of each run's steps, cosine decay); time-to-accuracy "
        f"target {tgt} (95% of the best batch-{s.base_batch} final top-1):", "",
        points_table(points), *verdict_lines(v, s.batches, points), "",
        "Per recipe, global batch and seed (docs/large-batch.md):", "", readme_table(points),
        f"Projection: {proj['text']}", "",
        "Every run:", "", runs_table(list(unique.values()), target),
        f"Pilot: {pilot['criterion']}: {'-' if pilot['top1'] is None else format(pilot['top1'], '.1f') + '%'} "
        f"({'passed' if pilot['passed'] else 'NOT passed'}).",
        f"{len(unique)} runs, {s.parallel} at a time with {s.threads} thread(s) each: {run_sum:.0f} s of run "
        f"wall time in all (runs reused from rows/ included); this invocation {total:.0f} s; estimated beforehand "
        f"for the whole study: {est['wall_s']:.0f} s.", ""])
    payload = {"name": "large_batch", "settings": asdict(s), "generator": gen, "recipes": recipes, "data": data,
               "chance_top1": chance, "calibrate_only": calibrate_only, "sweep": sweep, "sgd_lr": sgd_lr,
               "sgd_lr_why": why, "headroom": headroom, "calibration": calib, "target_top1": target,
               "points": points, "verdicts": v, "projection": proj, "pilot": pilot, "rows": rows,
               "estimate": est, "total_wall_s": total, "run_wall_sum_s": run_sum, "args": dict(record or {}),
               "machine": machine_info()}
    json_path = atomic_write_text(out / "large_batch.json", json.dumps(payload, indent=2, default=str) + "\n")
    md_path = atomic_write_text(out / "large_batch.md", md)
    published = publish(out, results_dir) if results_dir else []
    return {**payload, "json": json_path, "md": md_path, "png": png, "markdown": md, "published": published}


def publish(out: str | Path, results_dir: str | Path) -> list[Path]:
    """Copy ``large_batch.json`` / ``.md`` / ``.png`` from ``out`` into ``results_dir`` (created),
    atomically, for committing (``bench_out/`` is ignored by git; ``results/large_batch/`` is not).
    The JSON's paths still name ``out``; the runs' folders are not copied.

    Returns:
        The paths written (files missing from ``out`` are skipped).

    Raises:
        OSError: ``results_dir`` cannot be written.
    """
    from tsm_ds.utils.io import atomic_path

    dst = Path(results_dir)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("large_batch.json", "large_batch.md", "large_batch.png"):
        src = Path(out) / name
        if src.is_file():
            with atomic_path(dst / name, suffix=src.suffix) as tmp:
                Path(tmp).write_bytes(src.read_bytes())
            written.append(dst / name)
    return written
