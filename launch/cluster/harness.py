#!/usr/bin/env python3
"""A two-node "cluster" on loopback for the cluster tests (tests/cluster, marker ``cluster``).

Stands up, under one directory DIR and nowhere else:

- munge: ``munged`` with its own key (``DIR/munge/munge.key``) and socket;
- SLURM 22.05 (Debian 12's slurm-wlm): one ``slurmctld`` on 127.0.0.1 and two ``slurmd``
  (``slurmd -N node-a`` / ``-N node-b``, NodeAddr 127.0.0.2 / 127.0.0.3), ``SLURM_CONF`` =
  ``DIR/slurm/slurm.conf``. Traffic goes to loopback addresses only, but slurmctld, slurmd and
  srun listen on all addresses (random ports, munge-authenticated, for the test's duration):
  22.05 cannot bind slurmctld to one address, and ``NoInAddrAny`` binds a slurmd to the address
  of the machine's hostname rather than its NodeAddr, which two slurmd on one machine cannot use;
- ssh: one ``sshd`` per node on ``127.0.0.2:PORT`` / ``127.0.0.3:PORT`` (PORT free, not 22) with
  its own host key, config and authorized_keys; a client key pair; an ``ssh`` wrapper in
  ``DIR/bin`` that adds ``-F DIR/ssh/ssh_config`` (names node-a / node-b resolved there, not in
  /etc/hosts; pdsh's ssh module finds it on PATH). Two more names for failure tests:
  ``node-down`` (127.0.0.4: nothing listens, "Connection refused") and ``node-unknown``
  (node-b's sshd under a host-key alias that known_hosts lacks: "Host key verification failed.").

Each node's daemons (sshd, slurmd) run in their own mount namespace in which /tmp is the node's
private ``DIR/nodes/<node>/tmp`` (the paths that must stay visible: DIR, the repository, the
shared data, are bound back at their place when they lie under /tmp), so a file a job writes to
/tmp on node-a is not seen on node-b, as on a real cluster. Everything a job needs shared (run
dirs) goes under ``DIR/shared``.

Teardown stops every daemon by PID (SIGTERM, then SIGKILL), then every process still inside a
harness mount namespace (job steps, ssh sessions) by PID, and asserts that no such process, no
listening harness port and no harness file is left (DIR removed; /run/sshd removed if the
harness created it). Nothing global is edited: not /etc/hosts, /etc/ssh, /root/.ssh, /etc/munge
or /etc/slurm. Needs root (mount namespaces, slurmd) and the packages of
``launch/cluster/install.sh``.

Usage (a project script; tests import it as a module, tests/cluster/clusterlib.py):
  eval "$(python3 launch/cluster/harness.py up DIR)"   # then: sinfo; srun -N2 hostname; pdsh -w node-a,node-b true
  python3 launch/cluster/harness.py down DIR
  python3 launch/cluster/harness.py check              # can it run here? (root, the programs)
From the command line the daemons outlive ``up``: they are reparented to PID 1, which reaps
them after ``down`` (an init that does not reap leaves dead entries, no running process).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness_conf import slurm_conf, ssh_config, sshd_config  # this script's folder

NODES = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}
DOWN_HOST = ("node-down", "127.0.0.4")
UNKNOWN_KEY_HOST = ("node-unknown", "127.0.0.3")
CTL_ADDR = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
PROGRAMS = ("sshd", "ssh", "ssh-keygen", "pdsh", "munged", "mungekey", "slurmctld", "slurmd",
            "sbatch", "srun", "scontrol", "unshare", "mount")


class HarnessError(RuntimeError):
    """The cluster could not be started or was not left clean; the message says why and where
    the daemons' logs are."""


def _which(prog: str) -> str | None:
    return shutil.which(prog) or next(
        (p for p in (f"/usr/sbin/{prog}", f"/sbin/{prog}") if os.access(p, os.X_OK)), None)


def why_not() -> str | None:
    """The reason the harness cannot run on this machine (str), or None when it can: not root,
    or a program missing (install it with ``bash launch/cluster/install.sh``)."""
    if os.name != "posix" or os.geteuid() != 0:
        return "needs root (mount namespaces, slurmd as root); CI runs as root"
    missing = [p for p in PROGRAMS if _which(p) is None]
    if missing:
        return (f"programs missing: {' '.join(missing)} (run `bash launch/cluster/install.sh` "
                "as root: apt-get install openssh-server pdsh slurmctld slurmd munge)")
    return None


