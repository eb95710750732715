"""Atomic file writes, markdown tables and JSON/markdown reports: one copy of each.

Every file the project writes for a user (checkpoints, exports, reports, list files, videos) goes
through :func:`atomic_path`: the writer fills a temporary file in the target's folder, which is
flushed and renamed over the target with ``os.replace``. A reader, a crash or a full disk never
leaves a half-written file under the final name, and the previous file survives a failed write.

Reports: each benchmark or tool builds ``rows`` (a list of flat dicts, one per measured
configuration) plus free-form ``meta`` and calls :func:`write_report`, which writes
``NAME.json`` (meta, machine, rows) and ``NAME.md`` (a markdown table); :func:`read_report` is the
reading side.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = ".tmp", directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path`` (``os.replace``).

    The writer inside the ``with`` block writes to the yielded path (a file, or a folder with
    ``directory=True``). When the block raises, the temporary file or folder is removed and
    ``path`` is left as it was; the exception propagates. The parent folder is created.

    Args:
        path: the final file (or folder) name.
        suffix: the temporary name's suffix (writers that choose a format by extension, such as
            PyAV or matplotlib, need the real one: pass e.g. ``".mp4"``).
        directory: yield a fresh empty folder instead of a file name; an existing ``path`` folder
            is replaced only when it is empty (``os.replace`` semantics).

    Raises:
        OSError: the folder is not writable, the disk is full, or the rename fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix))
        os.chmod(tmp, 0o777 & ~_umask())
    else:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        os.fchmod(fd, 0o666 & ~_umask())   # mkstemp makes 0600; the final file gets the usual mode
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if not directory:
            with open(tmp, "rb+") as f:   # the data must be on disk before the rename makes it visible
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`). Returns the path.

    Raises:
        OSError: the folder is not writable or the disk is full (``path`` is then unchanged).
    """
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_path`). Returns the path.

    Raises:
        OSError: the folder is not writable or the disk is full (``path`` is then unchanged).
    """
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj, path)`` atomically (see :func:`atomic_path`). Returns the path.

    Raises:
        OSError: the folder is not writable or the disk is full (``path`` is then unchanged).
    """
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)


def machine_info() -> dict[str, Any]:
    """Facts about the machine a benchmark ran on: CPU count, torch version and thread count, GPU.

    torch is queried only when the caller already imported it (every measuring bench does); a
    bench that does not need it (``bench scale``) reports the installed version without paying
    the import (seconds on a busy machine).
    """
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
    """Render ``rows`` (flat dicts) as a GitHub markdown table; floats get 4 significant digits.

    ``columns`` defaults to the keys of the first row; a missing value renders empty.
    Returns ``"(no rows)\\n"`` for no rows.
    """
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
    """Write ``{out_dir}/{name}.json`` (name, meta, machine, rows) and ``{out_dir}/{name}.md``.

    Returns the two paths. The folder is created when missing; both files are written atomically.

    Raises:
        OSError: the folder is not writable.
    """
    out = Path(out_dir)
    payload = {"name": name, "meta": meta or {}, "machine": machine_info(), "rows": list(rows)}
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    atomic_write_text(json_path, json.dumps(payload, indent=2, default=str) + "\n")
    md = f"## {title or name}\n\n" + markdown_table(rows, columns)
    if meta:
        md += "\n" + "\n".join(f"- {k}: {v}" for k, v in meta.items()) + "\n"
    atomic_write_text(md_path, md)
    return json_path, md_path


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
