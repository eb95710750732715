"""The loopback cluster itself (launch/cluster/harness.py): pdsh over the ssh wrapper reaches each
node's own sshd, SLURM runs a step on both nodes with a private /tmp each, ssh's own errors for a
down host and an unknown host key, and teardown kills what jobs and sessions left running."""
from __future__ import annotations

import subprocess
import tempfile
import time

from clusterlib import harness, run, unavailable


def test_pdsh_reaches_each_node_through_the_ssh_wrapper(cluster):
    # sshd's SetEnv names the node: each host answered from its own sshd (127.0.0.2 / .3)
    p = run(["pdsh", "-w", "node-a,node-b", "echo $TSM_DS_CLUSTER_NODE"], cluster, timeout=60)
    assert p.returncode == 0, p.stdout
    assert sorted(p.stdout.split("\n")[:-1]) == ["node-a: node-a", "node-b: node-b"], p.stdout


def test_srun_on_two_nodes_each_with_a_private_tmp(cluster):
    script = ('echo "$SLURMD_NODENAME $SLURM_NODEID" > /tmp/mark_$SLURMD_NODENAME; '
              'echo "$SLURMD_NODENAME sees $(ls /tmp | grep ^mark_ | tr "\\n" " ")"')
    p = run(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", script], cluster, timeout=60)
    assert p.returncode == 0, p.stdout
    # each node sees only its own file; both files exist, one per node's tmp dir
    assert sorted(line.rstrip() for line in p.stdout.splitlines()) == ["node-a sees mark_node-a",
                                                                        "node-b sees mark_node-b"], p.stdout
    for n, rank in (("node-a", 0), ("node-b", 1)):
        f = cluster.root / "nodes" / n / "tmp" / f"mark_{n}"
        assert f.read_text().split() == [n, str(rank)]


def test_ssh_errors_of_a_down_host_and_an_unknown_host_key(cluster):
    down = run(["ssh", "node-down", "true"], cluster, timeout=30)
    assert down.returncode == 255 and "Connection refused" in down.stdout, down.stdout
    unknown = run(["ssh", "node-unknown", "true"], cluster, timeout=30)
    assert unknown.returncode == 255 and "Host key verification failed." in unknown.stdout, unknown.stdout


def test_teardown_stops_jobs_and_sessions_and_leaves_nothing():
    """A second cluster with a running batch job and an open ssh session: down() kills them by
    PID and leaves no process in its namespaces, no listening port, no directory."""
    reason = harness.why_not()
    if reason:
        unavailable(reason)
    root = tempfile.mkdtemp(prefix="tsm_ds_cluster_td_")
    c = harness.Cluster(root).up()
    try:
        env = c.client_env()
        job = subprocess.run(["sbatch", "--parsable", "-N1", "-w", "node-b", "--output", str(c.shared / "job.out"),
                              "--wrap", "sleep 600"], env=env, capture_output=True, text=True, timeout=30)
        assert job.returncode == 0, job.stderr
        sess = subprocess.Popen(["ssh", "node-a", "sleep 600"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:   # the job's sleep and the session's sleep both run
            cmds = list(c.processes().values())
            if cmds.count(["sleep", "600"]) >= 2:
                break
            time.sleep(0.2)
        assert cmds.count(["sleep", "600"]) >= 2, cmds
    finally:
        c.down(check=True)
    sess.wait(timeout=10)
    assert not c.processes()
    assert not set(c.ports) & harness.listening_ports()
    assert not c.root.exists()
