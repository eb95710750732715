"""``python -m tsm_ds.cli.launch_helper``: the launch scripts' answers from Python, without torch
(each query run as the scripts run it, with ``-X importtime``), and the torch-free modules behind
it (``tsm_ds.utils.node``, ``tsm_ds.utils.hosts``, ``tsm_ds.utils.exits``) agreeing with training,
the doctor and torch itself."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.cli import launch_helper as lh
from tsm_ds.utils import exits, hosts, node

REPO = Path(__file__).resolve().parents[2]
FLAGS = lh._train_flags()


def _helper(*args, env=None, importtime=False) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO))
    for k in ("NPROC", "SLURM_JOB_ID", "SLURM_CPUS_ON_NODE", "SLURM_GPUS_ON_NODE", "OMP_NUM_THREADS"):
        full.pop(k, None)
    full.update(env or {})
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "tsm_ds.cli.launch_helper", *args]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=60, cwd=REPO)


def _fake_ssh(tmp_path: Path, script: str) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ssh").write_text("#!/bin/sh\n" + script)
    (bindir / "ssh").chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


# -------------------------------------------------------------------------------- no torch, each query

def test_every_query_answers_without_importing_torch(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=2\nnode-b slots=3\n")
    # an ssh that logs in (runs the command here): check-ssh and the port check on a host
    env = _fake_ssh(tmp_path, 'while [ $# -gt 1 ]; do case "$1" in -o|-p) shift 2;; *) shift; break;; esac; done\n'
                              'exec sh -c "$*"\n')
    queries = {
        ("accelerator",): {"cpu", "cuda"},
        ("default-recipe",): {"cpu_fp32", "gpu_fp16"},
        ("ranks-per-node", "2"): None,
        ("threads", "2"): None,
        ("port",): None,
        ("port", "node-a", "2222"): None,
        ("hosts", str(hf)): {"node-a\nnode-b"},
        ("slots", str(hf), "node-b"): {"3"},
        ("check-ssh", str(hf), "2222"): {""},
        ("launch-args", "multi", "--hostfile", str(hf), "--", "--data", "d"): None,
        ("output-dir", "--data", "d", "--output-dir", "/x/runs"): {"/x/runs"},
        ("exit-code", "preempted"): {"75"},
        ("explain-exit", "5"): None,
    }
    for q, want in queries.items():
        p = _helper(*q, env=env, importtime=True)
        assert p.returncode == 0, (q, p.stderr[-2000:])
        imported = re.findall(r"\|\s+(torch|numpy|deepspeed)(?:\.\S+)?\s*$", p.stderr, re.M)
        assert imported == [], (q, imported)
        if want is not None:
            assert p.stdout.strip() in want, (q, p.stdout)


def test_help_and_unknown_query():
    p = _helper("--help")
    assert p.returncode == 0 and "launch-args KIND ARGS" in p.stdout
    p = _helper("nope")
    assert p.returncode == 2 and "unknown query 'nope'" in p.stderr and "check-ssh" in p.stderr


# -------------------------------------------------------------------------------- threads, ranks, recipe, port

def test_threads_per_rank_is_training_split(monkeypatch):
    assert node.threads_per_rank(64, 4) == 16 and node.threads_per_rank(2, 4) == 1 and node.threads_per_rank(8, 0) == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert node.usable_cores() == 6 and node.node_cores({}) == 6
    assert node.node_cores({"SLURM_CPUS_ON_NODE": "64"}) == 64
    with pytest.raises(ValueError, match="SLURM_CPUS_ON_NODE='x'"):
        node.node_cores({"SLURM_CPUS_ON_NODE": "x"})
    # the helper's answer: threads and cores, the allocation's cores under SLURM
    assert _helper("threads", "4", env={"SLURM_CPUS_ON_NODE": "64"}).stdout.split() == ["16", "64"]
    p = _helper("threads", "four")
    assert p.returncode == 2 and "RANKS 'four' is not a number" in p.stderr


def test_gpu_count_and_accelerator_without_torch(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    assert node.gpu_count({}, dev=dev, smi=False) == 0
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    assert node.gpu_count({}, dev=dev, smi=False) == 2             # nvidiactl / -uvm are not GPUs
    assert node.gpu_count({"CUDA_VISIBLE_DEVICES": "1"}, dev=dev, smi=False) == 1
    assert node.gpu_count({"CUDA_VISIBLE_DEVICES": ""}, dev=dev, smi=False) == 0
    assert node.gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, dev=dev, smi=False) == 0
    assert node.accelerator({"DS_ACCELERATOR": "cpu"}, gpus=8) == "cpu"
    assert node.accelerator({}, gpus=2, gpu_build=True) == "cuda"
    assert node.accelerator({}, gpus=2, gpu_build=False) == "cpu"     # a CPU-only torch cannot use them
    assert node.accelerator({}, gpus=0, gpu_build=True) == "cpu"


def test_torch_free_checks_agree_with_torch():
    import torch

    assert node.torch_gpu_build() == (torch.version.cuda is not None or torch.version.hip is not None)
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    assert node.accelerator(env) == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("env,cpu_ranks,gpus,want", [
    ({"NPROC": "3"}, 1, 0, 3),
    ({"DS_ACCELERATOR": "cpu"}, 1, 8, 1),
    ({"DS_ACCELERATOR": "cpu"}, 2, 8, 2),
    ({"DS_ACCELERATOR": "cuda", "SLURM_GPUS_ON_NODE": "4"}, 1, 8, 4),
    ({"DS_ACCELERATOR": "cuda", "CUDA_VISIBLE_DEVICES": "0,1,2"}, 1, 8, 3),
    ({"DS_ACCELERATOR": "cuda"}, 1, 8, 8),
])
def test_ranks_per_node(env, cpu_ranks, gpus, want):
    assert node.ranks_per_node(env, cpu_ranks=cpu_ranks, gpus=gpus) == want


def test_default_recipe_is_one_function_for_training_the_doctor_and_the_scripts(monkeypatch):
    from tsm_ds.cli.train import default_recipe
    from tsm_ds.doctor import DoctorSettings

    assert node.default_recipe("cpu") == "cpu_fp32" and node.default_recipe("cuda") == "gpu_fp16"
    for acc, want in (("cpu", "cpu_fp32"), ("cuda", "gpu_fp16")):
        monkeypatch.setenv("DS_ACCELERATOR", acc)
        assert default_recipe() == want
        assert _helper("default-recipe", env={"DS_ACCELERATOR": acc}).stdout.strip() == want
        assert DoctorSettings().resolved(acc == "cuda").recipe == want


def test_ports():
    port = node.free_port("")
    with socket.socket() as s:
        s.bind(("", port))   # it was free
    assert node.slurm_port("123457") == 20000 + 123457 % 20000 == 23457
    with pytest.raises(ValueError, match="not a job number"):
        node.slurm_port("123_4")
    assert _helper("port", env={"SLURM_JOB_ID": "123457"}).stdout.strip() == "23457"


def test_port_checked_on_the_first_host_over_ssh(tmp_path):
    # an ssh whose remote bind always fails: 5 tries, then the advice
    env = _fake_ssh(tmp_path, "exit 1\n")
    p = _helper("port", "node-a", "", env=env)
    assert p.returncode == 2
    assert "no free port found on node-a in 5 tries: set MASTER_PORT (or --master_port)" in p.stderr


# -------------------------------------------------------------------------------- hostfile and ssh

def test_hostfile_hosts_slots_and_errors(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# the cluster\nnode-a slots=2\n\nnode-b slots=4  # second\n")
    assert hosts.read_hostfile(str(hf), require_slots=True) == [("node-a", 2), ("node-b", 4)]
    assert _helper("slots", str(hf)).stdout.strip() == "2"
    p = _helper("slots", str(hf), "node-c")
    assert p.returncode == 2 and "host node-c is not in" in p.stderr
    hf.write_text("node-a slots=2\nnode-b\n")
    assert hosts.read_hostfile(str(hf)) == [("node-a", 2), ("node-b", 1)]      # the doctor's reading
    with pytest.raises(ValueError, match=r"hosts:2: not '<host> slots=<ranks>'"):
        hosts.read_hostfile(str(hf), require_slots=True)                    # DeepSpeed's launcher refuses it
    p = _helper("hosts", str(hf))
    assert p.returncode == 2 and f"launch: {hf}:2: not '<host> slots=<ranks>': 'node-b'" in p.stderr
    p = _helper("hosts", str(tmp_path / "nope"))
    assert p.returncode == 2 and f"hostfile {tmp_path / 'nope'} not found" in p.stderr


def test_check_ssh_names_each_host_with_ssh_words_and_the_fix_with_the_port(tmp_path):
    env = _fake_ssh(tmp_path, 'case "$*" in *node-b*) '
                              'echo "ssh: connect to host 10.0.0.2 port 2222: Connection refused" >&2;;\n'
                              '*node-c*) echo "Host key verification failed." >&2;; *) exit 0;; esac\nexit 255\n')
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=1\nnode-b slots=1\nnode-c slots=1\n")
    p = _helper("check-ssh", str(hf), "2222", env=env)
    assert p.returncode == 2
    lines = p.stderr.splitlines()
    assert "launch: ssh node-b failed: ssh: connect to host 10.0.0.2 port 2222: Connection refused" in lines
    assert any("fix: nothing listens for ssh on node-b port 2222" in ln and "--ssh_port" in ln for ln in lines)
    assert "launch: ssh node-c failed: Host key verification failed." in lines
    assert any("ssh-keyscan -p 2222 node-c >> ~/.ssh/known_hosts" in ln for ln in lines)
    assert not any("node-a" in ln for ln in lines)
    assert lines[-1] == f"launch: not every host of {hf} is reachable by ssh (NO_SSH_CHECK=1 skips this check)"


# -------------------------------------------------------------------------------- launcher arguments

def test_launch_args_split_and_quote():
    s, opts, train = lh.parse_launch_args("multi", ["--hostfile", "h f", "--ssh_port=2222", "--include", "a:0",
                                                    "--master_port", "29600", "--", "--data", "it's"],
                                          train_flags=FLAGS)
    assert s == {"HOSTFILE": "h f", "SSH_PORT": "2222", "MASTER_PORT": "29600"}
    assert opts == ["--include", "a:0"] and train == ["--data", "it's"]
    # without '--': the first of train.py's flags (or an abbreviation argparse takes) ends them
    assert lh.parse_launch_args("single", ["--nproc", "3", "--data", "d", "--master_port", "1"], train_flags=FLAGS) \
        == ({"NPROC": "3"}, [], ["--data", "d", "--master_port", "1"])
    assert lh.parse_launch_args("single", ["--num-seg", "4"], train_flags=FLAGS)[2] == ["--num-seg", "4"]
    assert lh.parse_launch_args("slurm", [], train_flags=FLAGS) == ({}, [], [])
    # the shell assignments eval'd by common.sh give back the same strings
    p = _helper("launch-args", "multi", "--hostfile", "h f", "--", "--data", "it's $HOME")
    out = subprocess.run(["bash", "-c", p.stdout + '\nprintf "%s|" "$HOSTFILE" "${TRAIN_ARGS[@]}"'],
                         capture_output=True, text=True).stdout
    assert out == "h f|--data|it's $HOME|"


@pytest.mark.parametrize("kind,args,message", [
    ("multi", ["--hostfile", "h", "--master-addr", "x", "--", "--data", "d"],
     "unknown option --master-addr: the launcher option is spelled --master_addr"),
    ("multi", ["--master-addr", "x", "--data", "d"],            # no '--': not train.py's either
     "unknown option --master-addr: the launcher option is spelled --master_addr"),
    ("single", ["--ssh-port", "22", "--", "--data", "d"], "--ssh-port is an option of launch/train_multi_node.sh"),
    ("multi", ["--data", "d", "--", "--lr", "1"], "--data is one of train.py's flags: put it after '--'"),
    ("single", ["--frobnicate", "--data", "d"], "unknown option --frobnicate"),
    ("slurm", ["--master_port"], "--master_port needs a value"),
])
def test_unknown_launcher_options_are_refused_with_the_accepted_ones(kind, args, message):
    with pytest.raises(lh.LaunchArgsError) as e:
        lh.parse_launch_args(kind, args, train_flags=FLAGS)
    assert message in str(e.value)
    if "needs a value" not in message:
        script, accepted = lh.SCRIPTS[kind]
        assert str(e.value).startswith(script + ": ")
        assert f"its options: {', '.join(accepted)}" in str(e.value)


def test_output_dir_as_train_py_parses_it(tmp_path):
    env = {}
    assert lh.train_output_dir([], env) == "runs"
    assert lh.train_output_dir(["--output-dir=/o", "--lr", "0.1"], env) == "/o"
    with pytest.raises(ValueError, match="train.py's flags: .*unrecognized arguments: --bogus"):
        lh.train_output_dir(["--bogus"], env)


# -------------------------------------------------------------------------------- exit statuses

def test_exit_statuses_are_one_table():
    from tsm_ds.engine.guards import divergence as guard
    from tsm_ds.engine.guards import preempt, watchdog

    assert (exits.EXIT_OK, exits.EXIT_CONFIG, exits.EXIT_DIVERGED, exits.EXIT_SAVE_FAILED, exits.EXIT_RENDEZVOUS,
            exits.EXIT_HUNG, exits.EXIT_PREEMPTED) == (0, 2, 3, 4, 5, 6, 75)
    assert guard.EXIT_DIVERGED is exits.EXIT_DIVERGED and preempt.EXIT_PREEMPTED is exits.EXIT_PREEMPTED
    assert watchdog.EXIT_HUNG is exits.EXIT_HUNG
    assert "--dist-timeout" in exits.describe(5) and "--resume auto" in exits.describe(75)
    assert "pdsh" in exits.describe(255) and "ssh exited with exit code N" in exits.describe(255)
    assert exits.describe(137) == "killed by SIGKILL (128 + 9)" \
        and exits.describe(-15) == "killed by SIGTERM (128 + 15)"
    p = _helper("exit-code", "hung")
    assert p.stdout.strip() == "6"
    p = _helper("exit-code", "nope")
    assert p.returncode == 2 and "one of ok, config, diverged" in p.stderr


def test_ops_cache_is_node_local_keyed_by_versions_and_shared_by_every_command(tmp_path):
    """DeepSpeed's op cache: TORCH_EXTENSIONS_DIR when set, else $TMPDIR/tsm_ds_ops_<uid>/<versions> on
    the node itself (no build lock on a shared filesystem); set-up, the launch scripts, the tests and
    a plain training run all ask this one function (launch_helper ops-cache)."""
    import os
    from importlib.metadata import version

    assert node.ops_cache_dir({"TORCH_EXTENSIONS_DIR": "/given"}) == "/given"
    got = node.ops_cache_dir({"TMPDIR": str(tmp_path)})
    assert got == str(tmp_path / f"tsm_ds_ops_{os.getuid()}" / f"torch-{version('torch')}_deepspeed-"
                      f"{version('deepspeed')}_py{sys.version_info[0]}.{sys.version_info[1]}")
    assert node.ops_cache_dir({}).startswith("/tmp/tsm_ds_ops_")
    code, out, _ = lh.answer("ops-cache", [], {"TMPDIR": str(tmp_path)})
    assert code == 0 and out == got
    for script in ("launch/setup.sh", "launch/run_tests.sh", "launch/common.sh"):
        assert "ops-cache" in (REPO / script).read_text(), script
