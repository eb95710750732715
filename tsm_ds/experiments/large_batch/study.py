"""The study from end to end: data, the stages of runs (:data:`.grid.STAGES`), the report.

Finished runs are kept as ``<out>/rows/<run>.json`` as soon as each ends; a second call with the
same settings reuses every run whose command is unchanged (a study stopped part-way goes on where
it was; a run cut off part-way starts again from its step 0). The report is built from the rows
recorded so far (:func:`write_report`), so a study in progress can be reported and published
(``--report-only``) while it runs, and says how many of its runs have landed.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .grid import RECIPES, STAGE_NEEDS, STAGES, RunSpec, StudySettings, estimate_seconds, estimate_text, plan_stage
from .runs import portable, read_run, run_env, run_one, same_command, train_command
from .study_report import (
    TARGET_FRACTION,
    calibration,
    choose_lr,
    isolation,
    plot_study,
    readme_table,
    sweep_table,
    verdict_table,
    verdicts,
)

__all__ = ["run_study", "run_stages", "write_report", "publish", "recorded_rows", "chosen_lrs", "plan_all"]


def recorded_rows(out: Path) -> list[dict]:
    """Every row recorded in ``<out>/rows/`` (completed, diverged or failed), by name."""
    rows = []
    for p in sorted((Path(out) / "rows").glob("*.json")):
        try:
            rows.append(json.loads(p.read_text()))
        except ValueError:
            continue
    return rows


def chosen_lrs(rows: Sequence[dict], settings: StudySettings, recipes: Sequence[str]) -> dict[str, Any]:
    """The lr each recipe's sweep chose from ``rows`` (None while its sweep is incomplete):
    {recipe: {"lr", "why", "done" (runs of the sweep recorded), "of" (its size)}}."""
    out = {}
    for rc in recipes:
        at = settings.base_batch if RECIPES[rc].tuned_at == "base" else settings.largest
        lrs = settings.lrs(rc)
        sweep = [r for r in rows if r.get("recipe") == rc and r["batch"] == at and r["seed"] == settings.seeds[0]
                 and r.get("role") == "sweep" and any(abs(float(r["lr_swept"]) - x) < 1e-12 for x in lrs)]
        lr, why = choose_lr(sweep) if len(sweep) == len(lrs) else (None, f"sweep {len(sweep)} of {len(lrs)} runs")
        out[rc] = {"lr": lr, "why": why, "done": len(sweep), "of": len(lrs)}
    return out


def plan_all(settings: StudySettings, out: Path, rows: Sequence[dict], recipes: Sequence[str]) -> list[RunSpec]:
    """Every run the study plans given ``rows`` (the unconditional stages with the lrs chosen so
    far, and the conditional ones whose condition holds), in stage order."""
    ch = {k: v["lr"] for k, v in chosen_lrs(rows, settings, recipes).items()}
    v = verdicts(rows, ch, base_batch=settings.base_batch, largest=settings.largest, val_clips=settings.val_clips,
                 chance=100.0 / len(settings.classes), recipes=recipes, seeds=settings.seeds)
    one = [rc for rc in ("lars", "lamb") if rc in v and v[rc]["first_seed"] == "pass" and v[rc]["base_complete"]]
    failed = "sgd" in v and v["sgd"]["verdict"] == "fail"
    specs: list[RunSpec] = []
    for st in STAGES:
        specs += plan_stage(settings, out, st, ch, recipes, passes_on_one=one, sgd_failed=failed)
    return specs


def _runner(settings: StudySettings, data: Mapping[str, Any], out: Path, env: Mapping[str, str], *,
            overwrite: bool, keep_checkpoints: bool, log: Callable[[str], Any]) -> Callable[[RunSpec], dict]:
    from tsm_ds.utils.io import atomic_write_text

    rows_dir, run_root = out / "rows", Path("runs")

    def one(spec: RunSpec) -> dict:
        cmd = train_command(spec, settings, data, run_root)
        cached = rows_dir / f"{spec.name}.json"
        if not overwrite and cached.is_file():
            try:
                row = json.loads(cached.read_text())
            except ValueError:
                row = None
            if row and same_command(row.get("cmd"), portable(cmd, out)) and row.get("status") in ("completed",
                                                                                                  "diverged"):
                if (out / "runs" / spec.name / "config.json").is_file():
                    row.update(read_run(out / "runs" / spec.name))   # read back again: the files are the truth
                return row
        log(f"{spec.name}: starting ({spec.stage}, batch {spec.batch}, seed {spec.seed})")
        row = run_one(spec, cmd, out, env, keep_checkpoints=keep_checkpoints)
        atomic_write_text(cached, json.dumps(row, indent=2) + "\n")
        top1 = f"val top-1 {row['val_top1']:.1f}%" if row["val_top1"] is not None else row["status"]
        extra = f" at step {row['diverged_at']}" if row["status"] == "diverged" else ""
        log(f"{spec.name}: {top1}{extra} ({row['steps']} steps of {row['global_batch']} clips = "
            f"{row['micro_batch']} x {row['accum']}, lr {row['lr']}, {row['wall_s']:.0f} s)")
        return row

    return one


def run_stages(plan: Callable[[str], Sequence[RunSpec]], run: Callable[[RunSpec], dict], *, parallel: int,
               stage_done: Callable[[str], Any] = lambda stage: None, log: Callable[[str], Any] = print,
               stages: Sequence[str] = STAGES, needs: Mapping[str, Sequence[str]] = STAGE_NEEDS) -> None:
    """Run the study's stages on ``parallel`` workers, each stage planned as soon as the stages it
    needs (:data:`.grid.STAGE_NEEDS`) have ended, so that independent stages share the workers: on
    2 cores the LARS / LAMB sweeps run beside the last SGD sweep run instead of after it. Runs
    start in :data:`.grid.STAGES` order among the stages planned; with ``parallel`` 1 that is the
    stages one after another, in that order.

    Args:
        plan: a stage's runs, from the rows recorded when it is called (``plan_all`` filtered).
        run: one run (returns its row; records it).
        parallel: runs at a time (>= 1).
        stage_done: called with a stage's name once all its runs have ended (the report); not
            for a stage planned with no run.
        log: progress lines ("stage NAME: N run(s): ...").

    Raises:
        ValueError: ``parallel`` < 1, or a stage needs one that is not in ``stages``.
        Exception: whatever ``run`` raised (the runs already started end first).
    """
    if parallel < 1:
        raise ValueError(f"parallel {parallel}: need >= 1")
    missing = {s: d for s in stages for d in needs.get(s, ()) if d not in stages}
    if missing:
        raise ValueError(f"stages {missing} need stages that are not run")
    queued: dict[str, list[RunSpec]] = {}
    had_runs: set[str] = set()
    running: dict[Future, str] = {}
    ended: set[str] = set()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        while True:
            changed = True
            while changed:   # plan every stage that became ready; end every planned stage with no run left
                changed = False
                for st in stages:
                    if st not in queued and all(d in ended for d in needs.get(st, ())):
                        queued[st] = list(plan(st))
                        if queued[st]:
                            had_runs.add(st)
                            log(f"stage {st}: {len(queued[st])} run(s): {', '.join(x.name for x in queued[st])}")
                        changed = True
                    if st in queued and st not in ended and not queued[st] and st not in running.values():
                        ended.add(st)
                        if st in had_runs:
                            stage_done(st)
                        changed = True
            for st in stages:   # fill the free workers in stage order
                while st in queued and queued[st] and len(running) < parallel:
                    running[pool.submit(run, queued[st].pop(0))] = st
            if not running:
                return
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in done:
                running.pop(f)
                f.result()


def run_study(out: str | Path, settings: StudySettings = StudySettings(), *,
              recipes: Sequence[str] = tuple(RECIPES), overwrite: bool = False, keep_checkpoints: bool = False,
              report_only: bool = False, results_dir: str | Path | None = None,
              record: Mapping[str, Any] | None = None, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Generate the demo data, run the stages (:func:`run_stages`: each stage planned from the rows
    recorded once the stages it needs have ended: the sweeps choose the lrs of the later stages),
    write the report after every stage.

    Args:
        out: output folder: ``data/``, ``recipes/`` (the engine JSONs), ``runs/``, ``logs/``,
            ``rows/``, ``large_batch.json`` / ``.md`` / ``.png``. Runs start in it (their commands'
            paths are relative to it).
        settings: the study's size and values (:class:`StudySettings`; ``QUICK`` for ``--quick``).
        recipes: subset of :data:`RECIPES`.
        overwrite: rerun runs already recorded in ``rows/``.
        keep_checkpoints: keep every run's checkpoints and exported models (deleted otherwise).
        report_only: run nothing: the report of the rows recorded so far (a study in progress).
        results_dir: also copy the report there (:func:`publish`); None: only ``out``.
        record: stored as ``args`` in the JSON (the command line).
        log: progress lines.

    Returns:
        :func:`write_report`'s payload with "json", "md", "png", "markdown", "published".

    Raises:
        ValueError: bad settings or recipe names.
        tsm_ds.engine.config.recipes.ConfigError: a template recipe is not shipped.
    """
    from tsm_ds.data.synthetic import make_demo_dataset

    settings.check()
    bad = [r for r in recipes if r not in RECIPES]
    if bad or not recipes:
        raise ValueError(f"recipes {list(recipes)}: use a non-empty subset of {', '.join(RECIPES)}")
    recipes = [r for r in RECIPES if r in recipes]
    out = Path(out).resolve()
    t0 = time.perf_counter()
    s = settings
    data = make_demo_dataset(out / "data", **s.generator(), workers=max(1, s.parallel))
    rel = {k: (portable(v, out) if k != "classes" else v) for k, v in data.items()}
    log(f"data: {rel['root']} (difficulty {s.difficulty!r}: {s.train_clips} training clips, {s.val_clips} "
        f"validation; {time.perf_counter() - t0:.0f} s); {s.regime()['text']}; every run {s.epochs} epochs; "
        f"estimate: {estimate_text(s, recipes)}")
    if not report_only:
        env = run_env(s, ops_dir=out / "torch_extensions")
        one = _runner(s, rel, out, env, overwrite=overwrite, keep_checkpoints=keep_checkpoints, log=log)
        run_stages(lambda st: [x for x in plan_all(s, out, recorded_rows(out), recipes) if x.stage == st], one,
                   parallel=s.parallel, log=log,
                   stage_done=lambda st: write_report(out, s, recipes, data=rel, record=record, t0=t0))
    res = write_report(out, s, recipes, data=rel, record=record, t0=t0)
    res["published"] = publish(out, results_dir) if results_dir else []
    return res


