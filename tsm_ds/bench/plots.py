"""PNG plots of the benchmark JSON files (matplotlib, Agg backend: no display needed).

Each ``plot_*`` function reads one JSON written by :func:`tsm_ds.utils.io.write_report` and
returns the PNG path, or None when the JSON is missing, unreadable or holds no plottable rows
(``tsm-ds bench all`` must survive a bench that failed). Field names are found by looking at the
rows, not hard-coded, because each bench has its own owner:

- models.json (``bench models``): a name column (``model`` / ``name`` / ``arch``) and throughput
  columns whose name contains ``clips_per_s`` (train / inference) -> ``models_throughput.png``.
- data.json (``bench data``): a loader name column and ``clips_per_s`` (or ``frames_per_s``)
  -> ``loader.png``.
- comm.json (``bench comm``): a compressor / method column and a ``bytes`` column -> ``comm_bytes.png``.
- scale.json (``bench scale``): rows with model, gpus, train_time_s, ideal_time_s, efficiency
  -> ``scaling.png`` (time and efficiency against GPUs, ideal vs predicted, TSM vs I3D, paper points).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from tsm_ds.utils.io import atomic_path, read_report  # noqa: E402

NAME_KEYS = ("model", "name", "arch", "loader", "variant", "config", "compressor", "method", "mode",
             "label", "case")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def row_label(row: dict[str, Any], keys: Sequence[str] = NAME_KEYS) -> str:
    """A row's display name: the values of the name-like string columns it has, joined by ' '.

    Args:
        row: one flat dict of a bench's ``rows``.
        keys: column names to try, in order.

    Returns:
        e.g. ``"tsm_resnet50 8f"``; ``"?"`` when the row has none of them.
    """
    parts = [str(row[k]) for k in keys if isinstance(row.get(k), str) and row.get(k)]
    for k in ("frames", "num_segments", "T"):
        if _is_num(row.get(k)) and not any(f"{int(row[k])}f" in p for p in parts):
            parts.append(f"{int(row[k])}f")
            break
    return " ".join(dict.fromkeys(parts)) or "?"


def numeric_columns(rows: Sequence[dict[str, Any]], *, contains: Sequence[str],
                    exclude: Sequence[str] = ()) -> list[str]:
    """Columns (in first-seen order) holding a finite number in at least one row, whose name
    contains one of ``contains`` and none of ``exclude``."""
    cols: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k in cols or not _is_num(v):
                continue
            if any(c in k for c in contains) and not any(e in k for e in exclude):
                cols.append(k)
    return cols


def _bars(rows: Sequence[dict[str, Any]], cols: Sequence[str], title: str, ylabel: str,
          out: Path, *, log: bool = False) -> Path:
    labels = [row_label(r) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) * max(1, len(cols)) + 2), 4.5))
    width = 0.8 / len(cols)
    for j, c in enumerate(cols):
        xs = [i + (j - (len(cols) - 1) / 2) * width for i in range(len(rows))]
        ys = [r.get(c) if _is_num(r.get(c)) else 0.0 for r in rows]
        bars = ax.bar(xs, ys, width, label=c)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    if len(cols) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out)


def save_figure(fig, out: Path) -> Path:
    """Write ``fig`` to the PNG ``out`` atomically and close it; returns ``out``."""
    try:
        with atomic_path(out, suffix=".png") as tmp:   # matplotlib picks the format by extension
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
    return out


def _rows(json_path: str | os.PathLike) -> list[dict[str, Any]]:
    payload = read_report(json_path)
    return [r for r in (payload or {}).get("rows", []) if isinstance(r, dict)]


def plot_models(json_path: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Training and inference clips/s per model (models.json) -> PNG, or None.

    One panel per throughput column (``train_clips_per_s``, ``infer_clips_per_s``; ratio and
    spread columns are left out), one bar per model, labelled with the value and its ratio to the
    TSM row when there is one ("0.39 (1.00x)").
    """
    rows = _rows(json_path)
    cols = numeric_columns(rows, contains=("clips_per_s", "clips_s", "throughput"),
                           exclude=("spread", "std", "iqr", "min", "max", "ratio", "_vs_", "_lo", "_hi"))
    rows = [r for r in rows if any(_is_num(r.get(c)) for c in cols)]
    if not rows or not cols:
        return None
    cols = cols[:2]
    labels = [row_label(r) for r in rows]
    tsm = next((r for r, lab in zip(rows, labels) if lab.lower().startswith("tsm")), None)
    fig, axes = plt.subplots(1, len(cols), figsize=(min(16.0, 1.0 * len(rows) * len(cols) + 3), 4.6),
                             squeeze=False)
    for ax, col in zip(axes[0], cols):
        ys = [r.get(col) if _is_num(r.get(col)) else 0.0 for r in rows]
        bars = ax.bar(range(len(rows)), ys, color=[f"C{k}" for k in range(len(rows))])
        ref = tsm.get(col) if tsm is not None and _is_num(tsm.get(col)) else None
        ax.bar_label(bars, labels=[f"{y:.3g}" + (f"\n({y / ref:.2f}x)" if ref else "") for y in ys],
                     fontsize=7)
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(col.replace("_", " "))
        ax.set_title(col.split("_")[0] + " throughput (median; ratio to TSM)")
        ax.margins(y=0.15)
    fig.tight_layout()
    return save_figure(fig, Path(out))


