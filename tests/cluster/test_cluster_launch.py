"""The project's launch scripts on the loopback cluster (launch/cluster/harness.py), end to end on
the real clips (resnet18, 2 segments, 32 px, 1 rank per node, global batch 2: 10 train clips are 5
optimizer steps per epoch):

- ``launch/train_multi_node.sh`` with a hostfile of node-a and node-b (pdsh over ssh) trains an
  epoch, then a second launch resumes it (``--resume auto``) into the second epoch;
- a host that is down, listed second: the ssh check stops at once naming it with ssh's own error
  and the fix (exit 2), and without the check (``NO_SSH_CHECK=1``) rank 0 stops after
  ``--dist-timeout`` naming it (its exit 5) while the script exits 255, pdsh's status (the
  README's exit codes), and says so in its last line;
- ``sbatch launch/slurm_train.sbatch`` on 2 nodes x 1 rank, each node with a private /tmp, trains;
  the time-limit signal (USR1, sent with ``scancel --signal``) makes the ranks save and exit 75,
  the script requeues the job and the second start resumes from that checkpoint and finishes
  (step 6: into the second epoch).
"""
from __future__ import annotations

import json
import re
import time

import pytest
from clusterlib import REPO, remove_shm_buffers, run

pytestmark = pytest.mark.slow

#: the small model and schedule of every run here, as fields of the configuration tree
TRAIN = {"model.arch": "resnet18", "model.num_segments": 2, "data.img_size": 32, "schedule.batch_size": 2,
         "schedule.micro_batch_size": 1, "schedule.lr": 0.01, "data.num_workers": 0, "logging.progress": False,
         "schedule.seed": 3}


def train_argv(**fields) -> list[str]:
    """The training command line of :data:`TRAIN` plus ``fields`` (``section__field=value``), written
    by the product's one command-line builder (:func:`tsm_ds.config.to_argv`)."""
    from tsm_ds.config import Config, to_argv
    from tsm_ds.config.commands import TRAIN as TRAIN_COMMAND

    return to_argv(TRAIN_COMMAND, Config, {**TRAIN, **{k.replace("__", "."): v for k, v in fields.items()}})
STEPS_PER_EPOCH = 5   # 10 train clips of the source_group split / global batch 2 (asserted from the log)


def _result(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if "RESULT " in ln]
    assert len(lines) == 1, out[-4000:]
    return json.loads(lines[0].split("RESULT ", 1)[1])


def _port(out: str) -> int | None:
    m = re.search(r"MASTER_PORT=(\d+)", out)
    return int(m.group(1)) if m else None


def _multi_node(cluster, hosts, args, env=None, timeout=400):
    hostfile = cluster.shared / ("hosts_" + "_".join(hosts))
    hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts))
    t0 = time.monotonic()
    p = run(["bash", "launch/train_multi_node.sh", "--hostfile", str(hostfile), "--ssh_port", str(cluster.ssh_port),
             "--", *args], cluster, timeout=timeout, cwd=REPO, env={"OMP_NUM_THREADS": "1", **(env or {})})
    secs = time.monotonic() - t0
    port = _port(p.stdout)
    if port:
        remove_shm_buffers(port)
    n = len(list(cluster.shared.glob("launch_*.log")))
    (cluster.shared / f"launch_{n}_{'_'.join(hosts)}.log").write_text(f"{secs:.1f} s\n{p.stdout}")   # kept by keep_logs
    return p, secs


def test_hostfile_two_hosts_trains_an_epoch_and_resumes(cluster, shared_data, keep_logs):
    common = dict(data__data=str(shared_data / "videos"), output__output_dir=str(cluster.shared / "runs"),
                  output__run_name="hostfile", distributed__dist_timeout=120)
    p1, _ = _multi_node(cluster, ["node-a", "node-b"], train_argv(**common, schedule__epochs=1))
    assert p1.returncode == 0, p1.stdout[-6000:]
    assert f"{STEPS_PER_EPOCH} optimizer steps per epoch" in p1.stdout
    # pdsh started one launcher per host over ssh: rank 0 on node-a, rank 1 on node-b
    assert "global_rank_mapping=defaultdict(<class 'list'>, {'node-a': [0], 'node-b': [1]})" in p1.stdout
    assert re.search(r"^node-a: .*node_rank=0", p1.stdout, re.M) \
        and re.search(r"^node-b: .*node_rank=1", p1.stdout, re.M)
    assert re.search(r"^node-b: .*Process \d+ exits successfully", p1.stdout, re.M), p1.stdout[-3000:]
    assert _result(p1.stdout)["steps"] == STEPS_PER_EPOCH
    run_dir = cluster.shared / "runs" / "hostfile"
    tag = (run_dir / "checkpoints" / "latest").read_text()
    assert tag == f"step{STEPS_PER_EPOCH:08d}"
    assert {f.name for f in (run_dir / "checkpoints" / tag).glob("rank*.pt")} == {"rank00000.pt", "rank00001.pt"}
    assert {f.name for f in (run_dir / "logs").glob("rank*.log")} == {"rank0.log", "rank1.log"}

    # the second launch continues into epoch 2 (one more step is enough to show it)
    # (the preflight, tsm-ds doctor --hostfile, ran before the first launch; SKIP_DOCTOR=1 skips it here)
    p2, _ = _multi_node(cluster, ["node-a", "node-b"], train_argv(**common, schedule__epochs=2,
                                                                  schedule__max_steps=STEPS_PER_EPOCH + 1),
                        env={"SKIP_DOCTOR": "1"})
    assert p2.returncode == 0, p2.stdout[-6000:]
    assert re.search(rf"resumed from .*{tag}: epoch \d+, \d+ micro-batches into it, optimizer step {STEPS_PER_EPOCH}",
                     p2.stdout), p2.stdout[-4000:]
    assert _result(p2.stdout)["steps"] == STEPS_PER_EPOCH + 1


