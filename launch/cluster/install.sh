#!/usr/bin/env bash
# Install the system packages of the cluster tests (tests/cluster, marker `cluster`):
# openssh-server, openssh-client, pdsh, slurmctld + slurmd + slurm-client, munge.
# Idempotent: returns at once when every program is present. Installs only as root with
# apt-get, and only under CI=true or with TSM_DS_CLUSTER_INSTALL=1 (openssh-server would also
# enable a system sshd on a person's machine); otherwise it prints why not and returns 0: the
# cluster tests then skip with that reason (under CI=true they fail instead). No daemon is started, no global config is
# edited: launch/cluster/harness.py runs its own daemons under a temp dir.
#   bash launch/cluster/install.sh          # prints the time it took
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR == 1 && /^#!/ { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0;; esac
need=(sshd ssh ssh-keygen pdsh slurmctld slurmd sbatch srun scontrol munged mungekey)
missing=()
for p in "${need[@]}"; do
  command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "cluster packages: present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "cluster packages: missing ${missing[*]}; not installed (needs root and apt-get);" \
       "the cluster tests will skip" >&2
  exit 0
fi
# on a person's own machine, installing openssh-server enables a system sshd (port 22) at boot:
# only CI (CI=true) or an explicit TSM_DS_CLUSTER_INSTALL=1 installs
case "${CI:-}${TSM_DS_CLUSTER_INSTALL:-}" in
  "" | false | 0)
    echo "cluster packages: missing ${missing[*]}; the cluster tests will skip." \
         "Install with: TSM_DS_CLUSTER_INSTALL=1 bash launch/cluster/install.sh" >&2
    exit 0 ;;
esac
start=$(date +%s)
# no service may start during the install (a container has no init; a host keeps its own):
# Debian's invoke-rc.d asks /usr/sbin/policy-rc.d, which a Docker image already has
added_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  added_policy=1
fi
trap 'if [ -n "$added_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || echo "apt-get update failed; trying the cached lists" >&2
apt-get install -y -qq --no-install-recommends \
  openssh-server openssh-client pdsh slurmctld slurmd slurm-client munge >/dev/null
echo "cluster packages: installed in $(( $(date +%s) - start )) s"
