"""The study's numbers: per run, its training time (evaluations apart), time to the base's final top-1
in wall time, optimizer steps and clips x frames x pixels, the time per step of each clip shape
(model against loader); per multigrid arm, the verdict; and the markdown tables.

**Accuracy** is the large-batch study's pass rule, imported
(:func:`tsm_ds.experiments.large_batch.study_report.pass_rule`): the arm's mean final top-1 over its
seeds (every validation clip, at the base shape, after precise BatchNorm) at most max(1 point, 2 SE)
below the base's, SE the standard error of the difference of the two means floored by the binomial
SE of the validation set; no seed diverged, failed or at chance.

**Speed**: the arm's mean training time over the base's (:data:`SPEED_GOAL` 0.67 or less), in CPU
seconds of the run's one-thread process where the trainer recorded them (what the wall time is on a
core of its own; other processes sharing the machine change the wall time, not this), else in wall
seconds; both measured the same way: seconds from the trainer's start of training (``fit``) to the start of its
final evaluation, less every earlier evaluation's time (``eval_s`` of ``result.json``'s history:
precise BatchNorm and validation), i.e. the optimizer steps with their data loading, checkpoints and
the first epoch's decoding into the cache; a run's start-up (imports, the engine, the data index) and
its evaluations are reported apart.

**Time to the base's final top-1**: the first evaluation at or above the base's mean final top-1
(intermediate evaluations score a fixed subset of ``eval_max_clips`` clips, the last one every clip),
in training seconds, optimizer steps and clips x frames x pixels (each step's global batch x T x
crop^2, from the schedule: :func:`.plan.step_costs`).

**The goal**: pass and speed <= 0.67 (Wu et al. 2020 report 4.5x less wall time at equal top-1).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from tsm_ds.experiments.large_batch.study_report import pass_rule

from .plan import MGSettings, cost_to_step, step_costs

__all__ = ["SPEED_GOAL", "timeline", "run_metrics", "shape_times", "verdicts", "runs_table", "verdict_table",
           "shapes_table", "GUIDE_BEGIN", "GUIDE_END", "landed_text", "guide_block"]

#: the goal's ratio of training times (multigrid / base), at most
SPEED_GOAL = 0.67


def timeline(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``result.json``'s history with each evaluation's training seconds: ``train_s`` = its ``wall_s``
    (seconds since the training began, at the evaluation's start) less the ``eval_s`` of every earlier
    evaluation. Records without ``wall_s`` (a trainer older than these fields) are left out.

    ``train_cpu_s`` is the same in CPU seconds of the run's process (``cpu_s`` less the earlier
    ``eval_cpu_s``; None where the trainer did not record them): one thread on a core of its own makes
    it the wall time, and other processes on the machine do not change it.

    Returns:
        [{"step", "val_top1", "val_clips", "train_s", "eval_s", "precise_bn_s", "train_cpu_s",
        "eval_cpu_s"}] in step order.
    """
    out, spent, spent_cpu = [], 0.0, 0.0
    for h in history:
        if h.get("wall_s") is None or h.get("val_top1") is None:
            continue
        cpu = None if h.get("cpu_s") is None else round(float(h["cpu_s"]) - spent_cpu, 2)
        out.append({"step": int(h["step"]), "val_top1": float(h["val_top1"]), "val_clips": h.get("val_clips"),
                    "train_s": round(float(h["wall_s"]) - spent, 2), "eval_s": float(h.get("eval_s") or 0.0),
                    "precise_bn_s": h.get("precise_bn_s"), "train_cpu_s": cpu,
                    "eval_cpu_s": h.get("eval_cpu_s")})
        spent += float(h.get("eval_s") or 0.0)
        spent_cpu += float(h.get("eval_cpu_s") or 0.0)
    return out


