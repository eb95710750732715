"""The study from end to end: the data, the runs one after another, a row per run, the report.

Runs start one at a time in the study's folder, each ``python -m tsm_ds.train`` in its own process
(:func:`tsm_ds.experiments.large_batch.runs.run_one`: its row, read back from the files the trainer
wrote); the row is written to ``<out>/rows/<run>.json`` as soon as the run ends, with this study's
fields: the arm, the epoch factor, the evaluation timeline (:func:`.report.timeline`), the seconds per
step of each clip shape (:func:`.report.shape_times`). A second call with the same settings reuses
every row whose command is unchanged (a study stopped part-way goes on where it was; a run cut off
part-way starts again from step 0). The report is rebuilt from the rows after every run.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

from tsm_ds.experiments.large_batch.runs import portable, read_run, run_env, run_one, same_command
from tsm_ds.experiments.large_batch.study import recorded_rows  # the same rows/ folder layout

from .plan import (
    MGSettings,
    arms,
    check_runs,
    estimate_seconds,
    estimate_text,
    lb_settings,
    schedule_for,
    train_command,
    write_recipe,
)
from .report import SPEED_GOAL, run_metrics, runs_table, shape_times, shapes_table, timeline, verdict_table, verdicts

__all__ = ["recorded_rows", "run_study", "write_report", "publish", "REPORT_NAMES"]

#: the report's files in the output folder (and in ``--results-dir``)
REPORT_NAMES = ("multigrid.json", "multigrid.md")


def _history(run_dir: Path) -> list[dict]:
    try:
        return json.loads((run_dir / "result.json").read_text()).get("history") or []
    except (OSError, ValueError):
        return []


def _complete_row(row: dict, arm, settings: MGSettings, out: Path) -> dict:
    """The large-batch row of a run with this study's fields added (see the module docstring)."""
    t = settings.task
    run_dir = out / "runs" / arm.name
    row.update(arm=arm.arm, epoch_factor=arm.epoch_factor, mode=settings.mode if arm.multigrid else "none",
               timeline=timeline(_history(run_dir)),
               shapes=shape_times(run_dir, (t.num_segments, t.img_size, settings.base_batch)))
    sch = schedule_for(settings, arm.epoch_factor)
    row["schedule_epochs"] = settings.epochs if sch is None else sch.epochs
    return row


