"""One output format for every benchmark: a JSON file and a markdown table (plots: see plots).

Each bench builds ``rows`` (a list of flat dicts, one per measured configuration) plus free-form
``meta`` (machine, sizes, repetitions) and calls :func:`write_report`.
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Sequence


def machine_info() -> dict[str, Any]:
    """Facts about the machine a benchmark ran on: CPU count, torch version and thread count, GPU."""
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render ``rows`` as a GitHub markdown table; floats get 4 significant digits."""
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_report(name: str, rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike, *,
                 meta: dict[str, Any] | None = None, columns: Sequence[str] | None = None,
                 title: str | None = None) -> tuple[Path, Path]:
    """Write ``{out_dir}/{name}.json`` (meta, machine, rows) and ``{out_dir}/{name}.md``.

    Returns the two paths. The directory is created when missing.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"name": name, "meta": meta or {}, "machine": machine_info(), "rows": list(rows)}
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md = f"## {title or name}\n\n" + markdown_table(rows, columns)
    if meta:
        md += "\n" + "\n".join(f"- {k}: {v}" for k, v in meta.items()) + "\n"
    md_path.write_text(md)
    return json_path, md_path
