"""Hostfiles and ssh as DeepSpeed's launcher uses them: the hosts and their slots, the ssh command
line, and what to do about each ssh error. No torch: the launch scripts ask through
``python -m tsm_ds.cli.launch_helper`` (``hosts``, ``slots``, ``check-ssh``) and the doctor's
cluster section (:mod:`tsm_ds.doctor.cluster`) reads the same functions.

A hostfile is DeepSpeed's: one line per host, ``<host> slots=<ranks>``; ``#`` starts a comment,
blank lines are skipped (DeepSpeed 0.19.8's ``runner._parse_hostfile`` refuses a host listed twice
and, for the launch, a line without ``slots=``).
"""
from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["read_hostfile", "ssh_argv", "classify_ssh_error", "SshProblem", "check_ssh", "last_lines"]


def read_hostfile(path: str, *, require_slots: bool = False) -> list[tuple[str, int]]:
    """``[(host, slots), ...]`` of a DeepSpeed hostfile, in order (``#`` comments, blank lines skipped).

    Args:
        path: the hostfile.
        require_slots: every line must say ``slots=<n>`` (DeepSpeed's launcher refuses a bare
            host); otherwise a bare host counts 1 slot (the doctor's check).

    Returns:
        The hosts in file order with their slots (ranks on that host, >= 0).

    Raises:
        FileNotFoundError: no such file (the message says what the file holds).
        ValueError: a line is not ``<host> [slots=<n>]`` (names file:line), a host is listed
            twice, or the file lists no host.
    """
    hosts: list[tuple[str, int]] = []
    try:
        f = open(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"hostfile {path} not found (one line per host: '<host> slots=<ranks>')") from None
    with f:
        for n, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            m = re.fullmatch(r"slots=(\d+)", words[1]) if len(words) == 2 else None
            if len(words) > 2 or (len(words) == 2 and not m) or (require_slots and not m):
                raise ValueError(f"{path}:{n}: not '<host> slots=<ranks>': {line.strip()!r}")
            if any(h == words[0] for h, _ in hosts):
                raise ValueError(f"{path}:{n}: host {words[0]} listed twice")
            hosts.append((words[0], int(m.group(1)) if m else 1))
    if not hosts:
        raise ValueError(f"hostfile {path} lists no host (one line per host: '<host> slots=<ranks>')")
    return hosts


def ssh_argv(host: str, port: int | None, timeout: float) -> list[str]:
    """ssh as DeepSpeed's launcher runs it, without prompts: ``ssh -o BatchMode=yes ... HOST``.

    Args:
        host: the name as the hostfile gives it. port: sshd's port (None: ssh's default or config).
        timeout: seconds; the connection timeout is this, between 1 and 15 s.
    """
    return (["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(min(timeout, 15)))}"]
            + (["-p", str(port)] if port else []) + [host])


def classify_ssh_error(err: str, host: str, port: int | None) -> tuple[str, str]:
    """What an ssh failure means and how to cure it.

    Args:
        err: ssh's stderr (its exit status was 255). host: the host it tried. port: the ssh port
            given (None: the default).

    Returns:
        (check, fix): ``check`` is ``"host key"`` for a host-key failure, else ``"ssh"``; ``fix`` is
        the command or setting that cures it (``-p PORT`` in the commands when a port was given;
        the port options as the launch scripts (``--ssh_port``) and ``tsm-ds doctor``
        (``--ssh-port``) spell them).
    """
    p = f"-p {port} " if port else ""
    if "Host key verification failed" in err or "HOST IDENTIFICATION HAS CHANGED" in err:
        return "host key", (f"check the key's fingerprint with its admin, then: ssh-keyscan {p}{host} >> "
                            "~/.ssh/known_hosts (a changed key: ssh-keygen -R first)")
    if "Permission denied" in err:
        return "ssh", f"passwordless login: ssh-copy-id {p}{host} (the launcher cannot type a password)"
    if "Could not resolve hostname" in err or "Name or service not known" in err:
        return "ssh", f"{host} is not a known name: add it to DNS, /etc/hosts or ~/.ssh/config (HostName)"
    m = re.search(r"port (\d+)", err)   # the port ssh used (its config may set one)
    used = m.group(1) if m else (port or 22)
    if "Connection refused" in err:
        return "ssh", (f"nothing listens for ssh on {host} port {used}: start sshd there, or give its port "
                       "(SSH_PORT; launch scripts: --ssh_port, tsm-ds doctor: --ssh-port)")
    if "timed out" in err or "No route to host" in err or "Network is unreachable" in err:
        return "ssh", f"{host} is down or a firewall drops port {used}"
    return "ssh", "run the ssh command of the detail by hand to see what it needs"


def last_lines(text: str, n: int = 3) -> str:
    """The last ``n`` non-empty lines of ``text`` joined by " / " (ssh's "Warning: Permanently
    added" lines left out): one line, for a table or a log."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently")]
    return " / ".join(lines[-n:])


@dataclass(frozen=True)
class SshProblem:
    """A host that did not answer ``ssh HOST true`` without a prompt.

    Attributes:
        host: the host. error: ssh's own words (last lines of its stderr) or its exit status.
        check: ``"ssh"`` or ``"host key"`` (:func:`classify_ssh_error`). fix: what to do.
    """
    host: str
    error: str
    check: str
    fix: str


def check_ssh(hosts: list[str], port: int | None = None, *, timeout: float = 10.0) -> list[SshProblem]:
    """Log into every host as the launcher will (``ssh -o BatchMode=yes HOST true``), in parallel.

    DeepSpeed's launcher says only "host=X was not reachable via ssh", and only for the first
    host; this keeps ssh's own error for each.

    Args:
        hosts: host names. port: sshd's port (None: the default). timeout: seconds per connection.

    Returns:
        The hosts that failed, in the order given (empty: every host answered).
    """
    def one(host: str) -> SshProblem | None:
        try:
            p = subprocess.run(ssh_argv(host, port, timeout) + ["true"], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=timeout + 20)
        except subprocess.TimeoutExpired:
            return SshProblem(host, f"no answer within {timeout + 20:.0f} s", "ssh",
                              f"{host} is down or a firewall drops the ssh port")
        if p.returncode == 0:
            return None
        err = last_lines(p.stderr) or f"exit status {p.returncode}"
        check, fix = classify_ssh_error(p.stderr, host, port)
        return SshProblem(host, err, check, fix)

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return [r for r in pool.map(one, hosts) if r is not None]
