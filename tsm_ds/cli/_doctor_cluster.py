"""The ``tsm-ds doctor`` options of the cluster section (:mod:`tsm_ds.bench.doctor.cluster`):
``--hostfile`` and what the launch needs besides it, and the table of failed checks it prints.

``tsm-ds doctor --hostfile H`` runs only the cluster section unless ``--only`` says otherwise (the
preflight the launch scripts run before ``deepspeed``; the measurements take minutes).
"""
from __future__ import annotations

import argparse
import os


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Add the cluster section's options to the doctor's parser."""
    c = p.add_argument_group("cluster preflight (before a hostfile launch)")
    c.add_argument("--hostfile", help="DeepSpeed hostfile ('<host> slots=<ranks>' lines): check every host "
                                      "(ssh, host key, python and versions, shared run dir, master port, pdsh) "
                                      "and run one all-reduce over all ranks; alone, runs only this section")
    c.add_argument("--ssh-port", type=int, default=os.environ.get("SSH_PORT") or None,   # argparse converts (and checks) it
                   help="ssh port of the hosts (default $SSH_PORT, else ssh's own)")
    c.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR"),
                   help="rank 0's address (default $MASTER_ADDR, else the first host)")
    c.add_argument("--master-port", type=int, default=os.environ.get("MASTER_PORT") or None,
                   help="training's port, checked free on the first host (default $MASTER_PORT)")
    c.add_argument("--run-dir", help="a folder every host must share: training's --output-dir (default --out)")
    c.add_argument("--cluster-timeout", type=float, default=60.0,
                   help="seconds per remote step (ssh probe, all-reduce)")


def apply_cluster_args(settings, args: argparse.Namespace) -> None:
    """Copy the options into ``settings.extra``; with ``--hostfile`` and no ``--only``, run only
    the cluster section."""
    if not args.hostfile:
        return
    settings.extra.update(hostfile=args.hostfile, ssh_port=args.ssh_port, master_addr=args.master_addr,
                          master_port=args.master_port, run_dir=args.run_dir, timeout=args.cluster_timeout)
    if not settings.only:
        settings.only = ("cluster",)


def print_cluster_failures(report: dict) -> None:
    """Print the cluster section's failed checks as a table: host, check, what happened, the fix."""
    sec = (report or {}).get("sections", {}).get("cluster")
    if not sec:
        return
    failed = [r for r in sec["rows"] if r["status"] == "failed"]
    if not failed:
        return
    print("\ncluster checks that failed:")
    w = max(len(r["host"]) for r in failed)
    for r in failed:
        print(f"  {r['host']:<{w}}  {r['check']:<15} {r['detail']}")
        print(f"  {'':<{w}}  {'fix:':<15} {r['fix']}")
