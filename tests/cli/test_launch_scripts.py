"""launch/common.sh and the launch scripts: env files DeepSpeed 0.19.8 can parse, launcher options
apart from train.py's flags (unknown ones refused before anything starts), ranks and threads per
node, SLURM ports, the default recipe, the exit status of a preemption, every script's --help.
The answers come from ``python -m tsm_ds.cli.launch_helper`` (tests/cli/test_launch_helper.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMON = REPO / "launch" / "common.sh"
#: the venv the scripts use here: the interpreter running the tests (its bin/python)
VENV = os.environ.get("TSM_DS_VENV") or (sys.prefix if (Path(sys.prefix) / "bin" / "python").exists()
                                         else str(REPO / ".venv"))
_CLEAN = ("NPROC", "SLURM_JOB_ID", "SLURM_GPUS_ON_NODE", "SLURM_CPUS_ON_NODE", "OMP_NUM_THREADS", "TSM_DS_ENV_FILE",
          "CUDA_VISIBLE_DEVICES", "HOSTFILE", "MASTER_ADDR", "MASTER_PORT", "SSH_PORT", "NODE_RANK", "CONFIG")


def _env(env: dict | None) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in _CLEAN}
    full["TSM_DS_VENV"] = VENV
    full.update(env or {})
    return full


def _bash(script: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {COMMON}; {script}"], env=_env(env), cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def _script(path: str, *args, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / path), *args], env=_env(env), cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=120)


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
    assert parsed["GLOO_SOCKET_IFNAME"] == "eth0"
    assert all(not k.startswith("#") for k in parsed)
    assert "DS_ACCELERATOR" not in parsed   # the example forces no device: each rank decides on its node (issue 37)


def test_setup_env_sends_no_accelerator_to_the_ranks(tmp_path):
    """A login node without GPUs must not write DS_ACCELERATOR=cpu into every rank's environment."""
    out = tmp_path / "ranks_env"
    p = _bash(f"unset DS_ACCELERATOR; tsm_setup_env; echo acc=$TSM_NODE_ACCELERATOR; tsm_write_env_file {out}",
              env={"HOME": str(tmp_path)}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "acc=cpu" in p.stdout   # this machine has no GPU: the script knows, for itself
    assert "DS_ACCELERATOR" not in _deepspeed_parse(out.read_text())


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
    p = _bash('tsm_parse_args multi --hostfile h --ssh_port 2222 --include "a:0" --master_port 29600 -- --data d '
              '--lr 0.1; echo "$HOSTFILE|$SSH_PORT|$MASTER_PORT|${LAUNCH_OPTS[*]}|${TRAIN_ARGS[*]}"')
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "h|2222|29600|--include a:0|--data d --lr 0.1"
    p = _bash('tsm_parse_args multi --data d --hostfile x; '
              'echo "${#LAUNCH_OPTS[@]}|${TRAIN_ARGS[*]}|${HOSTFILE:-none}"')
    assert p.stdout.strip() == "0|--data d --hostfile x|none"   # the first training flag ends the launcher's


@pytest.mark.parametrize("script,args,message", [
    # the newcomer's --master-addr: refused, with the spelling the script accepts and its options
    ("launch/train_multi_node.sh", ["--hostfile", "h", "--master-addr", "10.0.0.1", "--", "--data", "d"],
     "launch/train_multi_node.sh: unknown option --master-addr: the launcher option is spelled --master_addr; "
     "its options: --hostfile, --ssh_port, --master_addr, --master_port, --include, --exclude, --num_nodes, "
     "--launcher"),
    ("launch/train_single_node.sh", ["--master-port", "29600", "--data", "d"],
     "unknown option --master-port: the launcher option is spelled --master_port"),
    ("launch/slurm_train.sbatch", ["--hostfile", "h", "--", "--data", "d"],
     "--hostfile is an option of launch/train_multi_node.sh, not of this script"),
])
def test_scripts_refuse_unknown_options_before_anything_starts(script, args, message, tmp_path):
    p = _script(script, *args, env={"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node-a"})
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert "deepspeed" not in p.stderr.replace("python -m tsm_ds.train", "")   # nothing launched


def test_multi_node_without_a_hostfile_says_how_to_give_one():
    p = _script("launch/train_multi_node.sh", "--", "--data", "d")
    assert p.returncode == 2
    assert "no hostfile: give --hostfile FILE or set HOSTFILE" in p.stderr and "--help" in p.stderr


@pytest.mark.parametrize("script,first_line", [
    ("launch/train_single_node.sh", "One machine, NPROC ranks"),
    ("launch/train_multi_node.sh", "Several machines listed in a hostfile"),
    ("launch/slurm_train.sbatch", "SLURM: one task per node"),
    ("launch/slurm_prepare.sbatch", "SLURM array job of `tsm-ds prepare`"),
    ("launch/quickstart.sh", "The README's first command"),
    ("launch/run_tests.sh", "The test command"),
    ("launch/setup.sh", "Create ./.venv and install tsm_ds"),
    ("launch/gpu_check.sh", "The GPU proof"),
    ("launch/gpu_large_batch.sh", "The large-batch study's GPU version"),
    ("launch/cluster/install.sh", "Install the system packages of the cluster tests"),
])
def test_every_script_help_prints_its_usage_and_exits_0(script, first_line, tmp_path):
    """--help works from any folder, without a venv, a hostfile or SLURM, and starts nothing."""
    for flag in ("--help", "-h"):
        p = subprocess.run(["bash", str(REPO / script), flag], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env={**_env(None), "TSM_DS_VENV": str(tmp_path / "no_venv")})
        assert p.returncode == 0, (script, p.stderr)
        assert p.stdout.splitlines()[0].startswith(first_line), p.stdout
        assert "#" not in p.stdout.splitlines()[0] and "set -" not in p.stdout and "#SBATCH" not in p.stdout
    assert not list(tmp_path.iterdir())   # nothing created (no venv, no runs/)
    if script.startswith("launch/train") or script == "launch/slurm_train.sbatch":
        assert "Launcher options:" in p.stdout


def test_harness_help():
    p = subprocess.run([sys.executable, str(REPO / "launch" / "cluster" / "harness.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("usage: harness.py")


def test_default_recipe_and_preempted_status_come_from_python():
    from tsm_ds.utils.exits import EXIT_PREEMPTED

    assert _bash("tsm_default_recipe", env={"DS_ACCELERATOR": "cpu"}).stdout.strip() == "cpu_fp32"
    assert _bash("tsm_default_recipe", env={"DS_ACCELERATOR": "cuda"}).stdout.strip() == "gpu_fp16"
    assert _bash("tsm_exit_code preempted").stdout.strip() == str(EXIT_PREEMPTED) == "75"
    p = _bash("tsm_explain_exit 255")
    assert p.stderr.startswith("launch: exit status 255: pdsh's status")


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


def test_gpu_check_fits_five_minutes_by_its_boxes():
    """launch/gpu_check.sh on the GPU machine: every section's box plus its kill delay sums to <= 300 s,
    and every section of the GPU run takes its box from the one table (issue 37)."""
    text = (REPO / "launch" / "gpu_check.sh").read_text()
    table = re.search(r"declare -A BOX=\((.*?)\)\n", text, re.S).group(1)
    boxes = {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", table)}
    kill = int(re.search(r"^KILL_AFTER=(\d+)$", text, re.M).group(1))
    assert set(boxes) == {"setup", "doctor", "precisions", "recipes", "onebit", "gpudecode", "largebatch",
                          "fusedlamb", "compile"}
    assert boxes["largebatch"] <= 60                                    # the large-batch smoke (issue 41)
    assert sum(b + kill for b in boxes.values()) <= 300, boxes
    run = text[text.index('  section setup "${BOX[setup]}"'):text.index("\nfi\n", text.index('section setup "${BOX'))]
    used = re.findall(r'section (\w+) "\$\{BOX\[(\w+)\]\}"', run) + [
        ("gpudecode", m) for m in re.findall(r'gpudecode cuda \d+ "\$\{BOX\[(\w+)\]\}"', run)] + [
        ("largebatch", m) for m in re.findall(r'largebatch --smoke "\$\{BOX\[(\w+)\]\}"', run)]
    assert sorted(a for a, b in used if a == b) == sorted(boxes), used
    assert run.rindex("section compile") > run.rindex("section fusedlamb")   # compile last
    assert "--arch resnet18" in run[run.rindex("section compile"):]         # a small model to compile
