"""What one node offers a launch, without importing torch: its cores, its GPUs, ranks and threads
per rank, the default engine recipe, a free port.

Read by training (:func:`tsm_ds.engine.comm.dist.set_threads`, ``tsm_ds.cli.train.default_recipe``),
the doctor, and the launch scripts through ``python -m tsm_ds.cli.launch_helper`` (which must
answer in a fraction of a second on a node whose torch import takes seconds). Functions that read
variables take the environment as an argument (``os.environ`` from the caller).

The CUDA check without torch (:func:`accelerator`): ``DS_ACCELERATOR`` when set; else CPU when
the installed torch is a CPU-only build (its ``torch/version.py`` says ``cuda = None`` and
``hip = None``), when ``CUDA_VISIBLE_DEVICES`` hides every device (empty or ``-1``), or when the
node shows no NVIDIA device (no ``/dev/nvidia<N>``, and ``nvidia-smi -L`` lists none); else CUDA.
Training itself still asks torch (``torch.cuda.is_available()``) before DeepSpeed is imported.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["usable_cores", "node_cores", "threads_per_rank", "torch_gpu_build", "gpu_count", "accelerator",
           "AcceleratorError", "decide_accelerator", "ops_cache_dir",
           "default_recipe", "ranks_per_node", "free_port", "slurm_port", "port_free_on"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is
    none), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def node_cores(environ: Mapping[str, str]) -> int:
    """Cores of this node for a launch: ``SLURM_CPUS_ON_NODE`` (the allocation's) when set, else
    :func:`usable_cores`.

    Raises:
        ValueError: ``SLURM_CPUS_ON_NODE`` is not a positive integer.
    """
    v = environ.get("SLURM_CPUS_ON_NODE")
    if v:
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"SLURM_CPUS_ON_NODE={v!r}: not a positive number of cores")
        return int(v)
    return usable_cores()


def threads_per_rank(cores: int, local_ranks: int) -> int:
    """Threads for each rank of a node: ``cores // local_ranks``, at least 1.

    Every rank needs its own cores: 2 unpinned ranks on 2 cores ran ~10x slower than 1 thread
    each (the first round's measurement).

    Args:
        cores: cores of the node (or of the allocation). local_ranks: ranks on the node (< 1 counts 1).
    """
    return max(1, int(cores) // max(1, int(local_ranks)))


def torch_gpu_build() -> bool | None:
    """Whether the installed torch was built for CUDA or ROCm, read from ``torch/version.py``
    without importing torch (which takes seconds). None: torch is not installed or the file
    does not say."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    found = dict(re.findall(r"^(cuda|hip)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.M))
    if not found:
        return None
    return any(v != "None" for v in found.values())


