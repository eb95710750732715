"""Fail-fast rendezvous: every rank joins within ``--dist-timeout`` seconds, or every rank stops
with a message that names the missing ranks and their hosts.

``torch.distributed``'s own env:// rendezvous waits DeepSpeed's 10 to 30 minutes and then says only
"Timed out ... 1/2 clients joined". Here rank 0 serves the TCP store (MASTER_ADDR:MASTER_PORT, the
port the process group would use anyway), every rank registers ``{host, pid, local_rank,
node_rank}`` under ``tsm_ds/joined/<rank>``, rank 0 waits until all have registered or the limit
passes, then writes one verdict (``go`` or the failure text) that every joined rank reads. The same
store then backs the process group (``init_process_group(store=...)``), whose ``timeout`` bounds
every later gloo collective: a rank that dies or hangs mid-run ends its peers' waits within the
limit instead of DeepSpeed's default.

Where a missing rank runs: the launch scripts export ``TSM_DS_HOSTS`` (the hostfile's hosts in
node order, see ``launch/common.sh``); DeepSpeed's launcher starts ranks node by node with
``LOCAL_SIZE`` ranks each, so rank r runs on node r // LOCAL_SIZE.
"""
from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta

__all__ = ["DEFAULT_TIMEOUT_S", "RendezvousError", "rendezvous", "dist_timeout_s", "missing_rank_hosts"]

#: seconds; the launch scripts build DeepSpeed's CPU op before starting ranks, so start-up skew is
#: small; a rank still building it (up to ~2 min here) is within the limit.
DEFAULT_TIMEOUT_S = 300.0
_VERDICT = "tsm_ds/verdict"
_COUNT = "tsm_ds/joined_count"


class RendezvousError(RuntimeError):
    """Not every rank joined within the limit (or rank 0 could not be reached); the message says
    which ranks, on which hosts, and what to check."""


def dist_timeout_s(value: float | None = None) -> float:
    """The limit in seconds: ``value`` when given (``--dist-timeout``, or ``TSM_DS_DIST_TIMEOUT``
    read by the command line into ``distributed.dist_timeout``), else 300.

    Raises:
        ValueError: not a positive number.
    """
    src = "--dist-timeout"
    if value is None:
        return DEFAULT_TIMEOUT_S
    if not value > 0:
        raise ValueError(f"{src} must be > 0 seconds, got {value}")
    return float(value)


#: seconds between the watchdog's limit and the collective timeout: the watchdog's stacks and exit 6 come first
WATCHDOG_MARGIN_S = 120.0


def collective_timeout_s(join_s: float, step_timeout: float, startup_timeout: float) -> float:
    """The process group's collective timeout: ``join_s`` (``--dist-timeout``), raised above the
    hang watchdog's limits (``--step-timeout``, ``--startup-timeout``; 0 = off) by
    :data:`WATCHDOG_MARGIN_S`, so that a stuck collective is caught by the watchdog (every rank's
    stacks in ``<run>/stacks/``, ``hang.json``, exit 6) before NCCL or gloo aborts the rank without
    a word (issue 37: NCCL's 300 s fired long before the watchdog's 1,800 s).

    Raises:
        ValueError: a negative watchdog limit, or a non-positive ``join_s``.
    """
    if step_timeout < 0 or startup_timeout < 0:
        raise ValueError(f"--step-timeout {step_timeout} / --startup-timeout {startup_timeout}: give seconds >= 0 "
                         "(0 turns a limit off)")
    limit = max(step_timeout, startup_timeout)
    return max(dist_timeout_s(join_s), limit + WATCHDOG_MARGIN_S if limit > 0 else 0.0)


