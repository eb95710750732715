"""The study's result: the lr each sweep chose, the pass rule per recipe, time to accuracy, the
task's calibration, markdown tables and the plot.

**Pass rule** (the paper's sentence, "without losing accuracy", made testable): at the largest
batch, in the same epochs, a recipe passes when its final top-1 on every validation clip (the mean
over its seeds where there are several) is at most ``tolerance`` below the base batch's ((a) at the
base batch, the chosen lr, the mean over its seeds), where ``tolerance`` = max(:data:`MIN_TOLERANCE`
= 1 point, 2 SE), SE the standard error of the difference of the two means: from the seeds' sample
variances where a side has 2 or more seeds, floored by the binomial SE of the validation set
(sqrt(p (1 - p) / (N x seeds)) per side); and no seed diverged, failed or sat at chance (final
top-1 within :data:`CHANCE_MARGIN` points of chance). A recipe with runs missing is "pending".

**Time to accuracy**: the target is :data:`TARGET_FRACTION` (95 %) of the base's final top-1; a run
reaches it at its first evaluation (``--eval-every``; intermediate ones score a capped subset) at or
above it: optimizer steps and clips (steps x global batch).

**Calibration**: the base must not solve the task (its top-1 below :data:`SOLVED_TOP1`) and must be
near convergence: within :data:`CONVERGENCE_GAP` points of its own ``headroom`` x longer run.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from .grid import RECIPES

__all__ = ["MIN_TOLERANCE", "TARGET_FRACTION", "CHANCE_MARGIN", "SOLVED_TOP1", "CONVERGENCE_GAP", "binomial_se",
           "choose_lr", "select", "pass_rule", "time_to_accuracy", "verdicts", "calibration", "readme_table",
           "verdict_table", "sweep_table", "plot_study", "headline", "isolation"]

#: the smallest tolerance (top-1 points) of the pass rule
MIN_TOLERANCE = 1.0
#: time to accuracy: the target is this fraction of the base's final top-1
TARGET_FRACTION = 0.95
#: a run whose final top-1 is within this many points of chance "sat at chance"
CHANCE_MARGIN = 5.0
#: the base solves the task (no room to lose accuracy) at or above this top-1 (%)
SOLVED_TOP1 = 97.0
#: the base is near convergence when its longer run gains at most this many points
CONVERGENCE_GAP = 3.0


def binomial_se(top1: float, n: int) -> float:
    """Standard error (points) of a top-1 of ``top1`` % measured on ``n`` clips: 100 sqrt(p (1 - p) / n)."""
    p = min(max(top1 / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / n) if n > 0 else float("nan")


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def choose_lr(rows: Sequence[dict]) -> tuple[float | None, str]:
    """The lr of a sweep: the highest final top-1 among its completed runs (ties: the smaller lr).
    Returns (lr, why); (None, why) when no run completed. ``why`` also says when the chosen lr is
    the smallest or largest tried: the best lr may then lie outside the sweep (not claimed otherwise)."""
    done = [r for r in rows if r.get("status") == "completed" and r.get("val_top1") is not None]
    if not done:
        return None, f"no run of the sweep completed ({len(rows)} recorded)"
    best = max(done, key=lambda r: (float(r["val_top1"]), -float(r["lr_swept"])))
    tried = ", ".join(f"{_lr(r):g}" for r in sorted(rows, key=_lr))
    lr, lrs = float(best["lr_swept"]), [_lr(r) for r in rows]
    edge = ""
    if len(set(lrs)) > 1 and lr in (min(lrs), max(lrs)):
        side = "smallest" if lr == min(lrs) else "largest"
        edge = f"; the {side} lr tried: {'a smaller' if side == 'smallest' else 'a larger'} one was not run"
    return lr, f"highest final top-1 ({best['val_top1']:.1f}%) of {len(rows)} lrs ({tried}){edge}"


def _lr(r: dict) -> float:
    return float(r["lr_swept"])


def select(rows: Sequence[dict], recipe: str, batch: int, lr: float | None, *, epochs_factor: int = 1,
           lr_mult: float = 1.0) -> list[dict]:
    """The rows of ``recipe`` at ``batch`` and swept lr ``lr`` with that epochs factor and lr
    multiplier, by seed."""
    if lr is None:
        return []
    out = [r for r in rows if r.get("recipe") == recipe and r["batch"] == batch
           and math.isclose(float(r["lr_swept"]), lr) and int(r.get("epochs_factor", 1)) == epochs_factor
           and math.isclose(float(r.get("lr_mult", 1.0)), lr_mult)]
    return sorted(out, key=lambda r: r["seed"])


def _finals(runs: Sequence[dict]) -> list[float]:
    return [float(r["val_top1"]) for r in runs if r.get("status") == "completed" and r.get("val_top1") is not None]


def pass_rule(base: Sequence[dict], runs: Sequence[dict], *, val_clips: int, chance: float) -> dict[str, Any]:
    """The pass rule (module docstring) for ``runs`` (a recipe at the largest batch) against
    ``base`` (the base batch's runs).

    Returns:
        {"base_mean", "mean", "diff" (mean - base_mean, points), "se_seeds" (None where neither side
        has 2 seeds), "se_binomial", "se", "tolerance", "seeds", "at_chance" [seeds], "broken"
        [seed: outcome], "verdict": "pass" / "fail" / "pending", "text"}.
    """
    bf, rf = _finals(base), _finals(runs)
    out: dict[str, Any] = {"base_mean": _mean(bf), "mean": _mean(rf), "diff": None, "se_seeds": None,
                           "se_binomial": None, "se": None, "tolerance": None, "seeds": [r["seed"] for r in runs],
                           "at_chance": [r["seed"] for r in runs if r.get("status") == "completed"
                                         and r.get("val_top1") is not None
                                         and float(r["val_top1"]) <= chance + CHANCE_MARGIN],
                           "broken": [f"seed {r['seed']}: " + (f"diverged at step {r.get('diverged_at')}"
                                                               if r.get("status") == "diverged" else "failed")
                                      for r in runs if r.get("status") != "completed"]}
    if not bf or not runs:
        out.update(verdict="pending", text="pending: " + ("no base run" if not bf else "no run at the largest batch"))
        return out
    if out["broken"] or out["at_chance"]:
        why = "; ".join(out["broken"] + [f"seed {s} at chance" for s in out["at_chance"]])
        out.update(verdict="fail", text=f"fail: {why}")
        if rf:
            out["diff"] = out["mean"] - out["base_mean"]
        return out
    mb, mr = out["base_mean"], out["mean"]
    var = [(statistics_var(x), len(x)) for x in (bf, rf)]
    se_seeds = (math.sqrt(sum(v / n for v, n in var if v is not None))
                if any(v is not None for v, _ in var) else None)
    se_binom = math.sqrt(binomial_se(mb, val_clips * len(bf)) ** 2 + binomial_se(mr, val_clips * len(rf)) ** 2)
    se = max(se_binom, se_seeds or 0.0)
    tol = max(MIN_TOLERANCE, 2.0 * se)
    diff = mr - mb
    ok = diff >= -tol
    out.update(diff=diff, se_seeds=se_seeds, se_binomial=se_binom, se=se, tolerance=tol,
               verdict="pass" if ok else "fail",
               text=(f"{'pass' if ok else 'fail'}: {mr:.1f}% ({len(rf)} seed{'s' if len(rf) > 1 else ''}) vs the "
                     f"base's {mb:.1f}% ({len(bf)}): {diff:+.1f} points, tolerance {tol:.1f} (SE {se:.2f})"))
    return out


def statistics_var(xs: Sequence[float]) -> float | None:
    """Sample variance of ``xs`` (None for fewer than 2 values)."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


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


def verdicts(rows: Sequence[dict], chosen: dict[str, float | None], *, base_batch: int, largest: int,
             val_clips: int, chance: float, recipes: Sequence[str] = tuple(RECIPES),
             seeds: Sequence[int] = (0,)) -> dict[str, dict]:
    """Per recipe, :func:`pass_rule` of its chosen lr at ``largest`` against (a) at ``base_batch``
    (chosen lr, every seed), plus "recipe", "label", "lr" (chosen), "provisional" (the rule on the
    rows landed so far), "first_seed" (the rule on the first seed at ``largest`` alone, against the
    whole base: what decides a second seed for (b) / (c)), "base_complete" (every planned base seed
    landed, none crashed: the same for every recipe) and "missing" (what it still waits for).

    A verdict is final only on the seeds the study plans: the base's and (a)'s at ``largest`` are
    every one of ``seeds``; (b)'s / (c)'s the first, and every one when the first passes (the study
    then runs the others: stage ``seeds``). Until then it is "pending" and its text says what it
    waits for and what the rows say so far; a diverged or at-chance seed is a final "fail" at once
    (no later seed can undo it). A run recorded as "failed" (it crashed: no outcome of training; a
    rerun of the study runs it again) counts as not landed.
    """
    def landed(rs: Sequence[dict]) -> list[dict]:
        return [r for r in rs if r.get("status") != "failed"]

    every_base = [r for r in select(rows, "sgd", base_batch, chosen.get("sgd")) if r.get("role") != "headroom"]
    base = landed(every_base)
    crashed = [f"base seed {r['seed']} (failed: rerun)" for r in every_base if r.get("status") == "failed"]
    missing_base = [f"base seed {s}" for s in seeds if s not in {r["seed"] for r in every_base}]
    base_complete = not missing_base and not crashed
    out = {}
    for rc in recipes:
        every = select(rows, rc, largest, chosen.get(rc))
        runs = landed(every)
        v = pass_rule(base, runs, val_clips=val_clips, chance=chance)
        first = pass_rule(base, [r for r in runs if r["seed"] == seeds[0]], val_clips=val_clips,
                          chance=chance)["verdict"]
        want = list(seeds) if rc == "sgd" or (first == "pass" and base_complete) \
            else list(seeds[:1])
        have = {r["seed"] for r in runs}
        missing = missing_base + crashed + [
            f"seed {s} at {largest}" + (" (failed: rerun)" if s in {r["seed"] for r in every} else "")
            for s in want if s not in have]
        provisional = v["verdict"]
        if provisional != "pending" and missing and not (v["broken"] or v["at_chance"]):
            v["verdict"] = "pending"
            v["text"] = f"pending: waits for {', '.join(missing)} (so far {v['text']})"
        out[rc] = {"recipe": rc, "label": RECIPES[rc].label, "lr": chosen.get(rc), **v,
                   "provisional": provisional, "first_seed": first, "base_complete": base_complete,
                   "missing": missing}
    return out


def calibration(rows: Sequence[dict], sgd_lr: float | None, *, base_batch: int, headroom: int) -> dict[str, Any]:
    """Is the base batch a fair reference? ``solved``: its mean final top-1 >= :data:`SOLVED_TOP1`
    (no room to lose accuracy); ``converged``: its seed-0 run within :data:`CONVERGENCE_GAP` points of
    its ``headroom`` x longer run (None until that run is recorded).

    Returns:
        {"base_mean", "longer_top1", "gap", "solved", "converged", "passed" (not solved and
        converged; None while pending), "text"}.
    """
    base = [r for r in select(rows, "sgd", base_batch, sgd_lr) if r.get("role") != "headroom"]
    longer = select(rows, "sgd", base_batch, sgd_lr, epochs_factor=headroom) if headroom else []
    bf, lf = _finals(base), _finals(longer)
    mean = _mean(bf)
    s0 = next((float(r["val_top1"]) for r in base if r["seed"] == 0 and r.get("val_top1") is not None), None)
    gap = (lf[0] - s0) if lf and s0 is not None else None
    solved = mean is not None and mean >= SOLVED_TOP1
    converged = None if gap is None else gap <= CONVERGENCE_GAP
    passed = None if mean is None or converged is None else (not solved and converged)
    seeds0 = " / ".join(f"{x:.1f}" for x in bf)
    text = (("base " + (f"{mean:.1f}% (seeds {seeds0})" if mean is not None else "pending")
             + (f" (solved: at or above {SOLVED_TOP1:.0f}%)" if solved else "")) + "; "
            + (f"{headroom}x longer run pending" if gap is None else
               f"{headroom}x longer run (seed 0) {lf[0]:.1f}% ({gap:+.1f} points over seed 0: "
               f"{'near convergence' if converged else 'NOT near convergence'}, wanted <= {CONVERGENCE_GAP:.0f})"))
    return {"base_mean": mean, "longer_top1": lf[0] if lf else None, "gap": gap, "solved": solved,
            "converged": converged, "passed": passed, "text": text}


def isolation(rows: Sequence[dict], sgd_verdict: dict, sgd_lr: float | None, *, base_batch: int, largest: int,
              headroom: int) -> dict[str, Any]:
    """What (a)'s isolation runs (stage ``isolate``: the rule's run at ``largest``, seed 0, at half its
    lr, and at twice its epochs) say about why (a) failed, read against (a)'s own verdict.

    The yardstick is (a)'s tolerance (its verdict's, which carries the spread of its seeds at
    ``largest``): a run "closes the gap" when its final top-1 is at most that far below the base's
    mean, "recovers part of it" when it beats every seed of (a) at the rule's lr without closing it,
    and otherwise "does not close it". The 2x-epochs run is also read against the base's own
    ``headroom`` x longer run (the same epochs, when ``headroom`` is 2). One seed each: a hint
    about the cause, not a verdict.

    Returns:
        {"half_lr": {"top1", "outcome", "text"} or None, "x2": {"top1", "outcome", "vs_longer_base",
        "text"} or None, "text" (one paragraph; "" when neither run has landed or (a) did not fail)}.
    """
    out: dict[str, Any] = {"half_lr": None, "x2": None, "text": ""}
    tol, base_mean = sgd_verdict.get("tolerance"), sgd_verdict.get("base_mean")
    if sgd_verdict.get("verdict") != "fail" or tol is None or base_mean is None:
        return out
    rule = _finals(select(rows, "sgd", largest, sgd_lr))
    longer = _finals(select(rows, "sgd", base_batch, sgd_lr, epochs_factor=headroom)) if headroom else []

    def judge(top1: float) -> str:
        if top1 >= base_mean - tol:
            return "closes"   # one-sided, as the pass rule: at most ``tol`` below the base
        return "part" if rule and top1 > max(rule) else "no"

    seeds = " / ".join(f"{x:.1f}" for x in rule)
    words = {"closes": f"closes the gap (at most (a)'s tolerance, {tol:.1f} points, below the base's "
                       f"{base_mean:.1f} %)",
             "part": f"recovers part of the gap (above every seed of (a), {seeds} %, but more than {tol:.1f} points "
                     f"below the base's {base_mean:.1f} %)",
             "no": f"does not close the gap (not above every seed of (a) at the rule's lr, {seeds} %)"}
    parts = []
    half = _finals(select(rows, "sgd", largest, sgd_lr, lr_mult=0.5))
    if half and sgd_lr is not None:
        o = judge(half[0])
        lr = sgd_lr * largest / base_batch
        cause = ("the linear rule's lr is too high here" if o == "closes" else
                 "a lower lr helps but does not explain the whole gap" if o == "part" else
                 "a lower lr does not recover the loss (no higher lr was tried)")
        t = (f"at half the rule's lr ({lr / 2:g} instead of {lr:g} at {largest}, one seed) the final top-1 is "
             f"{half[0]:.1f} %: it {words[o]}: {cause}")
        out["half_lr"] = {"top1": half[0], "outcome": o, "text": t}
        parts.append(t)
    x2_rows = select(rows, "sgd", largest, sgd_lr, epochs_factor=2)
    x2 = _finals(x2_rows)
    if x2:
        o = judge(x2[0])
        cause = ("consistent with too few steps at the study's length: twice the epochs (twice the optimizer "
                 "steps and the clips: this run does not tell the two apart) reach the base's accuracy"
                 if o == "closes" else
                 "a longer run helps but does not explain the whole gap" if o == "part" else
                 "a longer run does not recover it: too few steps is not the cause")
        vs = None
        if longer and headroom == 2:
            vs = x2[0] - longer[0]
            cause += (f"; against the base's own 2x longer run (the same epochs, {longer[0]:.1f} %) it is "
                      f"{vs:+.1f} points")
        t = (f"at twice the epochs ({x2_rows[0].get('steps')} optimizer steps at {largest}, one seed) the final "
             f"top-1 is {x2[0]:.1f} %: it {words[o]}: {cause}")
        out["x2"] = {"top1": x2[0], "outcome": o, "vs_longer_base": vs, "text": t}
        parts.append(t)
    if parts:
        out["text"] = ("Why (a) fails, from its isolation runs (the rule's run at the largest batch, seed 0, "
                       "one change each): " + "; ".join(parts) + ".")
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _outcome(row: dict) -> str:
    if row.get("status") == "diverged":
        return f"diverged at step {row.get('diverged_at')}"
    return str(row.get("status"))


def _kind(row: dict) -> str:
    role = row.get("role", "grid")
    if role == "headroom":
        return f"longer x{row.get('epochs_factor')}"
    if role == "isolate":
        return f"isolate (lr x{row.get('lr_mult'):g}, epochs x{row.get('epochs_factor')})"
    return role


def readme_table(rows: Sequence[dict], target: float | None) -> str:
    """Markdown for docs/large-batch.md: one line per run (recipe, batch, lr, seed order): recipe,
    kind (sweep / grid / longer / isolate), global batch, micro-batch x accumulation, seed, lr
    read back, optimizer steps (warm-up), outcome, final and best top-1 (%), and optimizer steps /
    clips to ``target`` ("not reached"; "- (no target yet)" before the base has landed). A test
    keeps the guide's table equal to this function of
    the committed ``results/large_batch/large_batch.json``."""
    lines = ["| recipe | kind | global batch | micro x accum | seed | lr | steps (warm-up) | outcome | "
             "final top-1 (%) | best top-1 (%) | steps / clips to target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {r: i for i, r in enumerate(RECIPES)}
    for r in sorted(rows, key=lambda r: (order.get(r.get("recipe"), 9), r["batch"], float(r["lr_swept"]),
                                         int(r.get("epochs_factor", 1)), float(r.get("lr_mult", 1.0)), r["seed"])):
        st, clips = time_to_accuracy(r, target)
        tta = "- (no target yet)" if target is None else "not reached" if clips is None else f"{st:,} / {clips:,}"
        lr = "-" if r.get("lr") is None else f"{r['lr']:.4g}"
        steps = "-" if r.get("steps") is None else f"{r['steps']} ({r.get('warmup_steps')})"
        lines.append(f"| {r.get('recipe')} | {_kind(r)} | {r['batch']} | {r.get('micro_batch')} x {r.get('accum')} | "
                     f"{r['seed']} | {lr} | {steps} | {_outcome(r)} | {_pct(r.get('val_top1'))} | "
                     f"{_pct(r.get('best_val_top1'))} | {tta} |")
    return "\n".join(lines) + "\n"


def headline(v: dict[str, dict], base_batch: int, largest: int) -> str:
    """One sentence of the verdicts for the README's results row (a test keeps the row equal to it):
    per recipe "(x) NAME passes / fails at Kx: M % (S seeds at LARGEST) vs the base's B %" or "(x) NAME
    pending"."""
    short = {"sgd": "(a) SGD, linear rule + 5-epoch warm-up (the paper's)", "lars": "(b) LARS", "lamb": "(c) LAMB"}
    parts = []
    for rc, d in v.items():
        name = short.get(rc, rc)
        if d["verdict"] == "pending" or d["mean"] is None:
            parts.append(f"{name}: pending")
            continue
        n = len(d["seeds"])
        parts.append(f"{name} {'passes' if d['verdict'] == 'pass' else 'fails'} at {largest // base_batch}x: "
                     f"{d['mean']:.1f} % ({n} seed{'s' if n > 1 else ''} at {largest}) vs the base's "
                     f"{d['base_mean']:.1f} %")
    return "; ".join(parts)


def verdict_table(v: dict[str, dict], largest: int) -> str:
    """Markdown: one line per recipe: chosen lr, its largest-batch mean (seeds), the base's mean,
    the difference, the tolerance and the verdict (pass / fail / pending)."""
    lines = [f"| recipe | lr chosen | top-1 at {largest} (%) | base (%) | difference | tolerance | verdict |",
             "|---|---|---|---|---|---|---|"]
    for d in v.values():
        lr = "-" if d["lr"] is None else f"{d['lr']:g}"
        diff = "-" if d["diff"] is None else f"{d['diff']:+.1f}"
        tol = "-" if d["tolerance"] is None else f"{d['tolerance']:.1f}"
        mean = _pct(d["mean"]) + (f" ({len(d['seeds'])} seeds)" if len(d["seeds"]) > 1 else "")
        lines.append(f"| {d['label']} | {lr} | {mean} | {_pct(d['base_mean'])} | {diff} | {tol} | {d['text']} |")
    return "\n".join(lines) + "\n"


def sweep_table(rows: Sequence[dict], recipe: str, batch: int, chosen: float | None) -> str:
    """Markdown of one sweep (lr, final and best top-1, outcome, wall time), the chosen lr marked."""
    lines = [f"| {recipe} lr at batch {batch} | final top-1 (%) | best (%) | outcome | wall s |",
             "|---|---|---|---|---|"]
    runs = [r for r in rows if r.get("recipe") == recipe and r["batch"] == batch and r.get("role") == "sweep"]
    for r in sorted(runs, key=_lr):
        mark = " (chosen)" if chosen is not None and math.isclose(_lr(r), chosen) else ""
        lines.append(f"| {_lr(r):g}{mark} | {_pct(r.get('val_top1'))} | {_pct(r.get('best_val_top1'))} | "
                     f"{_outcome(r)} | {float(r.get('wall_s') or 0):.0f} |")
    return "\n".join(lines) + "\n"


def plot_study(rows: Sequence[dict], out: Path, *, chance: float, title: str) -> Path | None:
    """PNG: final top-1 of every run against the global batch, one colour per recipe (x: diverged;
    triangles: runs of more epochs than the study's),
    and the evaluation curves (top-1 against clips seen) of the chosen-lr runs; None without runs."""
    done = [r for r in rows if r.get("recipe") in RECIPES]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, rc in enumerate(RECIPES):
        mine = [r for r in done if r["recipe"] == rc]
        color = f"C{i}"
        for longer in (False, True):        # runs of more epochs than the study's (headroom, isolation): triangles
            pts = [r for r in mine if r.get("val_top1") is not None and (int(r.get("epochs_factor", 1)) > 1) == longer]
            if pts or not longer:
                ax.scatter([r["batch"] * (1 + 0.04 * i) for r in pts], [r["val_top1"] for r in pts], s=16,
                           color=color, marker="^" if longer else "o",
                           label=RECIPES[rc].label + (", more epochs" if longer else ""))
        for r in mine:
            if r.get("status") == "diverged":
                ax.scatter([r["batch"]], [0], marker="x", s=60, color=color)
            hist = r.get("history") or []
            if hist and r.get("role") != "sweep":
                b = int(r.get("global_batch") or r["batch"])
                ax2.plot([h["step"] * b for h in hist], [h["val_top1"] for h in hist], color=color, alpha=0.7,
                         lw=1)
    ax.axhline(chance, ls=":", color="grey", label=f"chance {chance:.0f}%")
    batches = sorted({r["batch"] for r in done})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("global batch (clips)")
    ax.set_ylabel("final val top-1 (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax2.set_xlabel("clips seen")
    ax2.set_ylabel("val top-1 (%)")
    ax2.set_title("evaluations of the non-sweep runs", fontsize=9)
    fig.tight_layout()
    from tsm_ds.bench.plots import save_figure
    return save_figure(fig, Path(out))