def gpu_count(environ: Mapping[str, str], *, dev: str | Path = "/dev", smi: bool = True) -> int:
    """NVIDIA GPUs this process may use, without torch.

    Args:
        environ: the environment (``CUDA_VISIBLE_DEVICES``: empty or ``-1`` hides every device;
            a list caps the count at its length).
        dev: the device folder (``/dev/nvidia<N>`` per GPU; tests give their own).
        smi: ask ``nvidia-smi -L`` when the folder shows no device.

    Returns:
        The count (0: none).
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        n = sum(1 for p in Path(dev).iterdir() if re.fullmatch(r"nvidia\d+", p.name))
    except OSError:
        n = 0
    if n == 0 and smi and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        n = sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
    if visible:
        n = min(n, len([v for v in visible.split(",") if v.strip()]))
    return n


def accelerator(environ: Mapping[str, str], *, gpus: int | None = None, gpu_build: bool | None = None) -> str:
    """DeepSpeed's accelerator for this node: ``DS_ACCELERATOR`` when set, else ``"cuda"`` when
    the installed torch is a GPU build and a GPU is visible, else ``"cpu"`` (module docstring).

    Args:
        environ: the environment. gpus: the visible GPUs (None: :func:`gpu_count`).
        gpu_build: torch built for GPUs (None: :func:`torch_gpu_build`; unknown counts as yes).
    """
    given = environ.get("DS_ACCELERATOR")
    if given:
        return given
    build = torch_gpu_build() if gpu_build is None else gpu_build
    if build is False:
        return "cpu"
    return "cuda" if (gpu_count(environ) if gpus is None else gpus) > 0 else "cpu"


class AcceleratorError(ValueError):
    """Training would run on another device than the node and the recipe call for; the message says
    why and how to proceed (fix the node, unset the variable, or force the device on purpose)."""


def decide_accelerator(environ: Mapping[str, str], *, device: str = "auto", gpus: int, cuda_usable: bool,
                       cuda_reason: str | None = None, needs_cuda: str | None = None,
                       recipe: str = "the recipe") -> tuple[str, str | None]:
    """DeepSpeed's accelerator for this rank, decided on this rank's own node; never a silent CPU.

    Args:
        environ: the environment (``DS_ACCELERATOR``: a value inherited from an env file or from the
            node that launched the job).
        device: ``--device``: ``"auto"`` (decide), ``"cpu"`` (the CPU on purpose, also on a GPU node
            or with a GPU recipe), ``"cuda"`` (refuse anything else).
        gpus: NVIDIA GPUs this node shows (:func:`gpu_count`); cuda_usable: torch can use CUDA
            (``torch.cuda.is_available()``); cuda_reason: why not (torch's own error), for the message.
        needs_cuda: why the recipe needs CUDA (fp16, a CUDA-only optimizer, a ``gpu_*`` recipe), or None.
        recipe: the recipe's name, for the message.

    Returns:
        (``"cpu"`` / ``"cuda"`` / another ``DS_ACCELERATOR`` value, a note for the log or None).

    Raises:
        AcceleratorError: ``DS_ACCELERATOR=cpu`` on a node with GPUs; GPUs present but CUDA unusable
            (an old driver for the installed torch, a CPU-only torch build); a recipe that needs CUDA
            without CUDA; ``--device cuda`` without CUDA; in each case unless ``--device cpu``.
    """
    given = (environ.get("DS_ACCELERATOR") or "").strip() or None
    why_not = f" ({cuda_reason})" if cuda_reason else ""
    if device == "cpu":
        note = "--device cpu: DeepSpeed's CPU accelerator (gloo)"
        if gpus:
            note += f", on purpose, although this node shows {gpus} GPU(s)"
        if needs_cuda:
            note += f"; {recipe} is meant for CUDA ({needs_cuda})"
        return "cpu", note
    if device == "cuda":
        if not cuda_usable:
            raise AcceleratorError(f"--device cuda: CUDA is not usable on this node{why_not}; {gpus} NVIDIA GPU(s) "
                                   "shown. Check the driver against the installed torch (nvidia-smi, "
                                   "python -c 'import torch; print(torch.version.cuda)')")
        if given and given != "cuda":
            raise AcceleratorError(f"--device cuda, but DS_ACCELERATOR={given} in the environment (an env file: "
                                   ".deepspeed_env, ~/.deepspeed_env, $TSM_DS_ENV_FILE?): unset it")
        return "cuda", None
    if device != "auto":
        raise AcceleratorError(f"--device {device!r}: choose auto, cpu or cuda")
    if given == "cpu" and gpus:
        raise AcceleratorError(f"DS_ACCELERATOR=cpu in the environment on a node with {gpus} GPU(s) (an env file: "
                               ".deepspeed_env, ~/.deepspeed_env, $TSM_DS_ENV_FILE, or the shell that launched): "
                               "unset it to train on the GPUs, or pass --device cpu to train on the CPU on purpose")
    if given == "cuda" and not cuda_usable:
        raise AcceleratorError(f"DS_ACCELERATOR=cuda in the environment, but torch cannot use CUDA on this node"
                               f"{why_not}: fix the node, or unset it (and pass --device cpu to train on the CPU)")
    if given and given != "cpu":
        return given, None
    if gpus and not cuda_usable:
        raise AcceleratorError(f"this node shows {gpus} NVIDIA GPU(s) but torch cannot use CUDA{why_not}: a driver "
                               "older than the installed torch's CUDA, or a CPU-only torch build. Fix the node (or "
                               "hide the GPUs with CUDA_VISIBLE_DEVICES=), or pass --device cpu to train on the CPU")
    if cuda_usable and given != "cpu":
        return "cuda", None
    if needs_cuda:
        raise AcceleratorError(f"{recipe} needs CUDA ({needs_cuda}) and this node has none usable{why_not}: choose "
                               "a cpu_* recipe, or pass --device cpu to run it on the CPU anyway")
    return "cpu", ("no CUDA device: set DS_ACCELERATOR=cpu (DeepSpeed's CPU accelerator, gloo)" if not given else None)


def ops_cache_dir(environ: Mapping[str, str]) -> str:
    """Where DeepSpeed JIT-builds its ops (``TORCH_EXTENSIONS_DIR``): the variable when set, else a
    node-local folder, ``$TMPDIR`` (else /tmp) ``/tsm_ds_ops_<uid>/torch-<v>_deepspeed-<v>_py<v>``.

    Node-local, so that each node builds once (its local ranks take turns on a lock) and no rank
    waits on a build lock left on a shared filesystem by another node (torch's ``FileBaton``: a
    stale lock on NFS hangs every rank); keyed by the versions, so that two venvs of one machine do
    not rebuild each other's ops. Every command (the launch scripts, ``deepspeed tsm_ds/train.py``,
    ``launch/setup.sh``'s prebuild) finds the same cache. Torch-free (package metadata only).
    """
    given = environ.get("TORCH_EXTENSIONS_DIR")
    if given:
        return given
    import sys
    from importlib.metadata import PackageNotFoundError, version

    def v(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "none"
    key = f"torch-{v('torch')}_deepspeed-{v('deepspeed')}_py{sys.version_info[0]}.{sys.version_info[1]}"
    base = environ.get("TMPDIR") or "/tmp"
    return str(Path(base) / f"tsm_ds_ops_{os.getuid()}" / key)


def default_recipe(accelerator_name: str) -> str:
    """The engine recipe without ``--deepspeed_config``: ``cpu_fp32`` on DeepSpeed's CPU
    accelerator, else ``gpu_fp16`` (training, the doctor and the launch scripts alike).

    Args:
        accelerator_name: ``"cpu"``, ``"cuda"``, ... (:func:`accelerator`, or ``DS_ACCELERATOR``).
    """
    return "cpu_fp32" if accelerator_name == "cpu" else "gpu_fp16"


def ranks_per_node(environ: Mapping[str, str], *, cpu_ranks: int = 1, gpus: int | None = None) -> int:
    """Ranks to start on this node: ``NPROC``; else ``cpu_ranks`` on the CPU accelerator; else the
    allocation's GPUs (``SLURM_GPUS_ON_NODE``); else the visible GPUs (``CUDA_VISIBLE_DEVICES``'s
    entries, else :func:`gpu_count`); at least 1.

    Args:
        environ: the environment (``DS_ACCELERATOR`` decides CPU; unset: :func:`accelerator`).
        cpu_ranks: ranks on a CPU node (the single-node script starts 2, SLURM 1 per node).
        gpus: the visible GPUs (None: :func:`gpu_count`).

    Raises:
        ValueError: ``NPROC`` or ``SLURM_GPUS_ON_NODE`` is not a positive integer.
    """
    v = environ.get("NPROC")
    if v:
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"NPROC={v!r}: not a positive number of ranks")
        return int(v)
    if accelerator(environ, gpus=gpus) == "cpu":
        return max(1, cpu_ranks)
    v = environ.get("SLURM_GPUS_ON_NODE")
    if v:
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"SLURM_GPUS_ON_NODE={v!r}: not a positive number of GPUs")
        return int(v)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return max(1, len([x for x in visible.split(",") if x.strip()]))
    return max(1, gpu_count(environ) if gpus is None else gpus)


def free_port(addr: str = "127.0.0.1") -> int:
    """An unused TCP port, found by binding port 0 on ``addr`` (``""``: every address; others may
    hold 29500). The port is free when returned; a later bind can still lose a race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def slurm_port(job_id: str | int) -> int:
    """The rendezvous port of a SLURM job, the same on every node: 20000 + job id mod 20000.

    Raises:
        ValueError: ``job_id`` is not a non-negative integer (an array job's ``123_4`` is not).
    """
    s = str(job_id).strip()
    if not s.isdigit():
        raise ValueError(f"SLURM_JOB_ID={job_id!r}: not a job number")
    return 20000 + int(s) % 20000


def port_free_on(host: str, port: int, python: str, *, ssh_port: int | None = None, timeout: float = 10.0) -> bool:
    """Whether ``port`` can be bound on ``host`` (where rank 0 will listen), asked over ssh.

    Args:
        host: the host (the hostfile's first). port: the TCP port to bind on every address there.
        python: an interpreter path that exists on ``host`` (the launch's own: the same venv path).
        ssh_port: sshd's port (None: the default). timeout: seconds for the connection.

    Returns:
        True when the bind worked; False when it failed and also when ssh failed (the ssh check
        reports that host on its own).
    """
    import shlex

    from tsm_ds.utils.hosts import ssh_argv

    cmd = f"{shlex.quote(python)} -c \"import socket; socket.socket().bind(('', {int(port)}))\""
    try:
        p = subprocess.run(ssh_argv(host, ssh_port, timeout) + [cmd], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout + 20)
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 0
