"""Helpers of the cluster tests (tests/cluster): the harness module, skip-or-fail, running a
command with the harness environment, DeepSpeed's /dev/shm buffers."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("TSM_DS_SHARED_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO / "launch" / "cluster"))   # harness.py and harness_conf.py: a project script
import harness  # noqa: E402

__all__ = ["REPO", "SHARED_DATA", "harness", "in_ci", "unavailable", "free_port", "remove_shm_buffers", "run"]


def in_ci() -> bool:
    """CI=true (or 1): the cluster tests must run, not skip."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def unavailable(reason: str):
    """Fail under CI, skip elsewhere, with ``reason``."""
    if in_ci():
        pytest.fail(f"cluster harness unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(f"cluster harness unavailable: {reason}")


def free_port() -> int:
    """A free TCP port on 127.0.0.2 (node-a, the rendezvous host)."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        return s.getsockname()[1]


def remove_shm_buffers(port: int) -> None:
    """Remove DeepSpeed's /dev/shm all-reduce buffers of ``port`` (a killed rank leaves its own)."""
    for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
        f.unlink(missing_ok=True)


def run(cmd, cluster, timeout=300, env=None, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` with the harness environment (plus ``env``), output captured as text."""
    return subprocess.run(cmd, env={**cluster.client_env(), **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw)
