"""The configuration files of launch/cluster/harness.py: slurm.conf, one sshd config per node,
the client's ssh_config. Text only; every path lies under the harness directory ``root``."""
from __future__ import annotations

from pathlib import Path


def slurm_conf(root: Path, ctl_host: str, ctl_addr: str, ctl_port: int, nodes: dict[str, tuple[str, int]]) -> str:
    """slurm.conf for slurmctld on ``ctl_host`` (``ctl_addr``:``ctl_port``) and one slurmd per
    ``nodes`` entry ``name -> (NodeAddr, port)``: 1 CPU each (threads = cores / ranks gives 1),
    root as SlurmUser, munge on the harness socket, no cgroups (proctrack/pgid, task/none),
    TmpFS=/tmp (each node's private /tmp), no accounting."""
    s = root / "slurm"
    node_lines = "\n".join(f"NodeName={n} NodeAddr={a} NodeHostname={n} Port={p} CPUs=1 RealMemory=1000 State=UNKNOWN"
                           for n, (a, p) in nodes.items())
    return f"""# written by launch/cluster/harness.py
ClusterName=tsmds
SlurmctldHost={ctl_host}({ctl_addr})
SlurmctldPort={ctl_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={s}/state
SlurmdSpoolDir={s}/spool/%n
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/spool/%n/slurmd.pid
SlurmctldLogFile={root}/logs/slurmctld.log
SlurmdLogFile={root}/logs/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
TmpFS=/tmp
KillWait=5
MinJobAge=60
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
{node_lines}
PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def ssh_config(root: Path, hosts: dict[str, str], port: int) -> str:
    """The client's config (the ``ssh`` wrapper's ``-F``): each name of ``hosts`` (name -> address)
    under its own host-key alias, the harness key pair and known_hosts, batch mode."""
    d = root / "ssh"
    return "".join(f"Host {n}\n  HostName {a}\n  HostKeyAlias {n}\n" for n, a in hosts.items()) + f"""
Host *
  Port {port}
  User root
  IdentityFile {d}/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile {d}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
"""


def sshd_config(root: Path, node: str, addr: str, port: int) -> str:
    """sshd's config for ``node``: listens on ``addr``:``port`` only, the harness host key and
    authorized_keys, keys only, no PAM; sessions get ``TSM_DS_CLUSTER_NODE=<node>``."""
    d = root / "ssh"
    return f"""# written by launch/cluster/harness.py
ListenAddress {addr}:{port}
HostKey {d}/host_ed25519
AuthorizedKeysFile {d}/authorized_keys
PidFile {d}/sshd_{node}.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel INFO
SetEnv TSM_DS_CLUSTER_NODE={node}
"""
