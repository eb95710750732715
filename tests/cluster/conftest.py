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
    _seed_ops_cache(c)
    yield c
    c.down(check=True)




def _seed_ops_cache(c) -> None:
    """Copy the CPU comm op DeepSpeed built on this machine (``launch/run_tests.sh`` builds it before
    the tests) into each node's private /tmp, where the node's ranks look for it
    (:func:`tsm_ds.utils.node.ops_cache_dir`). A real node builds it once, at its first launch; here
    that build took 70-90 s of the first hostfile launch (both nodes compiling on 2 cores), and the
    build is not what these tests are about. Nothing is copied when the op is not built or its cache
    does not lie under /tmp (the nodes then see it at its place)."""
    import os

    from tsm_ds.utils.node import ops_cache_dir

    src = Path(ops_cache_dir(os.environ))
    if not (src / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file() or not src.is_relative_to("/tmp"):
        return
    for node in harness.NODES:
        shutil.copytree(src / "deepspeed_shm_comm", c.root / "nodes" / node / "tmp" / src.relative_to("/tmp")
                        / "deepspeed_shm_comm", dirs_exist_ok=True, ignore=shutil.ignore_patterns("lock"))


@pytest.fixture
def keep_logs(cluster, tmp_path):
    """After the test, copy the shared dir's logs (no checkpoints) to ``tmp_path/shared``: the
    harness removes its directory at the end of the session."""
    yield tmp_path
    shutil.copytree(cluster.shared, tmp_path / "shared", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.pt", "checkpoints", "tensorboard"))