def run_metrics(row: Mapping[str, Any], settings: MGSettings, target: float | None) -> dict[str, Any]:
    """One run's numbers from its row (``row["timeline"]``: :func:`timeline`).

    Returns:
        {"train_s" (to the final evaluation), "train_cpu_s" (the same in CPU seconds), "eval_s" (every
        evaluation, precise BatchNorm included), "eval_cpu_s",
        "precise_bn_s", "steps", "cost" (clips x frames x pixels of the run), "to_target": {"train_s",
        "step", "cost", "top1"} of the first evaluation at or above ``target`` (None: never, or no
        target), "schedule_ok" (the run's planned steps are the schedule's, as rebuilt here)}.
    """
    tl = row.get("timeline") or []
    costs = step_costs(settings, row.get("epoch_factor"))
    out: dict[str, Any] = {"train_s": tl[-1]["train_s"] if tl else None,
                           "train_cpu_s": tl[-1].get("train_cpu_s") if tl else None,
                           "eval_cpu_s": (round(sum(float(h.get("eval_cpu_s") or 0) for h in tl), 1) if tl else None),
                           "eval_s": round(sum(h["eval_s"] for h in tl), 1) if tl else None,
                           "precise_bn_s": round(sum(float(h["precise_bn_s"] or 0) for h in tl), 1) if tl else None,
                           "steps": row.get("steps"), "cost": cost_to_step(costs, row.get("steps") or 0),
                           "schedule_ok": row.get("planned_steps") == len(costs), "to_target": None}
    if target is not None and row.get("status") == "completed":
        hit = next((h for h in tl if h["val_top1"] >= target - 1e-9), None)
        if hit is not None:
            out["to_target"] = {"train_s": hit["train_s"], "train_cpu_s": hit.get("train_cpu_s"), "step": hit["step"],
                                "top1": hit["val_top1"], "cost": cost_to_step(costs, hit["step"])}
    return out


def shape_times(run_dir: Path, base: tuple[int, int, int]) -> list[dict[str, Any]]:
    """Seconds per optimizer step by clip shape, from the run's TensorBoard scalars
    (``<run>/tensorboard/tsm_ds``: ``time/compute_s`` and ``time/data_wait_s`` per step, the shape from
    ``multigrid/frames``, ``multigrid/crop`` and ``multigrid/global_batch``; a run without them trained
    ``base`` = (T, crop, global batch) only).

    Returns:
        [{"frames", "crop", "clips", "steps", "compute_s", "data_wait_s"} (means per step)], smallest
        T x crop first; [] when the events cannot be read (no tensorboard package, no events).
    """
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return []
    d = Path(run_dir) / "tensorboard" / "tsm_ds"
    if not d.is_dir():
        return []
    acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))
    if "time/compute_s" not in tags:
        return []

    def series(tag: str) -> dict[int, float]:
        return {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}

    comp, wait = series("time/compute_s"), series("time/data_wait_s")
    frames, crops, clips = series("multigrid/frames"), series("multigrid/crop"), series("multigrid/global_batch")
    groups: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for step, c in comp.items():
        key = (int(frames.get(step, base[0])), int(crops.get(step, base[1])), int(clips.get(step, base[2])))
        groups.setdefault(key, []).append((c, wait.get(step, 0.0)))
    return [{"frames": t, "crop": s, "clips": b, "steps": len(v), "compute_s": round(sum(x for x, _ in v) / len(v), 4),
             "data_wait_s": round(sum(y for _, y in v) / len(v), 4)}
            for (t, s, b), v in sorted(groups.items(), key=lambda kv: (kv[0][0] * kv[0][1] ** 2, -kv[0][2]))]


