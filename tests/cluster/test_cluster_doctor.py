"""``tsm-ds doctor --hostfile H`` (tsm_ds/doctor/cluster.py) on the loopback cluster: every
check passes and one all-reduce sums over 3 ranks on 2 hosts; an unknown host key, an unreachable
host and a run dir that is not shared (each node's private /tmp) are reported with ssh's own words
and a fix, and the command exits 1."""
from __future__ import annotations

import json
import sys

import pytest
from clusterlib import REPO, run

from tsm_ds.doctor.cluster import classify_ssh_error, read_hostfile


def _doctor(cluster, hostfile, out, *extra):
    return run([sys.executable, "-m", "tsm_ds.cli", "doctor", "--hostfile", str(hostfile), "--out", str(out),
                "--no-progress", *extra], cluster, timeout=300, cwd=REPO)


def _rows(out) -> dict:
    sec = json.loads((out / "doctor.json").read_text())["sections"]["cluster"]
    return sec, {(r["host"], r["check"]): r for r in sec["rows"]}


def test_doctor_every_check_passes_and_all_ranks_all_reduce(cluster):
    hostfile = cluster.shared / "hosts_doctor_ok"
    hostfile.write_text("# two hosts, three ranks\nnode-a slots=1\n\nnode-b slots=2\n")
    out = cluster.shared / "doctor_ok"
    p = _doctor(cluster, hostfile, out, "--run-dir", str(cluster.shared / "doctor_run"), "--master-port", "29531")
    assert p.returncode == 0, p.stdout
    sec, rows = _rows(out)
    assert sec["status"] == "ok" and sec["values"]["ranks"] == 3
    assert sec["values"]["allreduce_sum"] == 6   # ranks 0..2 each add rank + 1
    assert sec["values"]["master_addr"] == "127.0.0.2"   # the harness's MASTER_ADDR
    for host in ("node-a", "node-b"):
        for check in ("ssh", "host key", "python", "master address", "run dir", "run dir shared"):
            assert rows[(host, check)]["status"] == "ok", rows[(host, check)]
    assert rows[("node-a", "master port")]["status"] == "ok"
    assert ("node-b", "master port") not in rows   # only rank 0's host
    assert rows[("(all ranks)", "all-reduce")]["status"] == "ok"
    assert not list((cluster.shared / "doctor_run").glob(".tsm_ds_doctor_*"))   # its files removed


def test_doctor_reports_unknown_host_key_unreachable_host_and_unshared_run_dir(cluster):
    hostfile = cluster.shared / "hosts_doctor_bad"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\nnode-unknown slots=1\nnode-down slots=1\n")
    out = cluster.shared / "doctor_bad"
    # /tmp is private on every node: a run dir there is not shared
    p = _doctor(cluster, hostfile, out, "--run-dir", "/tmp/tsm_ds_doctor_private")
    assert p.returncode == 1, p.stdout
    sec, rows = _rows(out)
    assert sec["status"] == "failed"
    key = rows[("node-unknown", "host key")]
    assert key["status"] == "failed" and "Host key verification failed." in key["detail"]
    assert "ssh-keyscan" in key["fix"]
    down = rows[("node-down", "ssh")]
    assert down["status"] == "failed" and "Connection refused" in down["detail"]
    assert f"port {cluster.ssh_port}" in down["fix"]
    for host in ("node-a", "node-b"):
        assert rows[(host, "run dir")]["status"] == "ok"   # writable, but each host's own
        shared = rows[(host, "run dir shared")]
        assert shared["status"] == "failed" and "shared filesystem" in shared["fix"]
    assert rows[("(all ranks)", "all-reduce")]["status"] == "skipped"
    assert sec["values"]["failed_checks"] == 4
    # the console table: each failure with ssh's own words and the fix
    table = p.stdout.split("cluster checks that failed:", 1)[1]
    assert "node-unknown  host key" in table and "Host key verification failed." in table
    assert "node-down     ssh" in table and "Connection refused" in table
    assert table.count("fix:") == 4


def test_doctor_reports_a_master_addr_that_does_not_resolve_as_that_alone(cluster):
    """The newcomer's trial: MASTER_ADDR a name no host knows. The check says it does not resolve and
    what to do; the port is not checked (it said "another process holds port N" before)."""
    hostfile = cluster.shared / "hosts_doctor_addr"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    out = cluster.shared / "doctor_addr"
    p = _doctor(cluster, hostfile, out, "--run-dir", str(cluster.shared / "doctor_run_addr"),
                "--master-addr", "node-x.invalid", "--master-port", "29533")
    assert p.returncode == 1, p.stdout
    sec, rows = _rows(out)
    for host in ("node-a", "node-b"):
        row = rows[(host, "master address")]
        assert row["status"] == "failed" and row["detail"].startswith(f"node-x.invalid does not resolve on {host}")
        assert "--master_addr" in row["fix"] and "--master-addr" in row["fix"]
    assert rows[("node-a", "master port")]["status"] == "skipped"
    assert "another process holds" not in (out / "doctor.json").read_text()
    assert sec["values"]["failed_checks"] == 2
    assert (out / "doctor.md").read_text().splitlines()[2].endswith("; no model measured (cluster)")


def test_hostfile_errors_name_the_line(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("node-a slots=2\nnode-b  # one rank\n")
    assert read_hostfile(str(f)) == [("node-a", 2), ("node-b", 1)]
    f.write_text("node-a slots=2\nnode-b gpus=4\n")
    with pytest.raises(ValueError, match=r"hosts:2: not '<host> slots=<ranks>'"):
        read_hostfile(str(f))
    f.write_text("node-a\nnode-a\n")
    with pytest.raises(ValueError, match="listed twice"):
        read_hostfile(str(f))
    f.write_text("# nothing\n")
    with pytest.raises(ValueError, match="lists no host"):
        read_hostfile(str(f))


def test_ssh_errors_are_classified_with_their_fix():
    check, fix = classify_ssh_error("Permission denied (publickey).", "node-x", 2222)
    assert check == "ssh" and fix.startswith("passwordless login: ssh-copy-id -p 2222 node-x")
    check, fix = classify_ssh_error("ssh: Could not resolve hostname node-x: Name or service not known", "node-x", None)
    assert check == "ssh" and "not a known name" in fix
    check, fix = classify_ssh_error("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "node-x", None)
    assert check == "host key" and "ssh-keygen -R" in fix