def write_report(out: Path, settings: StudySettings, recipes: Sequence[str], *, data: Mapping[str, Any],
                 record: Mapping[str, Any] | None = None, t0: float | None = None) -> dict[str, Any]:
    """Write ``large_batch.json`` / ``.md`` / ``.png`` into ``out`` from the rows recorded so far
    (a partial study reports what has landed and says so). Every string is :func:`portable`.

    Returns:
        {"settings", "regime", "generator", "recipes", "data", "chance_top1", "chosen" (per recipe:
        lr, why), "base_top1", "target_top1", "verdicts", "calibration", "isolation", "rows" (every recorded
        run of this study's plan), "planned" (run names planned now), "landed", "planned_total",
        "complete", "estimate", "run_wall_sum_s", "args", "machine", "json", "md", "png", "markdown"}.
    """
    from tsm_ds.utils.io import atomic_write_text, machine_info

    s, out = settings, Path(out)
    all_rows = recorded_rows(out)
    planned = plan_all(s, out, all_rows, recipes)
    names = {p.name for p in planned}
    rows = [r for r in all_rows if r["name"] in names]
    est = estimate_seconds(s, recipes)
    total = est["runs"] + len([p for p in planned if p.stage in ("seeds", "isolate")])
    chance = 100.0 / len(s.classes)
    ch = chosen_lrs(rows, s, recipes)
    lrs = {k: v["lr"] for k, v in ch.items()}
    v = verdicts(rows, lrs, base_batch=s.base_batch, largest=s.largest, val_clips=s.val_clips, chance=chance,
                 recipes=recipes, seeds=s.seeds)
    base_top1 = v["sgd"]["base_mean"] if "sgd" in v else None
    target = None if base_top1 is None else TARGET_FRACTION * base_top1
    calib = calibration(rows, lrs.get("sgd"), base_batch=s.base_batch, headroom=s.headroom)
    iso = isolation(rows, v.get("sgd", {}), lrs.get("sgd"), base_batch=s.base_batch, largest=s.largest,
                    headroom=s.headroom)    # empty unless (a) failed
    landed = len(rows)
    complete = landed >= total and all(d["verdict"] != "pending" for d in v.values())
    status = ("complete" if complete else f"**study in progress: {landed} of {total} runs**")
    title = (f"TSM {s.arch} T={s.num_segments} {s.img_size}px, motion demo data ({s.difficulty}), "
             f"{s.epochs} epochs = {s.epochs * s.train_clips} clips per run")
    png = plot_study(rows, out / "large_batch.png", chance=chance, title=title)
    sweeps = []
    for rc in recipes:
        at = s.base_batch if RECIPES[rc].tuned_at == "base" else s.largest
        sweeps += [f"{RECIPES[rc].label}: {ch[rc]['why']}.", "", sweep_table(rows, rc, at, ch[rc]["lr"])]
    run_sum = round(sum(float(r.get("wall_s") or 0) for r in rows), 1)
    tgt = "-" if target is None else f"{target:.1f}%"
    md = "\n".join([
        "# tsm-ds bench large-batch", "", f"{title}; world size 1; chance {chance:.1f}%. Status: {status}.", "",
        f"Regime: {s.regime()['text']}. Warm-up {s.warmup_epochs:g} epochs above the base batch "
        f"(`--warmup-epochs`), none at it; cosine decay.", "",
        f"Data: {s.train_clips} training and {s.val_clips} validation clips (every run's last evaluation scores "
        f"them all; evaluations every {s.eval_every} epoch before it score {s.eval_max_clips or 'all'}).", "",
        "Sweeps:", "", *sweeps,
        f"Calibration: {calib['text']}.", "",
        f"Verdicts at batch {s.largest} (pass: at most max(1 point, 2 SE) below the base, no seed diverged or at "
        f"chance):", "", verdict_table(v, s.largest), *([iso["text"], ""] if iso["text"] else []),
        f"Every run (time-to-accuracy target {tgt}, {TARGET_FRACTION:.0%} of the base's final top-1):", "",
        readme_table(rows, target),
        f"{landed} of {total} planned runs recorded; {run_sum:.0f} s of run wall time; estimate for the whole "
        f"study: {estimate_text(s, recipes)}.", ""])
    payload = portable({
        "name": "large_batch", "version": 2, "settings": asdict(s), "regime": s.regime(), "generator": s.generator(),
        "recipes": list(recipes), "data": dict(data), "chance_top1": chance, "chosen": ch, "base_top1": base_top1,
        "target_top1": target, "verdicts": v, "calibration": calib, "isolation": iso, "rows": rows,
        "planned": [p.name for p in planned], "landed": landed, "planned_total": total, "complete": complete,
        "status": status.replace("*", ""), "estimate": est, "run_wall_sum_s": run_sum,
        "report_s": None if t0 is None else round(time.perf_counter() - t0, 1), "args": _args(record),
        "machine": machine_info()}, out)
    json_path = atomic_write_text(out / "large_batch.json", json.dumps(payload, indent=2, default=str) + "\n")
    md_path = atomic_write_text(out / "large_batch.md", md)
    return {**payload, "json": json_path, "md": md_path, "png": png, "markdown": md}


