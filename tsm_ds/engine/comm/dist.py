"""Process and distributed set-up: accelerator choice, threads per rank, process group, /dev/shm.

Used by training, evaluation and the benchmarks. CPU ranks sharing a machine must split its cores
(``../shared/ds_cpu_notes.md``: 2 unpinned ranks on 2 cores ran ~10x slower), and DeepSpeed's CPU
accelerator leaves a 69 MB /dev/shm buffer per rank unless it is removed at exit.
"""
from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# the pure parts, torch-free (the launch scripts ask them through tsm_ds.cli.launch_helper);
# free_port stays importable from here (the benches' and tests' launches use it)
from tsm_ds.utils.node import free_port, threads_per_rank, usable_cores


def cuda_state() -> tuple[bool, str | None]:
    """(torch can use CUDA, why not: torch's own error or the build) on this node."""
    if torch.cuda.is_available():
        return True, None
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return False, f"torch {torch.__version__} is a CPU-only build"
    try:
        torch.cuda.init()
    except Exception as e:   # the driver's or the runtime's own words
        return False, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return False, "torch.cuda.is_available() is False"


def set_accelerator_env(*, device: str = "auto", needs_cuda: str | None = None,
                        recipe: str = "the recipe") -> str | None:
    """Decide DeepSpeed's accelerator on this rank's own node and set ``DS_ACCELERATOR`` (before
    deepspeed is imported): :func:`tsm_ds.utils.node.decide_accelerator` with this node's GPUs
    (``/dev/nvidia<N>`` / ``nvidia-smi``) and torch's CUDA state.

    Args:
        device: ``--device`` (auto / cpu / cuda); needs_cuda: why the recipe needs CUDA (None: it
            does not; :func:`tsm_ds.engine.config.recipes.recipe_needs_cuda`); recipe: its name.

    Returns:
        A note for the log, or None.

    Raises:
        tsm_ds.utils.node.AcceleratorError: a silent CPU run would follow (its message says what to do).
    """
    from tsm_ds.utils.node import decide_accelerator, gpu_count

    usable, reason = cuda_state()
    name, note = decide_accelerator(os.environ, device=device, gpus=gpu_count(os.environ), cuda_usable=usable,
                                    cuda_reason=reason, needs_cuda=needs_cuda, recipe=recipe)
    os.environ["DS_ACCELERATOR"] = name
    return note


def set_threads() -> str:
    """Give each local rank its own cores: torch threads = usable cores / local ranks.

    Returns a one-line description of the choice, for the log.

    Skipped when OMP_NUM_THREADS is set (``--bind_cores_to_rank`` sets it) or when the launcher
    reports no local world size. 2 unpinned ranks on 2 cores ran ~10x slower (ds_cpu_notes.md).
    """
    if "OMP_NUM_THREADS" in os.environ:
        return f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} given: torch threads {torch.get_num_threads()}"
    local = int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 1)
    cores = usable_cores()
    n = threads_per_rank(cores, local)   # the launch scripts' OMP_NUM_THREADS is the same split
    torch.set_num_threads(n)
    return f"{cores} cores / {local} local ranks: torch threads {n} (set OMP_NUM_THREADS to override)"


def init_distributed(*, require_group: bool = True, timeout_s: float | None = None,
                     hosts: list[str] | None = None, collective_s: float | None = None) -> tuple[int, int]:
    """Join the process group: the one distributed set-up of training, evaluation and the benches.

    Launched by ``deepspeed`` / ``torchrun`` (RANK, WORLD_SIZE, MASTER_* set), every rank joins the
    fail-fast rendezvous of :mod:`tsm_ds.engine.comm.rendezvous` (all ranks within ``timeout_s``, or
    every rank stops naming the missing ranks and hosts), then the process group is built on its
    store with the accelerator's backend (gloo on CPU, NCCL on CUDA, after pinning the rank to its
    LOCAL_RANK GPU) and the same ``timeout_s`` for every collective, and ``deepspeed.init_distributed``
    adopts it; the /dev/shm clean-up is registered (:func:`release_cpu_shm_at_exit`). mpirun
    (OMPI_*, no RANK) goes through DeepSpeed's MPI discovery. A plain ``python`` run is a world of
    one: with ``require_group`` (DeepSpeed engines need a group) it gets a one-rank group on
    127.0.0.1 and a free port; without, no group. A group made by the caller is used as it is.
    Threads per rank are :func:`set_threads`'s business (call it first).

    Args:
        require_group: build a one-rank group for a plain ``python`` run.
        hosts: the hostfile's hosts in node order, to name a missing rank's host (``distributed.hosts``).
        timeout_s: rendezvous and collective limit in seconds (None: 300;
            :func:`tsm_ds.engine.comm.rendezvous.dist_timeout_s`).
        collective_s: the collectives' own limit when it differs (training: above the hang
            watchdog's, :func:`tsm_ds.engine.comm.rendezvous.collective_timeout_s`); None: ``timeout_s``.

    Returns:
        (rank, world size).

    Raises:
        tsm_ds.engine.comm.rendezvous.RendezvousError: not every rank joined in time (the message names them).
        ValueError: a bad timeout.
    """
    from tsm_ds.engine.comm.rendezvous import dist_timeout_s, rendezvous

    if dist.is_initialized():
        release_cpu_shm_at_exit()
        return dist.get_rank(), dist.get_world_size()
    timeout = dist_timeout_s(timeout_s)
    world = int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1")
    if world <= 1 and not require_group:
        return 0, 1
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:   # a plain `python` run
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    import datetime

    import deepspeed
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    limit = datetime.timedelta(seconds=collective_s if collective_s is not None else timeout)
    if acc.device_name() == "cpu":
        build_cpu_comm_op()
    if "RANK" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = rendezvous(rank, world, addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                           port=int(os.environ.get("MASTER_PORT", "29500")), timeout_s=timeout, hosts=hosts)
        kwargs = {}
        if acc.device_name() == "cuda" and world > 1:   # as DeepSpeed's TorchBackend does
            kwargs["device_id"] = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(acc.communication_backend_name(), store=store, rank=rank, world_size=world,
                                timeout=limit, **kwargs)
    deepspeed.init_distributed(dist_backend=acc.communication_backend_name(), timeout=limit)
    release_cpu_shm_at_exit()
    return dist.get_rank(), dist.get_world_size()


