"""The doctor's outputs under ``--out``: ``doctor.json``, ``doctor.md``, ``doctor.png``.

``doctor.json``::

    {"schema": "tsm_ds.doctor/1", "created": "2026-...Z", "settings": {...}, "machine": {...},
     "sections": {name: section dict (core.section_result's schema), ...},   # run order
     "failed": [names of failed sections], "exit_status": 0 | 1}

``doctor.md`` renders the verdict and its advice first, then every section from the schema alone
(summary, table of ``rows``, notes), so sections added later need no change here. ``doctor.png``:
clips/s per device of every measured capacity (compute variants, loader worker counts, the
re-encoded sample, the whole pipeline, compute + all-reduce), log scale, the verdict as title.
All files are written atomically (:mod:`tsm_ds.utils.io`).
"""
from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

from tsm_ds.utils.io import atomic_write_text, machine_info, markdown_table

__all__ = ["SCHEMA", "TITLE_WIDTH", "build_report", "write_report", "markdown", "measured", "figure", "plot"]

SCHEMA = "tsm_ds.doctor/1"


def build_report(settings: dict[str, Any], sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``doctor.json`` payload (module docstring) from the settings and the sections' dicts."""
    failed = [n for n, s in sections.items() if s.get("status") == "failed"]
    return {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "settings": settings, "machine": machine_info(), "sections": sections, "failed": failed,
            "exit_status": 1 if failed else 0}


#: sections that train or time the settings' model (``arch``, ``num_segments``, ``img_size``)
MODEL_SECTIONS = ("compute", "data", "communication")
#: sections that use the settings' recipe
RECIPE_SECTIONS = ("environment", "compute", "communication")


def measured(report: dict[str, Any]) -> str:
    """What the report measured, for its header: the model of the sections that ran and the recipe.

    The model is the one a section actually built, after the doctor's own defaults (not the
    training command's flags, which the doctor does not see): the compute section's stored
    ``arch`` / ``num_segments`` / ``img_size``, else the settings' for data and communication; the
    recipe smoke's small model (``recipes``); none for the cluster, environment and 1-bit checks.

    Args:
        report: the ``doctor.json`` payload (:func:`build_report`).

    Returns:
        E.g. ``"model resnet18 8x64 (compute, data), recipe cpu_fp32"``, ``"recipe smoke model
        resnet18 8x64, recipe cpu_fp32"``, or ``"no model measured (cluster)"``.
    """
    secs, s = report["sections"], report["settings"]
    parts = []
    ran = [n for n in MODEL_SECTIONS if n in secs and secs[n].get("status") != "skipped"]
    if ran:
        v = secs["compute"]["values"] if "compute" in ran and secs["compute"]["values"].get("arch") else s
        shape = f"{v.get('num_segments')}x{v.get('img_size')}"
        parts.append(f"model {v.get('arch')} {shape} ({', '.join(ran)})" if ran != ["data"]
                     else f"clips {shape} (data)")
    rv = secs.get("recipes", {}).get("values", {})
    if rv.get("arch"):
        parts.append(f"recipe smoke model {rv['arch']} {rv['num_segments']}x{rv['img_size']}")
    if not parts:
        parts.append(f"no model measured ({', '.join(secs) or 'no section'})")
    if any(n in secs for n in RECIPE_SECTIONS) and s.get("recipe"):
        parts.append(f"recipe {s['recipe']}")
    return ", ".join(parts)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def markdown(report: dict[str, Any]) -> str:
    """``doctor.md``'s text (see the module docstring)."""
    secs = report["sections"]
    s = report["settings"]
    lines = ["# tsm-ds doctor", "",
             f"{report['created']}; {report['machine'].get('platform')}; {measured(report)}"
             + ("; quick" if s.get("quick") else ""), ""]
    v = secs.get("verdict")
    if v:
        lines += ["## Verdict", "", f"**{v['summary']}**", ""]
        lines += [f"- {a['text']}" for a in v["values"].get("advice", [])] + [""]
    if report["failed"]:
        lines += [f"**Failed checks: {', '.join(report['failed'])}** (exit status 1)", ""]
    for name, sec in secs.items():
        if name == "verdict":
            continue
        lines += [f"## {sec['title']} ({sec['status']}, {sec.get('seconds')} s)", "", sec["summary"], ""]
        if sec.get("error"):
            lines += [f"Error: `{sec['error']}`", ""]
        if sec["rows"]:
            cols = list(dict.fromkeys(k for r in sec["rows"] for k in r if _scalar(r.get(k))))
            lines += [markdown_table(sec["rows"], cols)]
        lines += [f"- note: {n}" for n in sec["notes"]]
        vals = {k: x for k, x in sec["values"].items() if _scalar(x)}
        if vals:
            lines += ["", "<details><summary>values</summary>", "",
                      *[f"- {k}: {f'{x:.4g}' if isinstance(x, float) else x}" for k, x in vals.items()],
                      "", "</details>"]
        lines += [""]
    if report.get("plot"):
        lines += ["![clips/s per device](doctor.png)", ""]
    return "\n".join(lines)


def _bars(report: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(label, clips/s per device, kind) of every measured capacity."""
    secs = report["sections"]
    out = []
    comp = secs.get("compute", {})
    if comp.get("status") == "ok":
        for r in comp["rows"]:
            out.append((f"compute {r['variant']} ({r['precision']})", r["clips_per_s"], "compute"))
    data = secs.get("data", {})
    if data.get("status") == "ok":
        for r in data["rows"]:
            kind = "pipeline" if r["measure"].startswith("pipeline") else "data"
            if kind == "pipeline":
                label = f"pipeline: loader ({r['workers']} workers) + training"
            elif r["measure"].startswith("re-encoded"):
                label = "prepared sample, 1 thread"
            else:
                w = r["workers"]
                label = f"loader, {w} worker{'s' if w > 1 else ''}" if w else "loader, 1 thread in process"
            out.append((label, r["clips_per_s"], kind))
    ver = secs.get("verdict", {}).get("values", {})
    if secs.get("communication", {}).get("status") == "ok" and ver.get("compute_comm_clips_per_s"):
        out.append(("compute + all-reduce", ver["compute_comm_clips_per_s"], "communication"))
    return [b for b in out if isinstance(b[1], (int, float)) and b[1] > 0]


#: characters per title line of ``doctor.png``: the whole verdict shows, wrapped, over the
#: figure's width (8 inches at font size 9: about 110 characters fit; 80 leaves a margin)
TITLE_WIDTH = 80


def figure(report: dict[str, Any]):
    """The ``doctor.png`` figure (module docstring), or None when nothing was measured.

    The title is the verdict's whole summary, wrapped at :data:`TITLE_WIDTH` characters (words
    never broken, no line dropped) as the figure's title, centred on the figure, not on the axes
    (whose left edge moves right with the bar labels), so no part of it falls outside the image.

    Returns:
        a ``matplotlib.figure.Figure`` (the caller saves and closes it), or None.
    """
    bars = _bars(report)
    if not bars:
        return None
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"compute": "tab:blue", "data": "tab:orange", "pipeline": "tab:green", "communication": "tab:red"}
    title = report["sections"].get("verdict", {}).get("summary", "tsm-ds doctor")
    lines = textwrap.wrap(title, TITLE_WIDTH, break_long_words=False, break_on_hyphens=False)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.4 + 0.2 * len(lines)))
    ys = range(len(bars))
    ax.barh(list(ys), [b[1] for b in bars], color=[colors[b[2]] for b in bars])
    for y, b in zip(ys, bars):
        ax.text(b[1], y, f" {b[1]:.3g}", va="center", fontsize=8)
    ax.set_yticks(list(ys), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(min(b[1] for b in bars) / 2, max(b[1] for b in bars) * 3)
    ax.set_xlabel("clips/s per device (log scale)")
    fig.suptitle("\n".join(lines), fontsize=9)
    fig.tight_layout()
    return fig


def plot(report: dict[str, Any], out: str | Path) -> Path | None:
    """``doctor.png`` (module docstring, :func:`figure`); None when nothing was measured.

    Raises:
        OSError: ``out`` cannot be written.
    """
    fig = figure(report)
    if fig is None:
        return None
    from tsm_ds.bench.plots import save_figure

    return save_figure(fig, Path(out))


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write doctor.json, doctor.png (when something was measured) and doctor.md into ``out_dir``.

    Returns:
        {"json": path, "md": path, "png": path or absent}.

    Raises:
        OSError: ``out_dir`` is not writable.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    png = plot(report, out / "doctor.png")
    if png is not None:
        paths["png"] = png
    paths["json"] = atomic_write_text(out / "doctor.json", json.dumps(report, indent=2, default=str) + "\n")
    md = markdown({**report, "plot": png is not None})
    paths["md"] = atomic_write_text(out / "doctor.md", md + "\n")
    return paths
