"""Where a run came from (:func:`provenance`: git commit, Python and package versions) and the
writer of its resolved configuration record (:func:`save_resolved`: ``<run>/config.json``)."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["provenance", "save_resolved"]


def provenance() -> dict:
    """Where a run came from: the git commit of the source checkout (None for an installed package),
    whether it had uncommitted changes, the Python and package versions."""
    import platform
    import subprocess
    from importlib import metadata

    versions = {}
    for name in ("tsm_ds", "torch", "torchvision", "deepspeed", "av", "numpy", "timm"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    src = Path(__file__).resolve().parents[3]
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        if commit:
            dirty = bool(subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                                        capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"git_commit": commit, "git_dirty": dirty, "python": platform.python_version(), "packages": versions}


def save_resolved(path: str | Path, record: dict) -> None:
    """Write the run's full resolved configuration (flags + engine JSON) atomically as JSON."""
    from tsm_ds.utils.io import atomic_write_text

    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
