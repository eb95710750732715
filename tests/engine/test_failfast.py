"""Fail fast on clusters (issue 14): a rank that never starts, a rank SIGKILLed mid-run, a stop
signal (SLURM's time-limit warning) that saves and exits 75, then a resume; per-rank log files.

2 local ranks on CPU, resnet18 at 32 px, 2 segments, the real clips (10 training clips).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--deepspeed_config", "cpu_fp32", "--arch", "resnet18", "--num-segments", "2", "--img-size", "32",
         "--batch-size", "2", "--micro-batch-size", "1", "--lr", "0.01", "--num-workers", "0", "--no-progress"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remove_shm(port: int) -> None:
    for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
        f.unlink(missing_ok=True)


def _rank_env(rank: int, port: int, **extra) -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
               WORLD_SIZE="2", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.update(extra)
    return env


def test_stop_signal_flag_set_by_a_real_signal():
    from tsm_ds.engine.guards.preempt import StopSignal

    stop = StopSignal(("SIGUSR1",)).install()
    try:
        assert stop.flag == 0.0 and stop.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert stop.flag == 1.0 and stop.received == "SIGUSR1"
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_missing_rank_hosts_from_the_hostfile_or_the_joined_ranks():
    from tsm_ds.engine.comm.rendezvous import missing_rank_hosts

    joined = {0: {"host": "a1"}, 1: {"host": "a1"}, 2: {"host": "b1"}}
    # 2 ranks per node: rank 3 shares node 1 with rank 2; ranks 4, 5 are node 2
    got = missing_rank_hosts([3, 4, 5], joined, local_size=2, hosts=None)
    assert got == {3: "b1 (where rank 2 runs)", 4: "node 2 of the hostfile", 5: "node 2 of the hostfile"}
    assert missing_rank_hosts([5], joined, local_size=2, hosts=["a1", "b1", "c1"]) == {5: "c1"}


def test_dist_timeout_from_env_and_bad_values():
    from tsm_ds.cli.train import parse_config
    from tsm_ds.engine.comm.rendezvous import DEFAULT_TIMEOUT_S, dist_timeout_s

    assert dist_timeout_s() == DEFAULT_TIMEOUT_S == 300 and dist_timeout_s(7) == 7.0
    # the variable is read by the command line into distributed.dist_timeout; the flag wins
    assert parse_config([], environ={})[0].distributed.dist_timeout == 300
    assert parse_config([], environ={"TSM_DS_DIST_TIMEOUT": "12.5"})[0].distributed.dist_timeout == 12.5
    assert parse_config(["--dist-timeout", "7"],
                        environ={"TSM_DS_DIST_TIMEOUT": "12.5"})[0].distributed.dist_timeout == 7
    with pytest.raises(ValueError, match="TSM_DS_DIST_TIMEOUT='soon'"):
        parse_config([], environ={"TSM_DS_DIST_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="--dist-timeout must be > 0"):
        dist_timeout_s(0)


@pytest.mark.slow
def test_a_rank_that_never_starts_stops_rank0_naming_it(shared_data, tmp_path):
    """World size 2, only rank 0 started: it stops after --dist-timeout with exit 5 naming rank 1
    and its host; then rank 1 alone says rank 0's rendezvous is unreachable."""
    port = _port()
    cmd = [sys.executable, "-m", "tsm_ds.train", *SMALL, "--data", str(shared_data / "videos"),
           "--output-dir", str(tmp_path), "--run-name", "r", "--dist-timeout", "4"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=_rank_env(0, port, TSM_DS_HOSTS="node-a,node-b"), capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    waited = time.monotonic() - t0
    out = p.stdout + p.stderr
    assert p.returncode == 5, out[-3000:]
    assert "1 of 2 ranks did not join within 4 s" in out and "rank 1 on node-b" in out, out[-3000:]
    assert "Joined: rank 0 on " + socket.gethostname() in out
    assert waited < 120, waited   # not DeepSpeed's 10 minutes (start-up included)
    log0 = (tmp_path / "r" / "logs" / "rank0.log").read_text()
    assert log0.startswith("[rank0] start: host") and "did not join" in log0   # the rank's own log has the error

    port = _port()
    p = subprocess.run(cmd, env=_rank_env(1, port), capture_output=True, text=True, timeout=300, cwd=REPO)
    out = p.stdout + p.stderr
    assert p.returncode == 5, out[-3000:]
    assert f"rank 1 on {socket.gethostname()} could not reach rank 0's rendezvous at 127.0.0.1:{port} within 4 s" in out
    _remove_shm(port)


def _launcher(port: int, args: list[str]) -> list[str]:
    deepspeed = Path(sys.executable).with_name("deepspeed")
    if not deepspeed.exists():
        pytest.skip(f"no deepspeed launcher next to {sys.executable}")
    return [sys.executable, str(deepspeed), "--num_gpus", "2", "--master_port", str(port), "--module",
            "tsm_ds.train", *args]


@pytest.mark.slow
def test_a_rank_sigkilled_mid_run_ends_the_job_nonzero(shared_data, tmp_path):
    port = _port()
    run = tmp_path / "k"
    cmd = _launcher(port, [*SMALL, "--data", str(shared_data / "videos"), "--output-dir", str(tmp_path),
                           "--run-name", "k", "--epochs", "50", "--save-every-steps", "1", "--dist-timeout", "30"])
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / "latest").is_file():   # training has started on both ranks
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        head = (run / "logs" / "rank1.log").read_text().splitlines()[0]
        pid1 = int(re.search(r"pid (\d+)", head).group(1))
        head0 = (run / "logs" / "rank0.log").read_text().splitlines()[0]
        pid0 = int(re.search(r"pid (\d+)", head0).group(1))
        t_kill = time.monotonic()
        os.kill(pid1, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
        ended = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _remove_shm(port)
    assert proc.returncode != 0, out[-3000:]
    assert ended < 60, ended
    with pytest.raises(ProcessLookupError):   # rank 0 did not outlive the job
        os.kill(pid0, 0)


@pytest.mark.slow
def test_stop_signal_on_one_rank_saves_on_all_exits_75_then_resumes(shared_data, tmp_path):
    """Rank 1 receives SIGUSR1 after optimizer step 2 (the flag is summed with step 3's statistics):
    both ranks save step 3 mid-epoch and exit 75; result.json says preempted; a second launch with
    --resume auto continues from step 3."""
    port = _port()
    run = tmp_path / "p"
    common = [*SMALL, "--data", str(shared_data / "videos"), "--output-dir", str(tmp_path), "--run-name", "p",
              "--epochs", "2"]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    try:
        p = subprocess.run(_launcher(port, common + ["--inject-signal-at-step", "2", "--inject-signal-rank", "1"]),
                           env=env, capture_output=True, text=True, timeout=400, cwd=REPO)
    finally:
        _remove_shm(port)
    out = p.stdout + p.stderr
    assert p.returncode == 75, out[-3000:]
    assert "SIGUSR1: saved checkpoint step00000003 (optimizer step 3) and stopped" not in out  # rank 0 got no signal:
    assert "a stop signal on another rank: saved checkpoint step00000003 (optimizer step 3)" in out, out[-3000:]
    res = json.loads((run / "result.json").read_text())
    assert res["status"] == "preempted" and res["step"] == 3 and res["checkpoint"].endswith("step00000003")
    ck = run / "checkpoints"
    assert (ck / "latest").read_text() == "step00000003" and (ck / "step00000003" / "complete.json").is_file()
    logs = {r: (run / "logs" / f"rank{r}.log").read_text() for r in (0, 1)}
    assert "start: host" in logs[0] and "start: host" in logs[1]

    port = _port()
    try:
        p = subprocess.run(_launcher(port, common + ["--resume", "auto", "--max-steps", "6"]), env=env,
                           capture_output=True, text=True, timeout=400, cwd=REPO)
    finally:
        _remove_shm(port)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert re.search(r"resumed from \S+step00000003: epoch 0, 3 micro-batches into it, optimizer step 3",
                     out), out[-3000:]
    assert json.loads((run / "result.json").read_text())["status"] == "completed"