def _args(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The command line's values with its folders relative to the working folder (an absolute
    folder elsewhere is recorded by its name only: no path of this machine in the report)."""
    import os

    out = {}
    for k, v in dict(record or {}).items():
        if isinstance(v, str) and os.path.isabs(v):
            rel = os.path.relpath(v)
            v = rel if not rel.startswith("..") else f"<elsewhere>/{Path(v).name}"
        out[k] = v
    return out


def publish(out: str | Path, results_dir: str | Path) -> list[Path]:
    """Copy ``large_batch.json`` / ``.md`` / ``.png`` and every ``rows/*.json`` from ``out`` into
    ``results_dir`` (``rows/`` there), atomically, for committing (``bench_out/`` is ignored by git).
    The files hold no absolute path (:func:`portable`: relative to ``out``).

    Returns:
        The paths written (files missing from ``out`` are skipped).

    Raises:
        OSError: ``results_dir`` cannot be written.
    """
    from tsm_ds.utils.io import atomic_path

    src_dir, dst = Path(out).resolve(), Path(results_dir)
    (dst / "rows").mkdir(parents=True, exist_ok=True)
    written = []
    names = ["large_batch.json", "large_batch.md", "large_batch.png"]
    names += [f"rows/{p.name}" for p in sorted((src_dir / "rows").glob("*.json"))]
    for name in names:
        src = src_dir / name
        if not src.is_file():
            continue
        data = src.read_bytes()
        if name.startswith("rows/"):
            data = (json.dumps(portable(json.loads(data), src_dir), indent=2) + "\n").encode()
        with atomic_path(dst / name, suffix=src.suffix) as tmp:
            Path(tmp).write_bytes(data)
        written.append(dst / name)
    return written
