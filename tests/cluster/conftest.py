"""Fixtures of the cluster tests: a two-node loopback cluster (sshd + pdsh, SLURM + munge) from
``launch/cluster/harness.py``, started once per session.

Every test here carries the ``cluster`` marker. When the harness cannot start (not root, packages
missing: ``bash launch/cluster/install.sh``), the tests skip with the reason, except under
``CI=true``, where they fail: CI installs the packages and must run them.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from clusterlib import SHARED_DATA, harness, unavailable


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster():
    """The running harness (``harness.Cluster``: ``.env``, ``.shared``, ``.client_env()``); its
    teardown stops every daemon by PID and fails if a process, a port or a file is left."""
    reason = harness.why_not()
    if reason:
        unavailable(reason)
    root = tempfile.mkdtemp(prefix="tsm_ds_cluster_")
    c = harness.Cluster(root, keep=[SHARED_DATA] if SHARED_DATA.exists() else [])
    t0 = time.monotonic()
    try:
        c.up()
    except harness.HarnessError as e:
        unavailable(str(e))
    print(f"\ncluster harness up in {time.monotonic() - t0:.1f} s under {root}")
    yield c
    c.down(check=True)




@pytest.fixture
def keep_logs(cluster, tmp_path):
    """After the test, copy the shared dir's logs (no checkpoints) to ``tmp_path/shared``: the
    harness removes its directory at the end of the session."""
    yield tmp_path
    shutil.copytree(cluster.shared, tmp_path / "shared", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.pt", "checkpoints", "tensorboard"))
