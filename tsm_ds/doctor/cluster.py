"""Doctor section ``cluster`` (``tsm-ds doctor --hostfile H``): can a hostfile launch start here?

For every host of the hostfile (DeepSpeed's format: ``<host> slots=<ranks>`` per line), over ssh
as DeepSpeed's launcher uses it (``ssh -o BatchMode=yes [-p PORT] HOST``, no password prompt):

- ``ssh``: the host answers and logs in (ssh's own error shown: "Connection refused",
  "Permission denied (publickey)", "Could not resolve hostname" ...);
- ``host key``: known to this host ("Host key verification failed." otherwise);
- ``python``: the launcher starts every rank with this host's interpreter path
  (``sys.executable``): it must exist there with the same torch / deepspeed / tsm_ds versions;
- ``master address``: MASTER_ADDR resolves on that host;
- ``run dir``: the run dir (training's ``--output-dir``) is writable there and shared: a token
  written by each host is read by the next one (a ring), then removed;
- ``master port`` (first host only): MASTER_PORT can be bound there on MASTER_ADDR's address
  (not checked when that name does not resolve: the ``master address`` row alone says so; a
  failed bind says whether another process holds the port or the address is not that host's);

and once for the launching host: ``pdsh`` is installed (DeepSpeed's launcher needs it for
several hosts). When every check passed, ``all-reduce``: every rank of the hostfile (``slots``
per host) joins one process group (gloo; NCCL on CUDA hosts) on a free port of the first host
and sums ``rank + 1`` once: the result must be ``W (W + 1) / 2`` on every rank.

Rows: ``{"host", "check", "status": "ok" | "failed" | "skipped", "detail", "fix"}``; any failed
row fails the section (the command exits 1). Values: ``hosts``, ``ranks``, ``failed_checks``
(count), ``allreduce_sum`` (None when not run), ``master_addr``, ``master_port``.

The hostfile's parsing, the ssh command line and the advice per ssh error are
:mod:`tsm_ds.utils.hosts`' (the launch scripts use them too); fixes name each option as the launch
scripts spell it (``--master_addr``) and as this command does (``--master-addr``).

Settings (``DoctorSettings.extra``): ``hostfile`` (required), ``ssh_port``, ``master_addr``
(default the first host), ``master_port`` (default: none checked), ``run_dir`` (default the
doctor's ``--out``), ``timeout`` (seconds per remote step, default 60).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tsm_ds.doctor.core import Context, section_result

# the hostfile and ssh's advice are the launch scripts' too (python -m tsm_ds.cli.launch_helper)
from tsm_ds.utils.hosts import classify_ssh_error, last_lines, read_hostfile, ssh_argv

__all__ = ["run", "read_hostfile", "classify_ssh_error", "ssh_argv"]

# runs on each host from stdin: versions (package metadata: no torch import), the master address,
# the run-dir token, the master port. argv: run_dir token_name token_text master_addr port_or_0
_PROBE = r"""
import errno, json, os, shutil, socket, sys
from importlib import metadata
run_dir, name, text, addr, port = sys.argv[1:6]
out = {"python": sys.executable, "hostname": socket.gethostname(), "pdsh": shutil.which("pdsh")}
for pkg in ("torch", "deepspeed", "tsm_ds"):
    try:
        out[pkg] = metadata.version(pkg)
    except metadata.PackageNotFoundError:
        out[pkg] = None
try:
    out["addr"] = socket.gethostbyname(addr)
except OSError as e:
    out["addr_error"] = f"{type(e).__name__}: {e}"
try:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, name), "w") as f:
        f.write(text)
    out["wrote"] = True
except OSError as e:
    out["write_error"] = f"{type(e).__name__}: {e}"
if int(port) and "addr" in out:   # a name that does not resolve has no port to check
    try:
        with socket.socket() as s:
            s.bind((out["addr"], int(port)))
        out["port_free"] = True
    except OSError as e:
        out["port_error"] = f"{type(e).__name__}: {e}"
        out["port_errno"] = errno.errorcode.get(e.errno or 0, "")
