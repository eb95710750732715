"""The study's result: one point per (recipe, global batch), where each recipe holds and breaks,
the markdown tables and the plot.

Holding is judged against the recipe's own base-batch top-1 with a tolerance of the seed-to-seed
spread measured in the study: a recipe *holds* at batch B when every run there completed and the
mean val top-1 is at most ``tolerance`` below its mean at the base batch, ``tolerance`` = the
largest max-min spread over seeds of that recipe (base and largest batch), at least
:data:`MIN_TOLERANCE` points. A diverged run breaks the point. The numbers are reported as
measured either way.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from .grid import RECIPES

__all__ = ["MIN_TOLERANCE", "aggregate", "verdicts", "points_table", "sweep_table", "verdict_lines",
           "plot_study"]

#: smallest tolerance (top-1 points) a drop must exceed to count as a break
MIN_TOLERANCE = 2.0


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def aggregate(rows: Sequence[dict], recipes: Sequence[str], batches: Sequence[int]) -> list[dict]:
    """One point per (recipe, batch) that has runs.

    Args:
        rows: run rows (:func:`~tsm_ds.experiments.large_batch.runs.run_one`); a row counts for every
            recipe in its ``recipes``.
        recipes, batches: the order of the points.

    Returns:
        dicts: recipe, label, batch, micro_batch, accum, lr (read back from config.json),
        warmup_steps, steps (optimizer steps of the first seed), seeds, val_top1 (per seed; None
        for a diverged or failed run), mean_top1 / min_top1 / max_top1 / spread over the completed
        runs, diverged (["seed s: step k"]), failed (run names), wall_s (mean seconds per run).
    """
    points = []
    for r in recipes:
        for b in batches:
            runs = sorted((x for x in rows if r in x["recipes"] and x["batch"] == b), key=lambda x: x["seed"])
            if not runs:
                continue
            done = [float(x["val_top1"]) for x in runs if x["status"] == "completed" and x["val_top1"] is not None]
            first = runs[0]
            points.append({
                "recipe": r, "label": RECIPES[r].label if r in RECIPES else r, "batch": b,
                "micro_batch": first.get("micro_batch"), "accum": first.get("accum"), "lr": first.get("lr"),
                "warmup_steps": first.get("warmup_steps"), "steps": first.get("steps"),
                "seeds": [x["seed"] for x in runs],
                "val_top1": [x["val_top1"] if x["status"] == "completed" else None for x in runs],
                "mean_top1": _mean(done), "min_top1": min(done) if done else None,
                "max_top1": max(done) if done else None,
                "spread": (max(done) - min(done)) if len(done) > 1 else None,
                "diverged": [f"seed {x['seed']}: step {x['diverged_at']}" for x in runs if x["status"] == "diverged"],
                "failed": [x["name"] for x in runs if x["status"] == "failed"],
                "wall_s": round(_mean([float(x["wall_s"]) for x in runs]), 1),
            })
    return points


def verdicts(points: Sequence[dict], base_batch: int, chance: float) -> dict[str, dict]:
    """Per recipe: {"base_top1", "tolerance", "holds" [batches], "breaks" [batches], "holds_up_to",
    "first_break", "learned_at_base"} (see the module docstring for the rule; a recipe whose base
    batch stayed within 10 points of ``chance`` did not learn, and nothing holds for it)."""
    out: dict[str, dict] = {}
    for r in dict.fromkeys(p["recipe"] for p in points):
        pts = [p for p in points if p["recipe"] == r]
        base = next((p for p in pts if p["batch"] == base_batch), None)
        base_top1 = base["mean_top1"] if base else None
        spreads = [p["spread"] for p in pts if p["spread"] is not None]
        tol = max([MIN_TOLERANCE, *spreads])
        learned = base_top1 is not None and base_top1 > chance + 10.0
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
    steps, val top-1 per seed, mean, spread (max - min), wall time per run."""
    lines = ["| recipe | global batch | micro x accum | lr (read back) | warm-up steps | optimizer steps | "
             "val top-1 per seed (%) | mean (%) | spread | wall s / run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        seeds = ", ".join(
            (f"s{s}: {v:.1f}" if v is not None else f"s{s}: " + ("diverged" if any(d.startswith(f"seed {s}:")
                                                                                  for d in p["diverged"]) else "failed"))
            for s, v in zip(p["seeds"], p["val_top1"]))
        if p["diverged"]:
            seeds += " (" + "; ".join(f"diverged at {d.split(': ')[1]}" for d in p["diverged"]) + ")"
        lr = "-" if p["lr"] is None else f"{p['lr']:.4g}"
        lines.append(f"| {p['recipe']} | {p['batch']} | {p['micro_batch']} x {p['accum']} | {lr} | "
                     f"{p['warmup_steps']} | {p['steps']} | {seeds} | {_pct(p['mean_top1'])} | "
                     f"{_pct(p['spread'])} | {p['wall_s']:.0f} |")
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


def verdict_lines(v: dict[str, dict], batches: Sequence[int]) -> list[str]:
    """One sentence per recipe: where it holds and where it breaks."""
    lines = []
    for r, d in v.items():
        name = RECIPES[r].label if r in RECIPES else r
        if not d["learned_at_base"]:
            lines.append(f"- {name}: did not learn at the base batch ({_pct(d['base_top1'])}%): nothing to hold.")
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