def plot_loader(json_path: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Loader comparison (data.json) -> PNG, or None when there is nothing to plot.

    Rows with ``input`` and ``loader`` columns (``tsm-ds bench data``) become grouped bars: one
    group per input (real clips, long-GOP video, ...), one bar per loader, clips/s on a log axis
    (the loaders differ by orders of magnitude on long videos). Other layouts: one bar per row.
    The format table's rows (``"table": "formats"``) are not plotted here.
    """
    rows = [r for r in _rows(json_path) if r.get("table") != "formats"]
    cols = numeric_columns(rows, contains=("clips_per_s", "clips_s"),
                           exclude=("spread", "std", "iqr", "min", "max", "ratio", "_lo", "_hi"))
    if not cols:
        cols = numeric_columns(rows, contains=("frames_per_s", "fps"),
                               exclude=("spread", "std", "iqr", "min", "max", "ratio"))
    rows = [r for r in rows if any(_is_num(r.get(c)) for c in cols)]
    if not rows or not cols:
        return None
    col = cols[0]
    if not all(isinstance(r.get("input"), str) and isinstance(r.get("loader"), str) for r in rows):
        return _bars(rows, cols[:2], "Clip loader comparison (median)", col.replace("_", " "), Path(out))
    inputs = list(dict.fromkeys(r["input"] for r in rows))
    loaders = list(dict.fromkeys(r["loader"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(7.0, 2.2 * len(inputs) + 2), 4.8))
    width = 0.8 / len(loaders)
    for j, name in enumerate(loaders):
        xs, ys = [], []
        for i, inp in enumerate(inputs):
            v = next((r[col] for r in rows if r["input"] == inp and r["loader"] == name), None)
            if _is_num(v):
                xs.append(i + (j - (len(loaders) - 1) / 2) * width)
                ys.append(v)
        if xs:
            bars = ax.bar(xs, ys, width, label=name)
            ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(range(len(inputs)), inputs, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(col.replace("_", " ") + " (log)")
    ax.set_title("Clip loader comparison (median of interleaved repetitions)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, Path(out))


def plot_comm(json_path: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Communication per step per method (comm.json) -> PNG, or None.

    Left: bytes sent per rank per step (the first ``bytes`` column, log axis). Right, when the
    rows have one: time per step in ms (the first ``time_ms`` / ``_ms`` column).
    """
    rows = _rows(json_path)
    bcols = numeric_columns(rows, contains=("bytes",), exclude=("ratio", "spread", "std"))
    rows = [r for r in rows if any(_is_num(r.get(c)) for c in bcols)]
    if not rows or not bcols:
        return None
    bcol = "bytes_sent_per_rank" if "bytes_sent_per_rank" in bcols else bcols[0]
    tcols = numeric_columns(rows, contains=("time_ms", "_ms"), exclude=("ratio", "spread", "std"))
    labels = [row_label(r) for r in rows]
    fig, axes = plt.subplots(1, 2 if tcols else 1, figsize=(11 if tcols else 6.5, 4.3), squeeze=False)
    panels = [(axes[0][0], bcol, True)] + ([(axes[0][1], tcols[0], False)] if tcols else [])
    for i, (ax, col, log) in enumerate(panels):
        ys = [r.get(col) if _is_num(r.get(col)) else 0.0 for r in rows]
        bars = ax.bar(range(len(rows)), ys, color=[f"C{k}" for k in range(len(rows))])
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(col.replace("_", " ") + (" (log)" if log else ""))
        if log:
            ax.set_yscale("log")
        ax.set_title("Gradient bytes per step" if i == 0 else "Time per step (median)")
    fig.tight_layout()
    return save_figure(fig, Path(out))


def plot_scaling(json_path: str | os.PathLike, out: str | os.PathLike) -> Path | None:
    """Scaling curve from scale.json: training time vs GPUs (log-log) per model, predicted and
    ideal (linear from the first point), the paper's two points; efficiency on a second panel.

    Returns the PNG path, or None when scale.json is missing or has no curve rows.
    """
    payload = read_report(json_path)
    rows = [r for r in (payload or {}).get("rows", [])
            if isinstance(r, dict) and _is_num(r.get("gpus")) and _is_num(r.get("train_time_s"))]
    if not rows:
        return None
    models = list(dict.fromkeys(str(r.get("model", "?")) for r in rows))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, m in enumerate(models):
        mr = sorted((r for r in rows if str(r.get("model", "?")) == m), key=lambda r: r["gpus"])
        g = [r["gpus"] for r in mr]
        color = f"C{i}"
        ax.plot(g, [r["train_time_s"] / 3600 for r in mr], "o-", color=color, label=f"{m} predicted")
        if all(_is_num(r.get("ideal_time_s")) for r in mr):
            ax.plot(g, [r["ideal_time_s"] / 3600 for r in mr], "--", color=color, alpha=0.6,
                    label=f"{m} ideal")
        if all(_is_num(r.get("efficiency")) for r in mr):
            ax2.plot(g, [100 * r["efficiency"] for r in mr], "o-", color=color, label=m)
    meta = (payload or {}).get("meta", {})
    cal, pred = meta.get("calibration", {}), meta.get("prediction", {})
    if _is_num(cal.get("paper_time_s")) and _is_num(cal.get("gpus")):
        ax.plot([cal["gpus"]], [cal["paper_time_s"] / 3600], "k*", ms=12, label="paper (calibration)")
    if _is_num(pred.get("paper_time_s")) and _is_num(pred.get("gpus")):
        err = pred.get("error_pct")
        ax.plot([pred["gpus"]], [pred["paper_time_s"] / 3600], "rX", ms=11,
                label="paper (predicted" + (f", error {err:+.1f} %)" if _is_num(err) else ")"))
    ticks = sorted({int(r["gpus"]) for r in rows})
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(ticks, [str(t) for t in ticks], fontsize=7)
        a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("training time (h)")
    ax.set_title("Kinetics training time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("scaling efficiency (%)")
    ax2.set_ylim(0, 105)
    ax2.axhline(100, color="k", lw=0.8, ls="--")
    ax2.set_title("Efficiency = ideal / predicted")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, Path(out))


#: plot name -> (input JSON, function, output PNG)
PLOTS = {
    "models": ("models.json", plot_models, "models_throughput.png"),
    "data": ("data.json", plot_loader, "loader.png"),
    "comm": ("comm.json", plot_comm, "comm_bytes.png"),
    "scale": ("scale.json", plot_scaling, "scaling.png"),
}


def make_plots(out_dir: str | os.PathLike) -> dict[str, Path | str]:
    """Every plot whose JSON exists in ``out_dir``.

    Returns:
        {name: PNG path, or a string saying why there is none ("no models.json", the error)}.
        A broken JSON or a plotting error never raises here: it is reported in the dict.
    """
    out_dir = Path(out_dir)
    result: dict[str, Path | str] = {}
    for name, (src, fn, png) in PLOTS.items():
        if not (out_dir / src).exists():
            result[name] = f"no {src}"
            continue
        try:
            path = fn(out_dir / src, out_dir / png)
        except Exception as e:  # one bench's odd rows must not stop the other plots
            result[name] = f"{src}: plot failed: {type(e).__name__}: {e}"
            continue
        result[name] = path if path is not None else f"{src}: no plottable rows"
    return result