def _mean(xs: Sequence[float]) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def verdicts(rows: Sequence[Mapping[str, Any]], settings: MGSettings) -> dict[str, Any]:
    """The base's mean final top-1 (the target) and, per multigrid arm, the pass rule, the speed ratio
    and the goal.

    Returns:
        {"target_top1", "base_train_s", "base_train_cpu_s", "arms": {arm: {**pass_rule, "train_s",
        "speed" (arm / base mean training time), "train_cpu_s", "speed_cpu" (the same in CPU seconds),
        "steps_ratio", "cost_ratio", "to_target_speed" (mean time to the target over the base's mean
        training time, CPU seconds where recorded; None unless every seed got there), "goal" ("met" /
        "missed" / "pending"; on CPU time where recorded), "goal_text"}}}.
    """
    base = [r for r in rows if r.get("arm") == "base"]
    done = [r for r in base if r.get("status") == "completed" and r.get("val_top1") is not None]
    target = _mean([r["val_top1"] for r in done])
    base_train = _mean([(r.get("metrics") or {}).get("train_s") for r in done])
    base_cpu = _mean([(r.get("metrics") or {}).get("train_cpu_s") for r in done])
    base_steps = _mean([(r.get("metrics") or {}).get("steps") for r in done])
    base_cost = _mean([(r.get("metrics") or {}).get("cost") for r in done])
    out: dict[str, Any] = {"target_top1": target, "base_train_s": base_train, "base_train_cpu_s": base_cpu,
                           "arms": {}}
    names = sorted({r["arm"] for r in rows if r.get("arm", "base") != "base"}
                   | {f"mg_x{f:g}" for f in settings.epoch_factors}, key=lambda a: -float(a.split("_x")[1]))
    for arm in names:
        runs = sorted([r for r in rows if r.get("arm") == arm], key=lambda r: r["seed"])
        v = pass_rule(base, runs, val_clips=settings.val_clips, chance=settings.chance)
        m = [r.get("metrics") or {} for r in runs if r.get("status") == "completed"]
        train = _mean([x.get("train_s") for x in m])
        cpu = _mean([x.get("train_cpu_s") for x in m])
        hits = [x.get("to_target") for x in m]
        ratio = (lambda a, b: None if a is None or not b else a / b)
        v.update(train_s=train, speed=ratio(train, base_train), train_cpu_s=cpu, speed_cpu=ratio(cpu, base_cpu),
                 steps_ratio=ratio(_mean([x.get("steps") for x in m]), base_steps),
                 cost_ratio=ratio(_mean([x.get("cost") for x in m]), base_cost),
                 to_target_speed=(None if not hits or not all(hits) else
                                  ratio(_mean([h.get("train_cpu_s") for h in hits]), base_cpu)
                                  if base_cpu and all(h.get("train_cpu_s") is not None for h in hits) else
                                  ratio(_mean([h["train_s"] for h in hits]), base_train)))
        pending = v["verdict"] == "pending" or len(runs) < len(settings.seeds) or len(done) < len(settings.seeds)
        if pending:
            goal, why = "pending", f"{len(runs)} of {len(settings.seeds)} seeds, {len(done)} base runs"
        else:
            key = "speed_cpu" if v["speed_cpu"] is not None else "speed"   # CPU time: co-tenants do not change it
            fast = v[key] is not None and v[key] <= SPEED_GOAL
            goal = "met" if v["verdict"] == "pass" and fast else "missed"
            sp = "-" if v[key] is None else f"{v[key]:.2f}x"
            why = (f"accuracy {v['verdict']} ({v['diff']:+.1f} points, tolerance {v['tolerance']:.1f})"
                   if v.get("diff") is not None and v.get("tolerance") is not None else f"accuracy {v['verdict']}")
            why += (f"; training {'CPU ' if key == 'speed_cpu' else ''}time {sp} the base's (goal <= {SPEED_GOAL})")
        v.update(goal=goal, goal_text=why)
        out["arms"][arm] = v
    return out


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def runs_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: one line per run (final top-1, training / evaluation / process seconds, steps, cost,
    time to the base's final top-1)."""
    head = ("| run | status | final top-1 (%) | training s (CPU s) | evaluation s (precise BN) | process s | optimizer "
            "steps | clips x frames x px (1e9) | to the base's final top-1: s (CPU s) / steps / 1e9 |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        m = r.get("metrics") or {}
        t = m.get("to_target")
        hit = "not reached" if t is None else (f"{t['train_s']:.0f} ({_f(t.get('train_cpu_s'), '{:.0f}')}) / "
                                               f"{t['step']} / {t['cost'] / 1e9:.2f}")
        lines.append(f"| {r['name']} | {r['status']} | {_f(r.get('val_top1'))} | {_f(m.get('train_s'), '{:.0f}')} "
                     f"({_f(m.get('train_cpu_s'), '{:.0f}')}) | "
                     f"{_f(m.get('eval_s'), '{:.0f}')} ({_f(m.get('precise_bn_s'), '{:.0f}')}) | "
                     f"{_f(r.get('wall_s'), '{:.0f}')} | {r.get('steps') or '-'} | "
                     f"{_f((m.get('cost') or 0) / 1e9, '{:.2f}')} | {hit} |")
    return "\n".join(lines) + "\n"


def verdict_table(v: Mapping[str, Any]) -> str:
    """Markdown: one line per multigrid arm (means, difference, tolerance, ratios, verdict, goal)."""
    lines = ["| arm | seeds | mean top-1 (%) | base (%) | diff | tolerance | accuracy | training time / base: CPU "
             "(wall) | steps / base | clips x frames x px / base | to the base's top-1 / base | goal |",
             "|" + "---|" * 12]
    for arm, a in v["arms"].items():
        lines.append(f"| {arm} | {len(a['seeds'])} | {_f(a.get('mean'))} | {_f(a.get('base_mean'))} | "
                     f"{_f(a.get('diff'), '{:+.1f}')} | {_f(a.get('tolerance'))} | {a['verdict']} | "
                     f"{_f(a.get('speed_cpu'), '{:.2f}')} ({_f(a.get('speed'), '{:.2f}')}) | "
                     f"{_f(a.get('steps_ratio'), '{:.2f}')} | "
                     f"{_f(a.get('cost_ratio'), '{:.2f}')} | {_f(a.get('to_target_speed'), '{:.2f}')} | "
                     f"**{a['goal']}** |")
    return "\n".join(lines) + "\n"


def shapes_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: seconds per optimizer step by clip shape (model step against data wait), per run."""
    lines = ["| run | T x crop x clips | steps | compute s / step | data wait s / step |", "|" + "---|" * 5]
    for r in rows:
        for s in r.get("shapes") or []:
            clips = s.get("clips", "-")
            lines.append(f"| {r['name']} | {s['frames']} x {s['crop']} x {clips} | {s['steps']} | "
                         f"{s['compute_s']:.3f} | {s['data_wait_s']:.4f} |")
    return "\n".join(lines) + "\n"


#: the markers of the report's block in docs/multigrid.md
GUIDE_BEGIN, GUIDE_END = "<!-- multigrid-report:begin -->", "<!-- multigrid-report:end -->"


def landed_text(rep: Mapping[str, Any]) -> str:
    """``N of M runs landed`` (the study in progress) or ``all M runs landed``, from a report."""
    if rep["landed"] >= rep["planned_total"]:
        return f"all {rep['planned_total']} runs landed"
    return f"{rep['landed']} of {rep['planned_total']} runs landed"


def guide_block(rep: Mapping[str, Any]) -> str:
    """The block of docs/multigrid.md between :data:`GUIDE_BEGIN` and :data:`GUIDE_END`: the committed
    report's status, verdicts, runs and seconds per shape (a test keeps the guide equal to it)."""
    v = rep["verdicts"]
    tgt = "-" if v["target_top1"] is None else f"{v['target_top1']:.1f} %"
    return "\n".join([
        GUIDE_BEGIN, "", f"Status: **{landed_text(rep)}** (`results/multigrid/rows/`; every number below is a run "
        "that has landed, nothing is claimed for the runs still to come).", "",
        f"Verdicts (accuracy: the large-batch study's pass rule on the 2-seed means; goal: pass and a training "
        f"time <= {rep['speed_goal']}x the base's; target {tgt}, the base's mean final top-1; \"pending\": a run "
        "it needs has not landed):", "", verdict_table(v),
        "Every run (training s: from the start of training to the final evaluation, evaluations apart; "
        "evaluation s: every evaluation with its precise BatchNorm; process s: the whole process):", "",
        runs_table(rep["rows"]),
        "Seconds per optimizer step by clip shape, from each run's TensorBoard (`time/compute_s`: forward, "
        "backward and update; `time/data_wait_s`: waiting for the loader):", "", shapes_table(rep["rows"]),
        GUIDE_END])
