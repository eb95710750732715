"""launch/common.sh, the shared preamble of the launch scripts: env files DeepSpeed 0.19.8 can
parse, launcher options apart from train.py's flags, ranks and threads per node, SLURM ports."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMON = REPO / "launch" / "common.sh"


def _bash(script: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    for k in ("NPROC", "SLURM_JOB_ID", "SLURM_GPUS_ON_NODE", "SLURM_CPUS_ON_NODE", "OMP_NUM_THREADS",
              "TSM_DS_ENV_FILE", "CUDA_VISIBLE_DEVICES"):
        full.pop(k, None)
    full.update(env or {})
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {COMMON}; {script}"], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def _deepspeed_parse(text: str) -> dict:
    """What DeepSpeed 0.19.8's runner does with each line of .deepspeed_env (runner.py, main)."""
    out = {}
    for var in text.splitlines(keepends=True):
        key, val = var.split("=", maxsplit=1)   # raises on a comment or an empty line
        out[key.strip()] = val.strip()
    return out


def test_example_env_file_is_what_deepspeed_parses():
    text = (REPO / "launch" / "deepspeed_env.example").read_text()
    parsed = _deepspeed_parse(text)
    assert parsed["DS_ACCELERATOR"] == "cpu" and parsed["GLOO_SOCKET_IFNAME"] == "eth0"
    assert all(not k.startswith("#") for k in parsed)


def test_env_file_written_for_the_ranks_skips_comments_and_forwards_the_venv(tmp_path):
    user = tmp_path / "user_env"
    user.write_text("# interfaces = eth0 on this cluster\n\n  GLOO_SOCKET_IFNAME=lo\nTSM_DS_DATA=/data/k400\n")
    out = tmp_path / "ranks_env"
    p = _bash(f"export PATH=/opt/venv/bin:$PATH TORCH_EXTENSIONS_DIR=/opt/cache DS_ACCELERATOR=cpu "
              f"TSM_DS_HOSTS=a,b; tsm_write_env_file {out}",
              env={"TSM_DS_ENV_FILE": str(user), "HOME": str(tmp_path)}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    parsed = _deepspeed_parse(out.read_text())
    assert parsed["GLOO_SOCKET_IFNAME"] == "lo" and parsed["TSM_DS_DATA"] == "/data/k400"
    assert parsed["PATH"].startswith("/opt/venv/bin:") and parsed["TORCH_EXTENSIONS_DIR"] == "/opt/cache"
    assert parsed["DS_ACCELERATOR"] == "cpu" and parsed["TSM_DS_HOSTS"] == "a,b"
    assert list(parsed).count("GLOO_SOCKET_IFNAME") == 1


def test_bad_env_line_stops_naming_file_and_line(tmp_path):
    bad = tmp_path / "env"
    bad.write_text("A=1\nexport B=2\n")
    p = _bash(f"tsm_write_env_file {tmp_path / 'out'}", env={"TSM_DS_ENV_FILE": str(bad), "HOME": str(tmp_path)},
              cwd=tmp_path)
    assert p.returncode == 2
    assert f"{bad}:2: not a NAME=VALUE line: 'export B=2'" in p.stderr


def test_launcher_options_apart_from_training_flags():
    p = _bash('tsm_parse_args --hostfile h --ssh_port 2222 --include "a:0" --master_port 29600 -- --data d --lr 0.1; '
              'echo "$HOSTFILE|$SSH_PORT|$MASTER_PORT|${LAUNCH_OPTS[*]}|${TRAIN_ARGS[*]}"')
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "h|2222|29600|--include a:0|--data d --lr 0.1"
    p = _bash('tsm_parse_args --data d --hostfile x; echo "${#LAUNCH_OPTS[@]}|${TRAIN_ARGS[*]}|${HOSTFILE:-none}"')
    assert p.stdout.strip() == "0|--data d --hostfile x|none"   # the first training flag ends the launcher's


@pytest.mark.parametrize("env,expected", [
    ({"NPROC": "3"}, "3"),
    ({"DS_ACCELERATOR": "cpu"}, "1"),
    ({"DS_ACCELERATOR": "cuda", "SLURM_GPUS_ON_NODE": "4"}, "4"),
    ({"DS_ACCELERATOR": "cuda", "CUDA_VISIBLE_DEVICES": "0,1,2"}, "3"),
])
def test_ranks_per_node(env, expected):
    p = _bash("tsm_ranks_per_node", env=env)
    assert p.stdout.strip() == expected, p.stderr


def test_threads_per_rank_and_slurm_port():
    p = _bash("tsm_set_threads 4; echo $OMP_NUM_THREADS", env={"SLURM_CPUS_ON_NODE": "64"})
    assert p.stdout.strip() == "16" and "4 rank(s)" in p.stderr
    p = _bash("tsm_set_threads 4; echo $OMP_NUM_THREADS", env={"SLURM_CPUS_ON_NODE": "2"})
    assert p.stdout.strip() == "1"
    p = _bash("tsm_free_port", env={"SLURM_JOB_ID": "123457"})
    assert p.stdout.strip() == str(20000 + 123457 % 20000)   # the same on every node of the job


def test_hostfile_hosts_and_a_missing_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# the cluster\nnode-a slots=2\n\nnode-b slots=2  # second\n")
    p = _bash(f"tsm_hostfile_hosts {hf}")
    assert p.stdout.split() == ["node-a", "node-b"]
    p = _bash(f"tsm_hostfile_hosts {tmp_path / 'nope'}")
    assert p.returncode == 2 and "hostfile" in p.stderr and "not found" in p.stderr


def test_ssh_check_shows_ssh_own_error(tmp_path):
    """An ssh that fails like an unknown host key does: the script shows ssh's words and the fix."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text("#!/bin/sh\necho 'Host key verification failed.' >&2\nexit 255\n")
    (fake / "ssh").chmod(0o755)
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=1\nnode-b slots=1\n")
    p = _bash(f"tsm_check_ssh {hf}", env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert p.returncode == 2
    assert "ssh node-a failed: Host key verification failed." in p.stderr
    assert "ssh-keyscan node-a >> ~/.ssh/known_hosts" in p.stderr and "ssh node-b failed" in p.stderr