def build_cpu_comm_op() -> None:
    """Load DeepSpeed's CPU comm op, building it first if its cache is empty, one process per
    machine at a time.

    The local ranks of a node take an exclusive ``flock`` on ``$TORCH_EXTENSIONS_DIR/
    tsm_ds_build.lock`` in turn: the first builds (20 s to 2 min here), the others load the cache.
    Two ranks building into one empty cache at once can abort (measured in the first round). Call
    before the rendezvous, so that the build is not counted against the collective timeout.
    """
    import fcntl

    from deepspeed.comm.torch import build_shm_op

    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / "tsm_ds_build.lock", "a")
    except OSError:   # a read-only cache: nothing to build into anyway
        build_shm_op()
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            build_shm_op()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def collective_device() -> torch.device:
    """Where tensors handed to a collective must live: the current CUDA device under NCCL (which
    cannot move CPU tensors), else the CPU (gloo; no process group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device() -> torch.device:
    """This rank's device: ``cuda:<current>`` on GPUs, else ``cpu`` (DeepSpeed's accelerator decides)."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    return torch.device(acc.device_name(), acc.current_device()) if acc.device_name() != "cpu" else torch.device("cpu")


_SHM_REGISTERED: set[Path] = set()


def release_cpu_shm_at_exit() -> Path | None:
    """Unlink this rank's DeepSpeed CPU all-reduce buffer in /dev/shm when the process exits.

    DeepSpeed 0.19.8's CPU accelerator (``ops/csrc/cpu/comm/shm.cpp``, ``shm_initialize``) creates
    ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`` (69 MB per
    rank) when all ranks are local, and never unlinks it (``shared_close`` is never called). /dev/shm
    is RAM: measured here, 314 leftover buffers (21 GB) from earlier runs filled it until the
    kernel killed the test suite. Once every rank has mapped its peers' buffers (at init), the
    name is no longer needed, so each rank removes its own at exit (a SIGKILLed rank cannot).

    Returns the path registered for removal (it may not exist: ranks on several hosts make none),
    or None (no process group, or not DeepSpeed's CPU accelerator). A world of one makes a buffer
    too when ``LOCAL_SIZE`` is 1. Call after ``deepspeed.init_distributed``.
    """
    import atexit

    if not dist.is_initialized():
        return None
    from deepspeed.accelerator import get_accelerator
    if get_accelerator().device_name() != "cpu":
        return None
    path = Path("/dev/shm") / (f"deepspeed_allreduce_buffer_{os.getuid()}_"
                               f"{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}_"
                               f"{dist.get_rank()}")
    if path not in _SHM_REGISTERED:
        _SHM_REGISTERED.add(path)
        atexit.register(path.unlink, missing_ok=True)
    return path


def release_cpu_shm_now() -> list[Path]:
    """Unlink the /dev/shm buffers registered by :func:`release_cpu_shm_at_exit` now, for a process
    about to leave through ``os._exit`` (which skips ``atexit``: the hang watchdog). Returns them."""
    paths = sorted(_SHM_REGISTERED)
    for p in paths:
        p.unlink(missing_ok=True)
    return paths


def launcher_command() -> list[str]:
    """The ``deepspeed`` launcher of this interpreter's environment.

    The console script next to ``sys.executable`` when present (a venv's ``bin/deepspeed``), else
    the one on ``PATH``, else the same code as a module: ``python -m deepspeed.launcher.runner``.
    """
    exe = Path(sys.executable).parent / "deepspeed"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("deepspeed")
    return [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]


def hosts() -> list[str]:
    """The host name of every rank, in rank order (a collective: every rank must call it);
    ``[this host]`` without a process group."""
    name = socket.gethostname()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [name]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, name)
    return [str(h) for h in out]