def _free_port(addrs=("127.0.0.1",), taken=()) -> int:
    """A TCP port free on every address of ``addrs`` and not in ``taken`` (probed by binding;
    a small race remains)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((addrs[0], 0))
            port = s.getsockname()[1]
        if port in taken:
            continue
        try:
            for a in addrs[1:]:
                with socket.socket() as s2:
                    s2.bind((a, port))
            return port
        except OSError:
            continue
    raise HarnessError(f"no free port on {addrs}")


def listening_ports() -> set[int]:
    """Local TCP ports in LISTEN state (from /proc/net/tcp and tcp6)."""
    ports = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(f).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, waiting for its parent to reap it, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _procs_in(namespaces: set[str]) -> list[int]:
    mine = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != mine
            and _alive(int(p)) and _mnt_ns(int(p)) in namespaces]


class Cluster:
    """The harness under ``root`` (a directory it creates and, at :meth:`down`, removes).

    ``keep``: more paths the nodes must see at their place although they lie under /tmp.
    Attributes after :meth:`up`: ``env`` (dict of variables to run clients with: PATH with the
    ssh wrapper first, SLURM_CONF, PDSH_RCMD_TYPE=ssh, MASTER_ADDR=127.0.0.2,
    GLOO_SOCKET_IFNAME=lo), ``ssh_port`` (int), ``shared`` (Path: the dir all nodes share).
    """

    def __init__(self, root, keep=()):
        self.root = Path(root).absolute()
        # the path as the jobs will name it (a symlink under /tmp, e.g. a CI checkout's ../shared, is
        # bound at that place; mount --bind follows it to its target) and the target itself
        self.keep = list(dict.fromkeys(q for p in keep for q in (Path(os.path.abspath(p)), Path(p).resolve())))
        self.shared = self.root / "shared"
        self.procs: dict[str, subprocess.Popen | int] = {}
        self.namespaces: set[str] = set()
        self.ports: list[int] = []
        self.created_run_sshd = False
        self.env: dict[str, str] = {}
        self.ssh_port = 0

    # ---- start ----------------------------------------------------------------------------
    def up(self, timeout: float = 60.0) -> "Cluster":
        """Start munge, slurmctld, two slurmd and two sshd; wait until ``sinfo`` shows both
        nodes idle and ``ssh node-a true`` works. Raises HarnessError (with log tails) and
        tears down what it started when a daemon fails."""
        reason = why_not()
        if reason:
            raise HarnessError(reason)
        if self.root.exists() and any(self.root.iterdir()):
            raise HarnessError(f"{self.root} exists and is not empty: give a new directory")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        try:
            self._layout()
            self._start_munge()
            self._start_slurm()
            self._start_sshd()
            self._wait_ready(timeout)
        except BaseException as e:
            tails = self.log_tails()
            try:
                self.down(check=False)
            finally:
                if isinstance(e, HarnessError):
                    raise HarnessError(f"{e}\n{tails}") from None
            raise
        self._save_state()
        return self

    def _layout(self):
        r = self.root
        for d in ("bin", "ssh", "munge", "slurm/state", "shared", "logs",
                  *(f"slurm/spool/{n}" for n in NODES), *(f"nodes/{n}/tmp" for n in NODES)):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)   # munged: clients must reach the socket
        for n in NODES:
            os.chmod(r / f"nodes/{n}/tmp", 0o1777)
        self.ports = []
        self.ssh_port = _free_port(tuple(NODES.values()) + (DOWN_HOST[1],))
        self.ports.append(self.ssh_port)
        self.ctl_port = _free_port((CTL_ADDR,), self.ports)
        self.ports.append(self.ctl_port)
        # both slurmd listen on every address: one port per node
        self.slurmd_ports = {}
        for n, a in NODES.items():
            self.slurmd_ports[n] = _free_port((CTL_ADDR, a), self.ports)
            self.ports.append(self.slurmd_ports[n])
        wrapper = r / "bin" / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F "{r}/ssh/ssh_config" "$@"\n')
        wrapper.chmod(0o755)
        self.env = {
            "PATH": f"{r}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "SLURM_CONF": str(r / "slurm" / "slurm.conf"),
            "PDSH_RCMD_TYPE": "ssh",
            "MASTER_ADDR": NODES["node-a"],
            "GLOO_SOCKET_IFNAME": "lo",
            "TSM_DS_CLUSTER_DIR": str(r),
        }

    def _popen(self, name: str, argv: list[str], node: str | None = None):
        """Start ``argv`` in a new mount namespace (the marker teardown uses to find every
        process of the harness); for a node, /tmp there is the node's private tmp dir."""
        script = ["set -e"]
        if node is not None:
            ntmp = self.root / "nodes" / node / "tmp"
            for k in [self.root, REPO, *self.keep]:
                try:
                    rel = k.relative_to("/tmp")
                except ValueError:
                    continue
                (ntmp / rel).mkdir(parents=True, exist_ok=True)
                script.append(f'mount --bind "{k}" "{ntmp / rel}"')
            script.append(f'mount --rbind "{ntmp}" /tmp')
        script.append('exec "$@"')
        log = open(self.root / "logs" / f"{name}.out", "ab")
        p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "--", "/bin/sh", "-c",
                              "\n".join(script), name, *argv],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, env={**os.environ, **self.env})
        log.close()
        self.procs[name] = p
        for _ in range(100):   # the namespace exists once unshare has run
            ns = _mnt_ns(p.pid)
            if ns and ns != _mnt_ns(os.getpid()):
                self.namespaces.add(ns)
                break
            if p.poll() is not None:
                raise HarnessError(f"{name} exited at once (status {p.returncode}); "
                                   f"see {self.root}/logs/{name}.out")
            time.sleep(0.02)
        return p

    def _start_munge(self):
        m = self.root / "munge"
        subprocess.run([_which("mungekey"), "--create", "--keyfile", str(m / "munge.key")],
                       check=True, capture_output=True)
        os.chmod(m / "munge.key", 0o600)
        self._popen("munged", [_which("munged"), "--foreground", "--force",
                               f"--socket={m}/munge.socket", f"--key-file={m}/munge.key",
                               f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed"])
        _wait(lambda: (m / "munge.socket").exists(), 10, "munged socket", self.procs["munged"])

    def _start_slurm(self):
        s = self.root / "slurm"
        host = socket.gethostname().split(".")[0]
        (s / "slurm.conf").write_text(slurm_conf(
            self.root, host, CTL_ADDR, self.ctl_port,
            {n: (a, self.slurmd_ports[n]) for n, a in NODES.items()}))
        self._popen("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(s / "slurm.conf")])
        for n in NODES:
            self._popen(f"slurmd-{n}", [_which("slurmd"), "-D", "-N", n, "-f",
                                        str(s / "slurm.conf")], node=n)

    def _start_sshd(self):
        d = self.root / "ssh"
        kg = _which("ssh-keygen")
        subprocess.run([kg, "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_ed25519")],
                       check=True)
        subprocess.run([kg, "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id_ed25519")],
                       check=True)
        shutil.copy(d / "id_ed25519.pub", d / "authorized_keys")
        hostkey = (d / "host_ed25519.pub").read_text().split()[:2]
        (d / "known_hosts").write_text("".join(f"{n} {' '.join(hostkey)}\n" for n in NODES))
        if not os.path.isdir("/run/sshd"):   # sshd's privilege-separation dir (Debian path)
            os.makedirs("/run/sshd", mode=0o755)
            self.created_run_sshd = True
        hosts = {**NODES, DOWN_HOST[0]: DOWN_HOST[1], UNKNOWN_KEY_HOST[0]: UNKNOWN_KEY_HOST[1]}
        (d / "ssh_config").write_text(ssh_config(self.root, hosts, self.ssh_port))
        for n, a in NODES.items():
            (d / f"sshd_{n}.conf").write_text(sshd_config(self.root, n, a, self.ssh_port))
            self._popen(f"sshd-{n}", [_which("sshd"), "-D", "-e", "-f", str(d / f"sshd_{n}.conf")],
                        node=n)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        env = self.client_env()
        for name, p in self.procs.items():
            if isinstance(p, subprocess.Popen) and p.poll() is not None:
                raise HarnessError(f"{name} exited with status {p.returncode}")
        while True:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env,
                               capture_output=True, text=True)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in NODES):
                break
            dead = [n for n, p in self.procs.items() if isinstance(p, subprocess.Popen)
                    and p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise HarnessError(f"SLURM nodes not idle after {timeout:.0f} s: sinfo says "
                                   f"{states or r.stderr.strip()}; exited: {dead}")
            time.sleep(0.3)
        for n in NODES:
            while True:
                r = subprocess.run(["ssh", n, "true"], env=env, capture_output=True, text=True)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise HarnessError(f"ssh {n} failed: {r.stderr.strip()}")
                time.sleep(0.2)

    def processes(self) -> dict[int, list[str]]:
        """pid -> argv of every live process in a harness namespace (daemons, job steps and
        tasks, ssh sessions); processes that end while being read are left out."""
        out = {}
        for pid in _procs_in(self.namespaces):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            out[pid] = [a.decode(errors="replace") for a in argv]
        return out

    def client_env(self) -> dict[str, str]:
        """os.environ with the harness variables (:attr:`env`) on top: run clients with it."""
        return {**os.environ, **self.env}

    def log_tails(self, lines: int = 15) -> str:
        """The last ``lines`` lines of every daemon log (str), for an error message."""
        out = []
        logs = self.root / "logs"
        for f in sorted(logs.glob("*")) if logs.is_dir() else []:
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(out)

    def _save_state(self):
        state = {"pids": {n: (p.pid if isinstance(p, subprocess.Popen) else p)
                          for n, p in self.procs.items()},
                 "namespaces": sorted(self.namespaces), "ports": self.ports,
                 "created_run_sshd": self.created_run_sshd, "env": self.env,
                 "ssh_port": self.ssh_port}
        (self.root / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, root) -> "Cluster":
        """The cluster that ``up`` started under ``root`` (from ``root/state.json``)."""
        c = cls(root)
        state = json.loads((c.root / "state.json").read_text())
        c.procs = dict(state["pids"])
        c.namespaces = set(state["namespaces"])
        c.ports = state["ports"]
        c.created_run_sshd = state["created_run_sshd"]
        c.env = state["env"]
        c.ssh_port = state["ssh_port"]
        return c

    # ---- stop -----------------------------------------------------------------------------
    def down(self, check: bool = True, timeout: float = 20.0) -> None:
        """Stop every daemon by PID, then any process left in a harness namespace (job steps,
        ssh sessions), remove DIR. With ``check``: raise HarnessError naming what is left (a
        process, a listening port, a file) instead of passing silently."""
        def pid_of(p):
            return p.pid if isinstance(p, subprocess.Popen) else int(p)
        # sshd first (no new sessions), slurmd before slurmctld, munge last
        order = sorted(self.procs, key=lambda n: ("sshd" not in n, "slurmd" not in n,
                                                   n == "munged"))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for name in order:
                pid = pid_of(self.procs[name])
                if _alive(pid):
                    _kill(pid, sig)
            for pid in _procs_in(self.namespaces):   # job steps, ssh sessions, stepds
                _kill(pid, sig)
            # daemons get ``timeout`` to save their state; slurmstepd ignores SIGTERM: the
            # processes of jobs and sessions get 3 s before SIGKILL
            start = time.monotonic()
            while True:
                for p in self.procs.values():
                    if isinstance(p, subprocess.Popen):
                        p.poll()   # reap our own children
                daemons = [n for n, p in self.procs.items() if _alive(pid_of(p))]
                others = set(_procs_in(self.namespaces)) - {pid_of(p) for p in self.procs.values()}
                waited = time.monotonic() - start
                if (not daemons and not others) or waited > (timeout if sig == signal.SIGTERM else 5) \
                        or (not daemons and waited > 3):
                    break
                time.sleep(0.1)
        left = []
        left += [f"process {n} (pid {pid_of(p)})" for n, p in self.procs.items()
                 if _alive(pid_of(p))]
        left += [f"process pid {pid} in a harness namespace" for pid in _procs_in(self.namespaces)]
        lingering = set(self.ports) & listening_ports()
        if lingering:   # a port in TIME_WAIT is not LISTEN; a listener can take a moment to close
            time.sleep(1)
            lingering = set(self.ports) & listening_ports()
        left += [f"listening port {p}" for p in sorted(lingering)]
        if self.created_run_sshd and os.path.isdir("/run/sshd"):
            try:
                os.rmdir("/run/sshd")
            except OSError as e:
                left.append(f"/run/sshd ({e})")
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                left.append(f"files under {self.root}")
        if check and left:
            raise HarnessError("harness teardown left: " + "; ".join(left))


def _kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait(cond, timeout, what, proc=None):
    end = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise HarnessError(f"{what}: the daemon exited with status {proc.returncode}")
        if time.monotonic() > end:
            raise HarnessError(f"{what}: not ready after {timeout} s")
        time.sleep(0.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down", "check"],
                    help="up: start under DIR; down: stop and remove DIR; check: can it run here")
    ap.add_argument("dir", nargs="?", help="a new (or empty) directory for everything")
    ap.add_argument("--keep", action="append", default=[],
                    help="a path under /tmp the nodes must still see (repeatable)")
    a = ap.parse_args(argv)
    if a.action == "check":
        reason = why_not()
        print(reason or "ok")
        return 1 if reason else 0
    if not a.dir:
        ap.error("DIR is required")
    try:
        if a.action == "up":
            c = Cluster(a.dir, keep=a.keep).up()
            for k, v in c.env.items():
                print(f"export {k}={shlex.quote(v)}")
        else:
            Cluster.load(a.dir).down()
            print(f"stopped; {a.dir} removed")
    except HarnessError as e:
        print(f"harness {a.action}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