with socket.socket() as s:   # a port for the all-reduce, free now
    s.bind(("", 0))
    out["spare_port"] = s.getsockname()[1]
print("TSM_DS_PROBE " + json.dumps(out), flush=True)
"""

# runs on each host from stdin: `slots` ranks from rank `base`, one all-reduce. argv: addr port base slots world timeout
_ALLREDUCE = r"""
import os, sys
from datetime import timedelta
from multiprocessing import get_context
addr, port, base, slots, world, timeout = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6]), float(sys.argv[6])
def one(rank, local):
    import torch, torch.distributed as dist
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    t = torch.tensor([float(rank + 1)], device=f"cuda:{local}" if cuda else "cpu")
    dist.all_reduce(t)
    print(f"TSM_DS_ALLREDUCE rank={rank} sum={t.item():.0f}", flush=True)
    dist.destroy_process_group()
procs = [get_context("fork").Process(target=one, args=(base + i, i)) for i in range(slots)]
for p in procs:
    p.start()
for p in procs:
    p.join()
sys.exit(max(abs(p.exitcode or 0) for p in procs))
"""

_FORWARD = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR")


def _ssh(host: str, port: int | None, timeout: float, command: str, stdin: str = "") -> subprocess.CompletedProcess:
    try:
        return subprocess.run(ssh_argv(host, port, timeout) + [command], input=stdin, capture_output=True,
                              text=True, timeout=timeout + 20)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", f"no answer within {timeout + 20:.0f} s")


def _remote_python(cwd: str, py: str, args: list[str], env: dict[str, str]) -> str:
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (f"cd {shlex.quote(cwd)} 2>/dev/null; {'env ' + exports + ' ' if exports else ''}"
            f"{shlex.quote(py)} - {' '.join(shlex.quote(a) for a in args)}")


def _row(host, check, status, detail="", fix="") -> dict[str, Any]:
    return {"host": host, "check": check, "status": status, "detail": detail, "fix": fix}


# the options as the launch scripts and this command spell them (both read the variables too)
_MASTER_ADDR_OPTS = "launch scripts: --master_addr, tsm-ds doctor: --master-addr"
_MASTER_PORT_OPTS = "launch scripts: --master_port, tsm-ds doctor: --master-port"


def _port_row(h: str, master: str, master_port: int, d: dict) -> dict[str, Any]:
    """The ``master port`` row of the first host from its probe ``d``: checked only once MASTER_ADDR
    resolved there (else skipped: the ``master address`` row says why); a failed bind says whether
    the port is taken or the address is not this host's."""
    if "addr_error" in d:
        return _row(h, "master port", "skipped", f"not checked: {master} does not resolve on {h}")
    if d.get("port_free"):
        return _row(h, "master port", "ok", f"{master}:{master_port} free")
    err = d.get("port_error", "?")
    if d.get("port_errno") == "EADDRINUSE":
        fix = (f"another process holds port {master_port} on {h}: pick another MASTER_PORT "
               f"({_MASTER_PORT_OPTS}), or stop it")
    elif d.get("port_errno") == "EADDRNOTAVAIL":
        fix = (f"{master} ({d.get('addr')}) is not an address of {h}, where rank 0 listens: set MASTER_ADDR to an "
               f"address of the first host ({_MASTER_ADDR_OPTS})")
    else:
        fix = f"port {master_port} cannot be bound on {h}: pick another MASTER_PORT ({_MASTER_PORT_OPTS})"
    return _row(h, "master port", "failed", err, fix)


