"""Shared test fixtures.

- ``shared_data``: the path of ../shared/data (real clips), skipping with a reason when absent.
- DeepSpeed runs on its CPU accelerator here (DS_ACCELERATOR=cpu unless a GPU is present).
- Disk: a passed test's ``tmp_path`` is deleted at its teardown (pytest.ini), and the folders a
  module's fixtures made with ``tmp_path_factory`` when the module ends, unless one of its tests
  failed (then both stay for a look). The whole suite writes ~10 GB; at any time it now holds
  about the largest single test's (< 1 GB).
"""
from __future__ import annotations

import os
import shutil
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


@pytest.fixture(scope="module", autouse=True)
def _free_module_tmp(request, tmp_path_factory):
    """Delete, when a test module ends, the folders created under pytest's base temp folder while it
    ran (its module fixtures' ``tmp_path_factory.mktemp`` folders; passed tests' ``tmp_path`` are
    gone already), unless one of its tests failed."""
    base = tmp_path_factory.getbasetemp()
    before, failed_before = set(base.iterdir()), request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        return
    for path in set(base.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


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


@pytest.fixture()
def moto_s3(tmp_path, monkeypatch):
    """moto's S3-compatible server on 127.0.0.1 (a free port), the ``AWS_*`` variables set for it.

    Yields ``upload(folder, prefix) -> "s3://data/<prefix>"`` (every file of ``folder`` put under
    bucket ``data``); the server's request log is ``tmp_path / "moto.log"``. The server is stopped
    by its PID at the end."""
    import socket
    import subprocess
    import sys
    import time

    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "moto.log", "w") as f:
        srv = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=f, stderr=subprocess.STDOUT)
    for k, v in dict(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                     AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ALLOW_HTTP="true").items():
        monkeypatch.setenv(k, v)
    try:
        c = boto3.client("s3")
        for _ in range(200):
            try:
                c.list_buckets()
                break
            except Exception:
                time.sleep(0.05)
        c.create_bucket(Bucket="data")

        def upload(folder: Path, prefix: str) -> str:
            for p in Path(folder).iterdir():
                c.upload_file(str(p), "data", f"{prefix}/{p.name}")
            return f"s3://data/{prefix}"

        yield upload
    finally:
        srv.terminate()
        srv.wait(10)
