"""The study's result: one point per (recipe, global batch), where each recipe holds and breaks,
the markdown tables and the plot.

Holding is judged against the recipe's own base-batch top-1 with a tolerance of the seed-to-seed
spread measured in the study: a recipe *holds* at batch B when every run there completed and the
mean val top-1 is at most ``tolerance`` below its mean at the base batch, ``tolerance`` = the
largest max-min spread over seeds of that recipe (base and largest batch), at least
:data:`MIN_TOLERANCE` points. A diverged run breaks the point. A recipe one of whose base-batch seeds
stayed within 10 points of chance did not learn there: nothing holds for it, and its line gives the
mean top-1 of every batch instead (the study's LAMB at batch 8: seeds at 39.1 and 15.3 %, then 85.3 %
at 64; "holds within 23.9 points of 27.2 %" would read as a result). The numbers are reported as
measured either way.

Time to accuracy: the target is :data:`TARGET_FRACTION` (95 %) of the best final val top-1 of any
run at the base batch; a run reaches it at the first evaluation (``--eval-every``: several per
epoch; intermediate ones may score a capped subset) whose top-1 is at least the target, and its
time is that evaluation's optimizer steps and clips (steps x global batch). The calibration check
(:func:`calibration`) and the 1,536-GPU projection (:func:`projection`) are written here too.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from .grid import RECIPES

__all__ = ["MIN_TOLERANCE", "TARGET_FRACTION", "CALIBRATION_RANGE", "CALIBRATION_GAIN", "aggregate", "verdicts",
           "points_table", "sweep_table", "verdict_lines", "plot_study", "target_top1", "time_to_accuracy",
           "runs_table", "calibration", "projection", "readme_table"]

#: smallest tolerance (top-1 points) a drop must exceed to count as a break
MIN_TOLERANCE = 2.0
#: time to accuracy: the target is this fraction of the best base-batch final top-1
TARGET_FRACTION = 0.95
#: the task's calibration: the best base-batch SGD run's final top-1 (%) must lie in this range ...
CALIBRATION_RANGE = (60.0, 90.0)
#: ... and the headroom run (``headroom`` x the epochs) must gain at least this many points on it
CALIBRATION_GAIN = 5.0


def target_top1(rows: Sequence[dict], base_batch: int) -> float | None:
    """The time-to-accuracy target (%): :data:`TARGET_FRACTION` x the best final val top-1 of the
    completed runs at ``base_batch`` that stand for a recipe (the headroom run does not); None
    when there is none."""
    finals = [float(r["val_top1"]) for r in rows if r["batch"] == base_batch and r.get("recipes")
              and r["status"] == "completed" and r["val_top1"] is not None]
    return TARGET_FRACTION * max(finals) if finals else None


def time_to_accuracy(row: dict, target: float | None) -> tuple[int | None, int | None]:
    """``(steps, clips)`` of the first evaluation of ``row["history"]`` at or above ``target``
    (clips = steps x the row's global batch); ``(None, None)`` when it never gets there, when the
    run did not complete, or without a target."""
    if target is None or row.get("status") != "completed":
        return None, None
    batch = int(row.get("global_batch") or row["batch"])
    for h in sorted(row.get("history") or [], key=lambda h: h["step"]):
        if h["val_top1"] >= target:
            return int(h["step"]), int(h["step"]) * batch
    return None, None


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def aggregate(rows: Sequence[dict], recipes: Sequence[str], batches: Sequence[int],
              target: float | None = None) -> list[dict]:
    """One point per (recipe, batch) that has runs.

    Args:
        rows: run rows (:func:`~tsm_ds.experiments.large_batch.runs.run_one`); a row counts for every
            recipe in its ``recipes``.
        recipes, batches: the order of the points.

    Returns:
        dicts: recipe, label, batch, micro_batch, accum, lr (read back from config.json),
        warmup_steps, steps (optimizer steps of the first seed), seeds, run_steps (optimizer steps
        per seed: a diverged run's is its last step), outcomes (per seed: "completed", "diverged at
        step k" or "failed"), val_top1 (per seed; None
        for a diverged or failed run), mean_top1 / min_top1 / max_top1 / spread over the completed
        runs, diverged (["seed s: step k"]), failed (run names), wall_s (mean seconds per run);
        best_top1 (per seed: the highest evaluation, None for a run that did not complete),
        target (``target``), steps_to_target / clips_to_target (per seed, None: not reached),
        mean_clips_to_target (over the seeds that reached it, None if none did),
        reached ("k/n" seeds).
    """
    points = []
    for r in recipes:
        for b in batches:
            runs = sorted((x for x in rows if r in x["recipes"] and x["batch"] == b), key=lambda x: x["seed"])
            if not runs:
                continue
            done = [float(x["val_top1"]) for x in runs if x["status"] == "completed" and x["val_top1"] is not None]
            first = runs[0]
            tta = [time_to_accuracy(x, target) for x in runs]
            reached = [c for _, c in tta if c is not None]
            points.append({
                "recipe": r, "label": RECIPES[r].label if r in RECIPES else r, "batch": b,
                "micro_batch": first.get("micro_batch"), "accum": first.get("accum"), "lr": first.get("lr"),
                "warmup_steps": first.get("warmup_steps"), "steps": first.get("steps"),
                "seeds": [x["seed"] for x in runs], "run_steps": [x.get("steps") for x in runs],
                "outcomes": [_outcome(x) for x in runs],
                "val_top1": [x["val_top1"] if x["status"] == "completed" else None for x in runs],
                "mean_top1": _mean(done), "min_top1": min(done) if done else None,
                "max_top1": max(done) if done else None,
                "spread": (max(done) - min(done)) if len(done) > 1 else None,
                "diverged": [f"seed {x['seed']}: step {x['diverged_at']}" for x in runs if x["status"] == "diverged"],
                "failed": [x["name"] for x in runs if x["status"] == "failed"],
                "wall_s": round(_mean([float(x["wall_s"]) for x in runs]), 1),
                "best_top1": [x.get("best_val_top1") if x["status"] == "completed" else None for x in runs],
                "target": target, "steps_to_target": [st for st, _ in tta], "clips_to_target": [c for _, c in tta],
                "mean_clips_to_target": _mean(reached), "reached": f"{len(reached)}/{len(runs)}",
            })
    return points


def verdicts(points: Sequence[dict], base_batch: int, chance: float) -> dict[str, dict]:
    """Per recipe: {"base_top1", "tolerance", "holds" [batches], "breaks" [batches], "holds_up_to",
    "first_break", "learned_at_base"} (see the module docstring for the rule; a recipe one of whose
    base-batch seeds stayed within 10 points of ``chance`` (%) did not learn, and nothing holds for it)."""
    out: dict[str, dict] = {}
    for r in dict.fromkeys(p["recipe"] for p in points):
        pts = [p for p in points if p["recipe"] == r]
        base = next((p for p in pts if p["batch"] == base_batch), None)
        base_top1 = base["mean_top1"] if base else None
        spreads = [p["spread"] for p in pts if p["spread"] is not None]
        tol = max([MIN_TOLERANCE, *spreads])
        learned = base is not None and base["min_top1"] is not None and base["min_top1"] > chance + 10.0
        holds, breaks = [], []
        for p in pts:
            ok = (learned and not p["diverged"] and not p["failed"] and p["mean_top1"] is not None
                  and p["mean_top1"] >= base_top1 - tol)
            (holds if ok else breaks).append(p["batch"])
        up_to = None
        for b in sorted(p["batch"] for p in pts):
            if b in breaks:
                break
            up_to = b
        out[r] = {"base_top1": base_top1, "tolerance": tol, "holds": holds, "breaks": breaks,
                  "holds_up_to": up_to, "first_break": min(breaks) if breaks else None, "learned_at_base": learned}
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def points_table(points: Sequence[dict]) -> str:
    """Markdown: recipe, global batch, micro-batch x accumulation, lr, warm-up steps, optimizer
    steps, final val top-1 per seed, mean, spread (max - min), best evaluation per seed, clips to
    the target per seed, wall time per run."""
    lines = ["| recipe | global batch | micro x accum | lr (read back) | warm-up steps | optimizer steps | "
             "final val top-1 per seed (%) | mean (%) | spread | best per seed (%) | clips to target per seed | "
             "wall s / run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        seeds = ", ".join(
            (f"s{s}: {v:.1f}" if v is not None
             else f"s{s}: " + ("diverged" if any(d.startswith(f"seed {s}:") for d in p["diverged"]) else "failed"))
            for s, v in zip(p["seeds"], p["val_top1"]))
        if p["diverged"]:
            seeds += " (" + "; ".join(f"diverged at {d.split(': ')[1]}" for d in p["diverged"]) + ")"
        lr = "-" if p["lr"] is None else f"{p['lr']:.4g}"
        best = ", ".join(_pct(b) for b in p.get("best_top1", []))
        tta = ", ".join("-" if c is None else f"{c:,}" for c in p.get("clips_to_target", []))
        lines.append(f"| {p['recipe']} | {p['batch']} | {p['micro_batch']} x {p['accum']} | {lr} | "
                     f"{p['warmup_steps']} | {p['steps']} | {seeds} | {_pct(p['mean_top1'])} | "
                     f"{_pct(p['spread'])} | {best or '-'} | {tta or '-'} | {p['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def readme_table(points: Sequence[dict]) -> str:
    """Markdown for docs/large-batch.md: one line per (recipe, global batch, seed) in the order of
    ``points`` (:func:`aggregate`): lr read back, optimizer steps, outcome (completed / diverged at
    step k / failed), final and best val top-1 (%), and optimizer steps / clips to the target
    ("not reached"). A test keeps that guide's table equal to this function of the committed
    ``results/large_batch/large_batch.json``."""
    lines = ["| recipe | global batch | seed | lr | optimizer steps | outcome | final top-1 (%) | best top-1 (%) | "
             "steps / clips to target |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lr = "-" if p["lr"] is None else f"{p['lr']:.4g}"
        for i, seed in enumerate(p["seeds"]):
            final, outcome = p["val_top1"][i], p["outcomes"][i]
            steps_t, clips_t = p["steps_to_target"][i], p["clips_to_target"][i]
            tta = "not reached" if clips_t is None else f"{steps_t:,} / {clips_t:,}"
            lines.append(f"| {p['recipe']} | {p['batch']} | {seed} | {lr} | {p['run_steps'][i]} | {outcome} | "
                         f"{_pct(final)} | {_pct(p['best_top1'][i])} | {tta} |")
    return "\n".join(lines) + "\n"


def sweep_table(rows: Sequence[dict], chosen: float | None) -> str:
    """Markdown of the base-batch SGD lr sweep (lr, final and best val top-1, status, wall time)."""
    lines = ["| SGD lr at the base batch | val top-1 (%) | best epoch (%) | status | wall s |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda x: x["base_lr"]):
        mark = " (chosen)" if chosen is not None and math.isclose(r["base_lr"], chosen) else ""
        status = r["status"] + (f" at step {r['diverged_at']}" if r["status"] == "diverged" else "")
        lines.append(f"| {r['base_lr']:g}{mark} | {_pct(r['val_top1'])} | {_pct(r['best_val_top1'])} | "
                     f"{status} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def _mean_or_outcome(p: dict) -> str:
    """A point's mean top-1 ("85.3%"), or "diverged" / "failed" when no seed completed."""
    if p["mean_top1"] is not None:
        return f"{_pct(p['mean_top1'])}%"
    return "diverged" if p["diverged"] else "failed"


def verdict_lines(v: dict[str, dict], batches: Sequence[int], points: Sequence[dict] = ()) -> list[str]:
    """One sentence per recipe: where it holds and where it breaks; for a recipe that did not learn
    at the base batch, the mean top-1 (or the outcome) at every batch of ``points`` instead."""
    lines = []
    for r, d in v.items():
        name = RECIPES[r].label if r in RECIPES else r
        if not d["learned_at_base"]:
            pts = [p for p in points if p["recipe"] == r]
            per = ", ".join(f"{p['batch']}: {_mean_or_outcome(p)}" for p in pts) or "-"
            base = next((p for p in pts if p["batch"] == min(batches)), None)
            seeds = (" (seeds: " + ", ".join(f"{_pct(x)}%" for x in base["val_top1"]) + ")"
                     if base and len(base["val_top1"]) > 1 else "")
            lines.append(f"- {name}: did not learn at the base batch with every seed ({_pct(d['base_top1'])}% mean"
                         f"{seeds}): nothing to hold; mean top-1 per batch: {per}.")
            continue
        tol = f"tolerance {d['tolerance']:.1f} points"
        if not d["breaks"]:
            lines.append(f"- {name}: holds at every batch up to {max(batches)} ({tol}; base {_pct(d['base_top1'])}%).")
        else:
            lines.append(f"- {name}: holds up to {d['holds_up_to']}, breaks at {', '.join(map(str, d['breaks']))} "
                         f"({tol}; base {_pct(d['base_top1'])}%).")
    return lines


def plot_study(points: Sequence[dict], out: Path, *, chance: float, title: str) -> Path | None:
    """PNG: val top-1 against the global batch per recipe (mean line, every seed as a dot, diverged
    runs as crosses on the x axis) and wall time per run; None when there is nothing to plot."""
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, r in enumerate(dict.fromkeys(p["recipe"] for p in points)):
        pts = [p for p in points if p["recipe"] == r]
        color = f"C{i}"
        xs = [p["batch"] for p in pts if p["mean_top1"] is not None]
        ax.plot(xs, [p["mean_top1"] for p in pts if p["mean_top1"] is not None], "-o", color=color,
                label=RECIPES[r].label if r in RECIPES else r)
        for p in pts:
            seeds = [v for v in p["val_top1"] if v is not None]
            ax.scatter([p["batch"] * (1 + 0.03 * i)] * len(seeds), seeds, s=12, color=color, alpha=0.6)
            if p["diverged"]:
                ax.scatter([p["batch"]], [0], marker="x", s=60, color=color)
        ax2.plot([p["batch"] for p in pts], [p["wall_s"] for p in pts], "-o", color=color)
    ax.axhline(chance, ls=":", color="grey", label=f"chance {chance:.0f}%")
    batches = sorted({p["batch"] for p in points})
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(batches, [str(b) for b in batches])
        a.minorticks_off()
        a.set_xlabel("global batch (clips), micro-batch fixed")
    ax.set_ylabel("val top-1 (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax2.set_ylabel("wall time per run (s)")
    ax2.set_title("same clips per run; x = diverged", fontsize=9)
    fig.tight_layout()
    from tsm_ds.bench.plots import save_figure
    return save_figure(fig, Path(out))


def _outcome(row: dict) -> str:
    if row["status"] == "diverged":
        return f"diverged at step {row['diverged_at']}"
    return row["status"]


def runs_table(rows: Sequence[dict], target: float | None) -> str:
    """Markdown, one line per run: name, recipes, global batch, seed, lr, optimizer steps, outcome
    (completed / diverged at step k / failed), final and best val top-1, steps and clips to
    ``target`` ("-": not reached)."""
    lines = ["| run | recipes | global batch | seed | lr | steps | outcome | final top-1 (%) | best top-1 (%) | "
             "steps to target | clips to target |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["batch"], r["name"])):
        st, clips = time_to_accuracy(r, target)
        lr = "-" if r.get("lr") is None else f"{r['lr']:.4g}"
        lines.append(f"| {r['name']} | {', '.join(r.get('recipes') or ['headroom'])} | {r['batch']} | {r['seed']} | "
                     f"{lr} | {r.get('steps') if r.get('steps') is not None else '-'} | {_outcome(r)} | "
                     f"{_pct(r.get('val_top1'))} | {_pct(r.get('best_val_top1'))} | "
                     f"{'-' if st is None else st} | {'-' if clips is None else f'{clips:,}'} |")
    return "\n".join(lines) + "\n"


def calibration(sweep: Sequence[dict], headroom: dict | None, sgd_lr: float | None, *, factor: int) -> dict:
    """Does the task leave room to lose accuracy? The best base-batch SGD run's final top-1 must
    lie in :data:`CALIBRATION_RANGE` and the headroom run (``factor`` x the epochs, the chosen
    lr) must gain :data:`CALIBRATION_GAIN` points on the run at the same lr.

    Args:
        sweep: the base-batch SGD rows (one per lr, first seed); headroom: the headroom run's row
            or None; sgd_lr: the chosen lr; factor: the headroom epochs factor.

    Returns:
        {"best_sgd_top1", "in_range", "range", "same_lr_top1", "headroom_top1", "gain", "min_gain",
        "factor", "gained", "passed", "text"}; values that could not be measured are None
        (``passed`` is then False).
    """
    done = [r for r in sweep if r["status"] == "completed" and r["val_top1"] is not None]
    best = max((float(r["val_top1"]) for r in done), default=None)
    same = next((float(r["val_top1"]) for r in done if sgd_lr is not None and math.isclose(r["base_lr"], sgd_lr)),
                None)
    long_top1 = (float(headroom["val_top1"]) if headroom and headroom["status"] == "completed"
                 and headroom["val_top1"] is not None else None)
    gain = long_top1 - same if long_top1 is not None and same is not None else None
    lo, hi = CALIBRATION_RANGE
    in_range = best is not None and lo <= best <= hi
    gained = gain is not None and gain >= CALIBRATION_GAIN
    head = ("no headroom run" if headroom is None else
            f"{factor}x longer run {_outcome(headroom)}" + (f", {long_top1:.1f}%" if long_top1 is not None else ""))
    text = (f"best base-batch SGD final top-1 {_pct(best)}% (wanted {lo:.0f}-{hi:.0f}%: "
            f"{'yes' if in_range else 'NO'}); {head}; gain on the same lr "
            f"{'-' if gain is None else f'{gain:+.1f}'} points (wanted >= {CALIBRATION_GAIN:.0f}: "
            f"{'yes' if gained else 'NO'})")
    return {"best_sgd_top1": best, "in_range": in_range, "range": list(CALIBRATION_RANGE), "same_lr_top1": same,
            "headroom_top1": long_top1, "gain": gain, "min_gain": CALIBRATION_GAIN, "factor": factor,
            "gained": gained, "passed": bool(in_range and gained), "text": text}


def projection(points: Sequence[dict], base_batch: int, largest: int) -> dict:
    """The paper's 1,536-GPU time with the large batch's cost in clips to the target.

    The best large-batch recipe is the recipe whose every completed seed at ``largest`` reached
    the target, with the fewest mean clips to it; its clips over the fewest mean clips to the
    target at ``base_batch`` (any recipe) is the *clips inflation* of the large batch. The scaling
    model (:mod:`tsm_ds.bench.scaling`: calibrated on the paper's single node, Summit, TSM-R50 8f,
    50 epochs of 240k clips at 8 clips per GPU) predicts the 1,536-GPU time; the projection is that
    time x the inflation (a large batch that needs k x the clips needs k x the epochs), next to the
    paper's measured 14 min 13 s.

    Returns:
        {"recipe" (None: no large-batch recipe reached the target), "base_recipe", "base_clips",
        "large_clips", "large_steps", "inflation", "model_time_s", "projected_time_s", "paper_time_s",
        "model_time", "projected_time", "paper_time", "gpus", "text"}.
    """
    from tsm_ds.bench.scaling.model import calibrate, format_duration, step_breakdown
    from tsm_ds.bench.scaling.presets import CLUSTERS, MODELS, PAPER, Workload

    tsm = MODELS["tsm"]
    w = Workload(label=tsm["label"], params=tsm["params"], frames=tsm["frames"], compute_ratio=tsm["compute_ratio"])
    summit = CLUSTERS["summit"]
    ref = calibrate(w, summit, gpus=PAPER["single_node_gpus"], time_s=PAPER["single_node_time_s"])
    model_s = step_breakdown(w, summit, PAPER["large_scale_gpus"], ref)["train_time_s"]
    out: dict = {"gpus": PAPER["large_scale_gpus"], "model_time_s": model_s, "model_time": format_duration(model_s),
                 "paper_time_s": PAPER["large_scale_time_s"],
                 "paper_time": format_duration(PAPER["large_scale_time_s"]),
                 "recipe": None, "base_recipe": None, "base_clips": None, "large_clips": None, "large_steps": None,
                 "inflation": None, "projected_time_s": None, "projected_time": None}

    def ok(p: dict) -> bool:
        done = [c for c, v in zip(p["clips_to_target"], p["val_top1"]) if v is not None]
        return bool(done) and all(c is not None for c in done) and p["mean_clips_to_target"] is not None

    base = [p for p in points if p["batch"] == base_batch and p.get("mean_clips_to_target") is not None]
    large = [p for p in points if p["batch"] == largest and p.get("clips_to_target") and ok(p)]
    if base:
        b = min(base, key=lambda p: p["mean_clips_to_target"])
        out.update(base_recipe=b["recipe"], base_clips=b["mean_clips_to_target"])
    if base and large:
        p = min(large, key=lambda p: p["mean_clips_to_target"])
        infl = p["mean_clips_to_target"] / out["base_clips"]
        out.update(recipe=p["recipe"], large_clips=p["mean_clips_to_target"],
                   large_steps=p["mean_clips_to_target"] / largest, inflation=infl,
                   projected_time_s=model_s * infl, projected_time=format_duration(model_s * infl))
        out["text"] = (f"{p['recipe']} at batch {largest} reached the target in {out['large_clips']:,.0f} clips "
                       f"({out['large_steps']:.1f} steps) against {out['base_clips']:,.0f} at batch {base_batch} "
                       f"({out['base_recipe']}): x{infl:.2f} the clips. Scaling model at {out['gpus']:,} GPUs: "
                       f"{out['model_time']} for the paper's 50 epochs; x{infl:.2f}: **{out['projected_time']}** "
                       f"(paper: {out['paper_time']}).")
    else:
        out["text"] = (f"no recipe at batch {largest} reached the target with every seed" if base else
                       f"no run at batch {base_batch} reached the target") + (
            f": no projection (scaling model at {out['gpus']:,} GPUs: {out['model_time']}; paper: "
            f"{out['paper_time']}).")
    return out