def run(ctx: Context, results: dict) -> dict:
    """The ``cluster`` section (see the module docstring).

    Raises:
        ValueError: no ``hostfile`` in ``ctx.settings.extra`` or a malformed hostfile.
    """
    extra = ctx.settings.extra
    if not extra.get("hostfile"):
        raise ValueError("the cluster section needs --hostfile")
    hosts = read_hostfile(extra["hostfile"])
    port = int(extra["ssh_port"]) if extra.get("ssh_port") else None
    timeout = float(extra.get("timeout") or 60)
    master = extra.get("master_addr") or hosts[0][0]
    master_port = int(extra.get("master_port") or 0)
    run_dir = os.path.abspath(extra.get("run_dir") or str(ctx.out))
    cwd, py = os.getcwd(), sys.executable
    env = {k: os.environ[k] for k in _FORWARD if os.environ.get(k)}
    local = {pkg: _pkg_version(pkg) for pkg in ("torch", "deepspeed", "tsm_ds")}
    token = uuid.uuid4().hex[:12]
    names = {h: f".tsm_ds_doctor_{token}_{i}" for i, (h, _) in enumerate(hosts)}
    rows: list[dict[str, Any]] = []
    pdsh = shutil.which("pdsh")
    rows.append(_row("(this host)", "pdsh", "ok" if pdsh or len(hosts) == 1 else "failed",
                     pdsh or "not installed", "" if pdsh else "apt-get install pdsh (or: yum install pdsh)"))
    ctx.progress.note(f"probing {len(hosts)} host(s) over ssh")

    def probe(i_host):
        i, (h, _) = i_host
        args = [run_dir, names[h], f"{token} {h}", master, str(master_port if i == 0 else 0)]
        return _ssh(h, port, timeout, _remote_python(cwd, py, args, {}), _PROBE)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        probes = list(pool.map(probe, enumerate(hosts)))
    info: dict[str, dict] = {}
    for (h, _), p in zip(hosts, probes):
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("TSM_DS_PROBE ")), None)
        if p.returncode == 255 or (line is None and p.returncode in (124,)):
            check, fix = classify_ssh_error(p.stderr, h, port)
            err = last_lines(p.stderr) or f"ssh exit status {p.returncode}"
            if check == "host key":
                rows.append(_row(h, "ssh", "skipped", "sshd answered; the login stopped at the host key check"))
                rows.append(_row(h, "host key", "failed", err, fix))
            else:
                rows.append(_row(h, "ssh", "failed", err, fix))
                rows.append(_row(h, "host key", "skipped", "not checked: no connection"))
            continue
        rows.append(_row(h, "ssh", "ok", "logged in without a prompt"))
        rows.append(_row(h, "host key", "ok", "known"))
        if line is None:
            rows.append(_row(h, "python", "failed", last_lines(p.stderr) or f"exit status {p.returncode}",
                             f"the launcher runs {py} on every host: install the same venv at the same path "
                             "there (bash launch/setup.sh), or share it"))
            continue
        info[h] = d = json.loads(line.split(" ", 1)[1])
        diff = [f"{k} {d.get(k)} (here {local[k]})" for k in local if d.get(k) != local[k]]
        rows.append(_row(h, "python", "failed" if diff else "ok",
                         "; ".join(diff) if diff else f"{d['python']}: torch {d['torch']}, deepspeed "
                         f"{d['deepspeed']}, tsm_ds {d['tsm_ds']}",
                         "install the same versions on every host (bash launch/setup.sh from the same "
                         "checkout), or share the venv" if diff else ""))
        rows.append(_row(h, "master address", "failed" if "addr_error" in d else "ok",
                         f"{master} does not resolve on {h}: {d['addr_error']}" if "addr_error" in d
                         else f"{master} -> {d.get('addr')}",
                         f"set MASTER_ADDR to an address of the first host that every host reaches (an IP, or a "
                         f"name in DNS / /etc/hosts of every host; {_MASTER_ADDR_OPTS})" if "addr_error" in d else ""))
        rows.append(_row(h, "run dir", "ok" if d.get("wrote") else "failed",
                         f"wrote {run_dir}" if d.get("wrote") else d.get("write_error", "?"),
                         "" if d.get("wrote") else f"make {run_dir} writable on {h} (it must be the same shared "
                         "filesystem on every host: checkpoints are written by every rank)"))
        if h == hosts[0][0] and master_port:
            rows.append(_port_row(h, master, master_port, d))
    # shared: each host reads the token of the host before it (a ring)
    writers = [h for h, _ in hosts if info.get(h, {}).get("wrote")]
    if len(writers) >= 2:
        def read(i):
            h, prev = writers[i], writers[i - 1]
            path = os.path.join(run_dir, names[prev])
            return _ssh(h, port, timeout, f"cat {shlex.quote(path)}")
        with ThreadPoolExecutor(max_workers=min(32, len(writers))) as pool:
            reads = list(pool.map(read, range(len(writers))))
        for i, r in enumerate(reads):
            h, prev = writers[i], writers[i - 1]
            ok = r.returncode == 0 and r.stdout.strip() == f"{token} {prev}"
            rows.append(_row(h, "run dir shared", "ok" if ok else "failed",
                             f"read the file {prev} wrote" if ok else
                             f"the file {prev} wrote in {run_dir} is not there: {last_lines(r.stderr) or 'empty'}",
                             "" if ok else f"{run_dir} must be one shared filesystem (NFS, Lustre ...) mounted at the "
                             "same path on every host; use a run dir there (training's --output-dir, --run-dir)"))
    elif writers:
        rows.append(_row(writers[0], "run dir shared", "skipped",
                         "one host: nothing to share with" if len(hosts) == 1 else "no other host wrote its file"))
    # the all-reduce, when nothing failed so far
    failed_before = [r for r in rows if r["status"] == "failed"]
    world = sum(s for _, s in hosts)
    total = None
    spare = info.get(hosts[0][0], {}).get("spare_port")
    if failed_before or not spare:
        rows.append(_row("(all ranks)", "all-reduce", "skipped",
                         f"not run: {len(failed_before)} check(s) above failed" if failed_before else "no port"))
    else:
        ctx.progress.note(f"one all-reduce over {world} ranks")
        bases = [sum(s for _, s in hosts[:i]) for i in range(len(hosts))]

        def allreduce(i):
            h, slots = hosts[i]
            args = [master, str(spare), str(bases[i]), str(slots), str(world), str(timeout)]
            return _ssh(h, port, timeout, _remote_python(cwd, py, args, env), _ALLREDUCE)

        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            outs = list(pool.map(allreduce, range(len(hosts))))
        sums = {int(m.group(1)): int(m.group(2)) for p in outs
                for m in re.finditer(r"TSM_DS_ALLREDUCE rank=(\d+) sum=(\d+)", p.stdout)}
        want = world * (world + 1) // 2
        bad = [f"{h}: exit {p.returncode}: {last_lines(p.stderr, 2)}" for (h, _), p in zip(hosts, outs)
               if p.returncode != 0]
        ok = len(sums) == world and set(sums.values()) == {want}
        total = want if ok else None
        rows.append(_row("(all ranks)", "all-reduce", "ok" if ok else "failed",
                         f"{world} ranks summed rank+1 = {want} on {master}:{spare}" if ok else
                         f"{len(sums)} of {world} ranks finished, sums {sorted(set(sums.values()))} (want {want}); "
                         + "; ".join(bad),
                         "" if ok else "every host must reach MASTER_ADDR's port: set MASTER_ADDR to the first "
                         "host's address on the interface the hosts share and GLOO_SOCKET_IFNAME / "
                         "NCCL_SOCKET_IFNAME to that interface; open the ports between the hosts"))
    for h in writers:   # remove the tokens (the run dir is shared: one host suffices when it is)
        _ssh(h, port, timeout, f"rm -f {shlex.quote(os.path.join(run_dir, names[h]))}")
    failed = [r for r in rows if r["status"] == "failed"]
    summary = (f"{len(hosts)} host(s), {world} rank(s): every check passed, all-reduce sum {total}" if not failed
               else f"{len(failed)} check(s) failed: " + "; ".join(f"{r['host']} {r['check']}" for r in failed[:6]))
    notes = ["the all-reduce uses gloo (NCCL where CUDA is available) on a spare port of the first host; "
             "the training port (--master-port) is only checked to be free"]
    return section_result("cluster", status="failed" if failed else "ok", summary=summary, rows=rows, notes=notes,
                          values={"hosts": [h for h, _ in hosts], "ranks": world, "failed_checks": len(failed),
                                  "allreduce_sum": total, "master_addr": master, "master_port": master_port or None})


def _pkg_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