def run_study(out: str | Path, settings: MGSettings = MGSettings(), *, overwrite: bool = False,
              keep_checkpoints: bool = False, report_only: bool = False, results_dir: str | Path | None = None,
              record: Mapping[str, Any] | None = None, only: Collection[str] | None = None,
              log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Generate the large-batch study's data, run every arm and seed (:func:`.plan.arms`) one after
    another, write the report after every run.

    Args:
        out: output folder: ``data/``, ``recipes/``, ``runs/``, ``logs/``, ``rows/``, ``multigrid.json``
            / ``.md``; runs start in it (their commands' paths are relative to it).
        settings: :class:`~.plan.MGSettings` (``QUICK`` for ``--quick``).
        overwrite: rerun runs already recorded.
        keep_checkpoints: keep every run's checkpoints and models (deleted otherwise).
        report_only: run nothing: the report of the rows recorded so far.
        results_dir: also copy the report and the rows there (:func:`publish`), after every run.
        record: stored as ``args`` in the JSON (the command line).
        only: run only the runs of these names (``--runs``; None: every run): another process takes
            the others. Two processes must not be given the same run.
        log: progress lines.

    Returns:
        :func:`write_report`'s payload with "published" (paths copied).

    Raises:
        ValueError: settings the study cannot run (:meth:`MGSettings.check`); a name in ``only`` that is
            not a planned run.
    """
    from tsm_ds.data.synthetic import make_demo_dataset
    from tsm_ds.utils.io import atomic_write_text

    settings.check()
    check_runs(settings, only)
    out = Path(out).resolve()
    t0 = time.perf_counter()
    data = make_demo_dataset(out / "data", **settings.task.generator(), workers=1)
    rel = {k: (portable(v, out) if k != "classes" else v) for k, v in data.items()}
    log(f"data: {rel['root']} ({settings.train_clips} training clips, {settings.val_clips} validation; "
        f"{time.perf_counter() - t0:.0f} s); estimate: {estimate_text(settings)}")
    if not report_only:
        recipe = Path("recipes") / write_recipe(out, settings).name
        env = run_env(lb_settings(settings), ops_dir=out / "torch_extensions")
        for arm in arms(settings):
            if only is not None and arm.name not in only:
                continue
            cmd = train_command(arm, settings, recipe, rel, Path("runs"))
            cached = out / "rows" / f"{arm.name}.json"
            if not overwrite and cached.is_file():
                try:
                    old = json.loads(cached.read_text())
                except ValueError:
                    old = None
                if old and same_command(old.get("cmd"), portable(cmd, out)) and old.get("status") == "completed":
                    continue
            log(f"{arm.name}: starting ({arm.arm}, seed {arm.seed})")
            spec = _spec(arm, settings, recipe)
            row = _complete_row(run_one(spec, cmd, out, env, keep_checkpoints=keep_checkpoints), arm, settings, out)
            atomic_write_text(cached, json.dumps(portable(row, out), indent=2) + "\n")
            top1 = f"val top-1 {row['val_top1']:.1f}%" if row["val_top1"] is not None else row["status"]
            tl = row["timeline"]
            log(f"{arm.name}: {top1} ({row['steps']} steps, {tl[-1]['train_s'] if tl else '-'} s training, "
                f"{row['wall_s']:.0f} s process)")
            write_report(out, settings, data=rel, record=record, t0=t0)
            if results_dir:   # the rows land in the tracked folder as they land here
                publish(out, results_dir)
    res = write_report(out, settings, data=rel, record=record, t0=t0)
    res["published"] = publish(out, results_dir) if results_dir else []
    return res


def _spec(arm, settings: MGSettings, recipe: Path):
    from tsm_ds.experiments.large_batch.grid import RunSpec

    return RunSpec(arm.name, "sgd", str(recipe), settings.base_batch, arm.seed, settings.lr, arm.arm,
                   role="base" if not arm.multigrid else "multigrid")


def write_report(out: Path, settings: MGSettings, *, data: Mapping[str, Any], record: Mapping[str, Any] | None = None,
                 t0: float | None = None) -> dict[str, Any]:
    """Write ``multigrid.json`` / ``.md`` into ``out`` from the rows recorded so far (a study in
    progress says how many runs have landed). Every string is :func:`portable` (no path of this
    machine).

    Returns:
        {"settings", "schedules" (per arm: the stage table and steps), "rows", "verdicts", "landed",
        "planned_total", "complete", "status", "estimate", "run_wall_sum_s", "args", "machine", "json",
        "md", "markdown"}.
    """
    from tsm_ds.utils.io import atomic_write_text, machine_info

    out, s = Path(out), settings
    planned = arms(s)
    names = {a.name for a in planned}
    rows = [r for r in recorded_rows(out) if r.get("name") in names]
    for r in rows:   # files are the truth where the run folder is still there
        run_dir = out / "runs" / r["name"]
        if (run_dir / "config.json").is_file():
            r.update(read_run(run_dir))
    v = verdicts(rows, s)
    for r in rows:
        r["metrics"] = run_metrics(r, s, v["target_top1"])
    v = verdicts(rows, s)   # with the metrics
    landed = len(rows)
    complete = landed == len(planned) and all(a["goal"] != "pending" for a in v["arms"].values())
    status = "complete" if complete else f"study in progress: {landed} of {len(planned)} runs"
    schedules = {}
    for f in s.epoch_factors:
        sch = schedule_for(s, f)
        schedules[f"mg_x{f:g}"] = {"epochs": sch.epochs, "steps": sch.total_steps(s.train_clips),
                                   "stages": sch.table(s.train_clips)}
    t = s.task
    title = (f"TSM {t.arch} T={t.num_segments} {t.img_size}px, motion demo data ({t.difficulty}: {s.train_clips} "
             f"training / {s.val_clips} validation clips), base batch {s.base_batch}, SGD lr {s.lr:g}, "
             f"{s.epochs} epochs, lr x{s.gamma:g} at epochs {', '.join(f'{e:g}' for e in s.lr_steps)}")
    tgt = "-" if v["target_top1"] is None else f"{v['target_top1']:.1f}%"
    run_sum = round(sum(float(r.get("wall_s") or 0) for r in rows), 1)
    md = "\n".join([
        "# tsm-ds bench multigrid", "", f"{title}; world size 1, one thread. Status: **{status}**.", "",
        f"Arms: the base (one shape) and `--multigrid {s.mode}` at epoch factors "
        f"{', '.join(f'{f:g}' for f in s.epoch_factors)}; seeds {', '.join(map(str, s.seeds))}; every evaluation "
        f"at the base shape after precise BatchNorm over {s.precise_bn_batches} micro-batches (both arms).", "",
        f"Verdicts (accuracy: the large-batch study's pass rule; goal: pass and training time <= {SPEED_GOAL}x "
        f"the base's; target {tgt}, the base's mean final top-1):", "", verdict_table(v),
        "Every run (training s: to the final evaluation, evaluations apart):", "", runs_table(rows),
        "Seconds per optimizer step by clip shape (TensorBoard `time/compute_s`, `time/data_wait_s`):", "",
        shapes_table(rows),
        f"{landed} of {len(planned)} runs recorded; {run_sum:.0f} s of run process time; estimate: "
        f"{estimate_text(s)}.", ""])
    payload = portable({
        "name": "multigrid", "version": 1, "settings": asdict(s), "generator": s.task.generator(),
        "data": dict(data), "chance_top1": s.chance, "schedules": schedules, "verdicts": v, "rows": rows,
        "planned": [a.name for a in planned], "landed": landed, "planned_total": len(planned), "complete": complete,
        "status": status, "estimate": estimate_seconds(s), "run_wall_sum_s": run_sum, "speed_goal": SPEED_GOAL,
        "report_s": None if t0 is None else round(time.perf_counter() - t0, 1), "args": _args(record),
        "machine": machine_info()}, out)
    json_path = atomic_write_text(out / "multigrid.json", json.dumps(payload, indent=2, default=str) + "\n")
    md_path = atomic_write_text(out / "multigrid.md", md)
    return {**payload, "json": json_path, "md": md_path, "markdown": md}


def _args(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The command line's values with absolute folders recorded by their name only."""
    import os

    res = {}
    for k, val in dict(record or {}).items():
        if isinstance(val, str) and os.path.isabs(val):
            r = os.path.relpath(val)
            val = r if not r.startswith("..") else f"<elsewhere>/{Path(val).name}"
        res[k] = list(val) if isinstance(val, tuple) else val
    return res


def publish(out: str | Path, results_dir: str | Path, names: Sequence[str] = REPORT_NAMES) -> list[Path]:
    """Copy the report (``names``) and every ``rows/*.json`` from ``out`` into ``results_dir``
    atomically, for committing (rows rewritten :func:`portable`: no absolute path).

    Returns:
        The paths written (files missing from ``out`` skipped).

    Raises:
        OSError: ``results_dir`` cannot be written.
    """
    from tsm_ds.utils.io import atomic_write_text

    src, dst = Path(out).resolve(), Path(results_dir)
    written = []
    for name in [*names, *(f"rows/{p.name}" for p in sorted((src / "rows").glob("*.json")))]:
        f = src / name
        if not f.is_file():
            continue
        text = f.read_text()
        if name.startswith("rows/"):
            text = json.dumps(portable(json.loads(text), src), indent=2) + "\n"
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        written.append(atomic_write_text(dst / name, text))
    return written