def test_down_host_listed_second_fails_naming_it(cluster, shared_data, keep_logs):
    common = dict(data__data=str(shared_data / "videos"), output__output_dir=str(cluster.shared / "runs"),
                  output__run_name="down", schedule__epochs=1)
    args = train_argv(**common)
    # the launch script's ssh check: stops before any rank starts, with ssh's own error
    p, secs = _multi_node(cluster, ["node-a", "node-down"], args, timeout=120)
    assert p.returncode == 2, p.stdout[-3000:]
    assert re.search(r"ssh node-down failed: .*Connection refused", p.stdout), p.stdout[-3000:]
    assert f"fix: nothing listens for ssh on node-down port {cluster.ssh_port}" in p.stdout
    assert "ssh node-a failed" not in p.stdout
    assert "global_rank_mapping" not in p.stdout   # no rank was started
    print(f"down host, ssh check: failed after {secs:.1f} s")
    # without the check: pdsh cannot reach node-down, rank 0 on node-a stops after --dist-timeout
    # (not DeepSpeed's 10-minute store timeout) and names the missing rank's host
    p, secs = _multi_node(cluster, ["node-a", "node-down"], train_argv(**common, distributed__dist_timeout=10),
                          env={"NO_SSH_CHECK": "1", "SKIP_DOCTOR": "1"}, timeout=300)
    # what the user sees (README, exit codes): pdsh's status 255, the rank's own 5 in pdsh's lines
    assert p.returncode == 255, p.stdout[-3000:]
    assert "Connection refused" in p.stdout, p.stdout[-3000:]
    assert re.search(r"did not join within 10 s .*rank 1 on node-down", p.stdout), p.stdout[-3000:]
    assert re.search(r"^pdsh@\S+: node-down: ssh exited with exit code 255$", p.stdout, re.M), p.stdout[-3000:]
    assert re.search(r"^pdsh@\S+: node-a: ssh exited with exit code 5$", p.stdout, re.M), p.stdout[-3000:]
    assert p.stdout.rstrip().splitlines()[-1].startswith("launch: exit status 255: pdsh's status")
    print(f"down host, no ssh check, --dist-timeout 10: failed after {secs:.1f} s")


def _job(cluster, job_id: str) -> dict:
    out = run(["scontrol", "show", "job", "-o", job_id], cluster, timeout=30).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def test_sbatch_two_nodes_private_tmp_trains_and_requeues_after_the_time_limit_signal(cluster, shared_data, keep_logs):
    run_dir = cluster.shared / "runs" / "slurm"
    out_file = cluster.shared / "slurm-%j.out"
    sub = run(["sbatch", "--parsable", "--nodes", "2", "--output", str(out_file), "launch/slurm_train.sbatch",
               *train_argv(data__data=str(shared_data / "videos"), output__output_dir=str(cluster.shared / "runs"),
                           output__run_name="slurm", schedule__epochs=2, schedule__max_steps=STEPS_PER_EPOCH + 1,
                           output__save_every_steps=1, distributed__dist_timeout=120)], cluster, timeout=60, cwd=REPO)
    assert sub.returncode == 0, sub.stdout
    job = sub.stdout.strip().split(";")[0]
    log = cluster.shared / f"slurm-{job}.out"
    latest = run_dir / "checkpoints" / "latest"
    signalled_at = None
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        info = _job(cluster, job)
        state = info.get("JobState")
        if signalled_at is None and state == "RUNNING" and latest.is_file():
            # the first optimizer step is saved: the "time limit" warning SLURM sends with --signal=USR1@120
            signalled_at = latest.read_text()
            s = run(["scancel", "--signal=USR1", job], cluster, timeout=30)
            assert s.returncode == 0, s.stdout
        elif state == "PENDING" and info.get("Reason") == "BeginTime":
            # SLURM holds a requeued batch job for 120 s; release it now
            run(["scontrol", "update", f"JobId={job}", "StartTime=now"], cluster, timeout=30)
        elif state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        time.sleep(0.3)
    else:
        run(["scancel", job], cluster, timeout=30)   # not finished: stop it before the next test
    out = log.read_text() if log.is_file() else ""
    port = _port(out)
    if port:
        remove_shm_buffers(port)
    assert state == "COMPLETED" and info.get("ExitCode") == "0:0", (info, out[-6000:])
    assert signalled_at is not None, out[-4000:]
    assert info.get("Restarts") == "1", info
    # the first start on both nodes, stopped by the signal with a checkpoint; the second resumed it
    for restart in (0, 1):
        assert re.search(rf"job {job} \(restart {restart}\): nodes node-a,node-b", out), out[-4000:]
    assert re.search(r"SIGUSR1: saved checkpoint step\d+ \(optimizer step \d+\) and stopped", out), out[-4000:]
    assert f"requeueing job {job}" in out
    m = re.search(r"resumed from .*step(\d+): epoch \d+, \d+ micro-batches into it, optimizer step (\d+)", out)
    assert m, out[-4000:]
    stopped = int(m.group(2))
    assert int(signalled_at[4:]) <= stopped < STEPS_PER_EPOCH + 1
    assert _result(out)["steps"] == STEPS_PER_EPOCH + 1
    assert {f.name for f in (run_dir / "logs").glob("rank*.log")} == {"rank0.log", "rank1.log"}
    # every node built its own hostfile in its own /tmp (the old script's mktemp on the batch
    # host left node-b without one): none is left behind in either node's /tmp
    for n in ("node-a", "node-b"):
        assert not list((cluster.root / "nodes" / n / "tmp").glob("tsm_ds_hostfile.*"))