def missing_rank_hosts(missing: list[int], joined: dict[int, dict], *, local_size: int,
                       hosts: list[str] | None) -> dict[int, str]:
    """The host each missing rank was to run on, as well as it can be told.

    Args:
        missing: ranks that did not register.
        joined: rank -> its registration (``{"host", "node_rank", ...}``).
        local_size: ranks per node (DeepSpeed's ``LOCAL_SIZE``; ranks are numbered node by node).
        hosts: the hostfile's hosts in node order (``distributed.hosts``, set from ``$TSM_DS_HOSTS``), or None.

    Returns:
        rank -> ``"node-b"`` (from the hostfile), ``"node-b (where rank 2 runs)"`` (a rank of the same
        node joined) or ``"node 1 of the hostfile"`` (nothing better known).
    """
    by_node: dict[int, str] = {}
    for r, info in joined.items():
        by_node.setdefault(r // max(1, local_size), f"{info.get('host', '?')} (where rank {r} runs)")
    out = {}
    for r in missing:
        node = r // max(1, local_size)
        if hosts and node < len(hosts):
            out[r] = hosts[node]
        else:
            out[r] = by_node.get(node, f"node {node} of the hostfile")
    return out


def _describe_failure(missing: list[int], joined: dict[int, dict], world: int, timeout_s: float,
                      addr: str, port: int, hosts: list[str] | None = None) -> str:
    local = int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or max(1, world))
    where = missing_rank_hosts(missing, joined, local_size=local, hosts=list(hosts) if hosts else None)
    miss = ", ".join(f"rank {r} on {where[r]}" for r in missing[:16]) + (
        f" and {len(missing) - 16} more" if len(missing) > 16 else "")
    got = ", ".join(f"rank {r} on {i.get('host')}" for r, i in sorted(joined.items())[:8])
    hosts = sorted({where[r].split(" ")[0] for r in missing})
    return (f"rendezvous failed: {len(missing)} of {world} ranks did not join within {timeout_s:.0f} s "
            f"(--dist-timeout / TSM_DS_DIST_TIMEOUT): {miss}. Joined: {got or 'none'}. Every rank stops. Check on "
            f"{', '.join(hosts[:8])}: that the ranks started (the launcher's output for that host: 'Connection "
            f"refused', 'Host key verification failed', a Python error; <run>/logs/rank<r>.log), and that they reach "
            f"{addr}:{port} (MASTER_ADDR / MASTER_PORT; GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on the interface "
            f"of that address).")


def rendezvous(rank: int, world: int, *, addr: str, port: int, timeout_s: float,
               hosts: list[str] | None = None):
    """Join the rendezvous; returns the TCP store to build the process group on.

    Args:
        rank, world: this rank and the world size (launcher's RANK / WORLD_SIZE).
        addr, port: MASTER_ADDR / MASTER_PORT (rank 0 serves the store there).
        timeout_s: the limit for every rank to join, in seconds.
        hosts: the hostfile's hosts in node order (names the host of a missing rank), or None.

    Returns:
        ``torch.distributed.TCPStore`` shared by all ranks.

    Raises:
        RendezvousError: on rank 0, when some ranks did not join in time (names them and their hosts);
            on every other rank, when rank 0's store cannot be reached in time, or rank 0 reported
            that some ranks are missing (the same text), or gave no verdict in time.
    """
    import torch.distributed as dist

    limit = timedelta(seconds=timeout_s)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
          "node_rank": int(os.environ.get("CROSS_RANK", os.environ.get("GROUP_RANK", 0)) or 0)}
    try:
        store = dist.TCPStore(addr, port, world_size=world, is_master=rank == 0, timeout=limit,
                              wait_for_workers=False)
    except Exception as e:   # DistNetworkError / RuntimeError: the store's own words are kept
        if rank == 0:
            raise RendezvousError(f"rank 0 on {me['host']} could not serve the rendezvous on port {port} "
                                  f"({type(e).__name__}: {e}): another job may hold MASTER_PORT={port}: pick "
                                  f"another (--master_port, launch scripts: MASTER_PORT)") from e
        raise RendezvousError(
            f"rank {rank} on {me['host']} could not reach rank 0's rendezvous at {addr}:{port} "
            f"within {timeout_s:.0f} s "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): rank 0 did not start or failed "
            f"first (see its log), or {addr} is not reachable from {me['host']} (set MASTER_ADDR to an address of "
            f"node 0 every host reaches, and GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to that interface)") from e
    store.set(f"tsm_ds/joined/{rank}", json.dumps(me))
    store.add(_COUNT, 1)
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        while store.add(_COUNT, 0) < world and time.monotonic() < deadline:
            time.sleep(0.05)
        if store.add(_COUNT, 0) >= world:
            store.set(_VERDICT, "go")
            return store
        joined, missing = {}, []
        for r in range(world):
            if store.check([f"tsm_ds/joined/{r}"]):
                joined[r] = json.loads(store.get(f"tsm_ds/joined/{r}"))
            else:
                missing.append(r)
        msg = _describe_failure(missing, joined, world, timeout_s, addr, port, hosts)
        store.set(_VERDICT, msg)
        time.sleep(1.0)   # the joined ranks read the verdict before this store goes away
        raise RendezvousError(msg)
    try:   # rank 0 decides once its own limit has passed: allow for start-up skew
        store.wait([_VERDICT], timedelta(seconds=2 * timeout_s + 10))
        verdict = store.get(_VERDICT).decode()
    except Exception as e:
        raise RendezvousError(f"rank {rank} on {me['host']}: rank 0 at {addr}:{port} gave no rendezvous verdict "
                              f"within {2 * timeout_s + 10:.0f} s ({type(e).__name__}): rank 0 died or hangs; "
                              f"see its log") from e
    if verdict != "go":
        raise RendezvousError(verdict)
    return store
