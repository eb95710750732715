"""The ``tsm-ds doctor`` cluster section's options (:mod:`tsm_ds.doctor.cluster`): what
``--hostfile`` and the launch need besides it go into the doctor's settings, and the table of
failed checks it prints.

The options themselves are the ``cluster`` section of the configuration tree
(:class:`tsm_ds.config.tools.ClusterCheckConfig`: ``--hostfile``, ``--ssh-port`` /
``--master-addr`` / ``--master-port`` with ``$SSH_PORT`` / ``$MASTER_ADDR`` / ``$MASTER_PORT`` as
their defaults, ``--run-dir``, ``--cluster-timeout``). ``tsm-ds doctor --hostfile H`` runs only
the cluster section unless ``--only`` says otherwise (the preflight the launch scripts run before
``deepspeed``; the measurements take minutes).
"""
from __future__ import annotations

from tsm_ds.config.tools import ClusterCheckConfig


def apply_cluster_options(settings, cluster: ClusterCheckConfig) -> None:
    """Copy the ``cluster`` section into ``settings.extra`` (a
    :class:`tsm_ds.doctor.DoctorSettings`); with ``--hostfile`` and no ``--only``, run only
    the cluster section. Without ``--hostfile`` nothing changes."""
    if not cluster.hostfile:
        return
    settings.extra.update(hostfile=cluster.hostfile, ssh_port=cluster.ssh_port, master_addr=cluster.master_addr,
                          master_port=cluster.master_port, run_dir=cluster.run_dir, timeout=cluster.timeout)
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
