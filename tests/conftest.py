"""Shared test fixtures.

- ``shared_data``: the path of ../shared/data (real clips), skipping with a reason when absent.
- DeepSpeed runs on its CPU accelerator here (DS_ACCELERATOR=cpu unless a GPU is present).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TSM_DS_SHARED_DATA", REPO.parent / "shared" / "data"))

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests (launcher, several processes); CI runs them")
    config.addinivalue_line("markers", "cluster: needs launch/cluster/harness.py (root, sshd, pdsh, SLURM, munge; "
                            "launch/cluster/install.sh); skips without it, fails under CI=true")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip: a user's clone has no shared test material."""
    if not (SHARED_DATA / "manifest.csv").is_file():
        pytest.skip(f"real clips not found at {SHARED_DATA} (set TSM_DS_SHARED_DATA); "
                    "they ship with the project's CI, not with the repository")
    return SHARED_DATA


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a test module of small tensors: fastest, and immune to a loaded
    shared CPU. Restores the previous thread count afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
