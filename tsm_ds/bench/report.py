"""One output format for every benchmark: a JSON file and a markdown table (plots: see plots).

Each bench builds ``rows`` (a list of flat dicts, one per measured configuration) plus free-form
``meta`` (machine, sizes, repetitions) and calls :func:`write_report`. Files are written
atomically (temporary file + ``os.replace``) so that an interrupted bench never leaves half a
JSON for ``tsm-ds bench all`` or the plots to trip on. :func:`read_report` is the reading side.
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Sequence


def machine_info() -> dict[str, Any]:
    """Facts about the machine a benchmark ran on: CPU count, torch version and thread count, GPU.

    torch is queried only when the bench already imported it (every measuring bench does); a
    bench that does not need it (``bench scale``) reports the installed version without paying
    the import (seconds on a busy machine).
    """
    import sys
    from importlib import metadata

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            info["torch"] = metadata.version("torch")
        except metadata.PackageNotFoundError:
            info["torch"] = None
        return info
    info.update({"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                 "cuda": torch.cuda.is_available()})
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
    atomic_write_text(json_path, json.dumps(payload, indent=2, default=str) + "\n")
    md = f"## {title or name}\n\n" + markdown_table(rows, columns)
    if meta:
        md += "\n" + "\n".join(f"- {k}: {v}" for k, v in meta.items()) + "\n"
    atomic_write_text(md_path, md)
    return json_path, md_path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    Returns the path. Raises OSError when the folder is not writable.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def append_markdown(md_path: str | os.PathLike, text: str, *, replace: bool = False) -> Path:
    """Append ``text`` to a report's markdown file (or replace its content), atomically."""
    md_path = Path(md_path)
    old = "" if replace or not md_path.exists() else md_path.read_text()
    sep = "\n" if old and not old.endswith("\n\n") else ""
    return atomic_write_text(md_path, old + sep + text)


def read_report(path: str | os.PathLike) -> dict[str, Any] | None:
    """The payload of a JSON file written by :func:`write_report`, or None when the file is
    missing, unreadable, not JSON or lacks a ``rows`` list (plots and summaries skip it).
    """
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("rows"), list):
        return None
    return payload
