#!/usr/bin/env bash
# Several machines listed in a hostfile (launch/hostfile.example); run it on the first host.
#   bash launch/train_multi_node.sh --hostfile hosts --ssh_port 2222 -- \
#       --data /shared/k400/videos --arch resnet50 --output-dir /shared/runs
# DeepSpeed's launcher reaches every host by ssh through pdsh (required: apt-get install pdsh)
# and starts the hostfile's `slots` ranks on each. Before it does, this script checks that every
# host answers ssh without a prompt (ssh's own error is shown; NO_SSH_CHECK=1 skips), picks a
# port free on the first host (MASTER_PORT to choose), sets MASTER_ADDR to the first host
# (MASTER_ADDR to choose the interface's address) and writes the environment of every rank (venv
# PATH, op cache, DS_ACCELERATOR, threads, GLOO/NCCL_SOCKET_IFNAME, TSM_DS_*, your
# ~/.deepspeed_env / ./.deepspeed_env / $TSM_DS_ENV_FILE) to a file the launcher exports on every
# host. Then `tsm-ds doctor --hostfile` checks every host (versions, shared run dir, port, a
# one-step all-reduce; SKIP_DOCTOR=1 skips it). Every host needs the repo and venv at the same
# path; --output-dir must be shared.
# Launcher options: --hostfile --ssh_port --include --exclude --master_addr --master_port
# --num_nodes --launcher, then '--' and train.py's flags.
# Without ssh (each node started by something else): NODE_RANK=k MASTER_ADDR=node0 on every node.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$TSM_DS_ROOT"
tsm_parse_args "$@"
HOSTFILE=${HOSTFILE:?set HOSTFILE or --hostfile (see launch/hostfile.example)}
HOSTFILE=$(cd "$(dirname "$HOSTFILE")" && pwd)/$(basename "$HOSTFILE")
tsm_setup_env
tsm_prebuild_op
mapfile -t HOSTS < <(tsm_hostfile_hosts "$HOSTFILE")
[ "${#HOSTS[@]}" -gt 0 ] || tsm_die "hostfile $HOSTFILE lists no host"
export TSM_DS_HOSTS=$(IFS=,; echo "${HOSTS[*]}")   # named by the rendezvous when a rank is missing
RPN=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^slots=/) { sub("slots=", "", $i); print $i; exit } }' \
      <(sed 's/#.*//' "$HOSTFILE"))
tsm_set_threads "${RPN:-1}"
CONFIG=${CONFIG:-$([ "${DS_ACCELERATOR:-}" = cpu ] && echo cpu_fp32 || echo gpu_fp16)}
launcher=(deepspeed --hostfile "$HOSTFILE")
[ -n "${SSH_PORT:-}" ] && launcher+=(--ssh_port "$SSH_PORT")
ENV_FILE=$(mktemp "${TMPDIR:-/tmp}/tsm_ds_env.XXXXXX")
trap 'rm -f "$ENV_FILE"' EXIT
tsm_write_env_file "$ENV_FILE"   # checks your env files first: a bad line stops here, naming file:line
if [ -n "${NODE_RANK:-}" ]; then   # no ssh: this node only, its variables from this shell
  MASTER_PORT=${MASTER_PORT:-29500}
  tsm_source_env_file "$ENV_FILE"
  launcher+=(--no_ssh --node_rank "$NODE_RANK" --master_addr "${MASTER_ADDR:?set MASTER_ADDR to node 0}")
else
  [ "${#HOSTS[@]}" -eq 1 ] || command -v pdsh >/dev/null \
    || tsm_die "pdsh is not installed: DeepSpeed's launcher needs it to start ranks on several hosts (apt-get install pdsh; or --launcher openmpi)"
  [ -n "${NO_SSH_CHECK:-}" ] || tsm_check_ssh "$HOSTFILE"
  [ -n "${NO_SSH_CHECK:-}" ] && launcher+=(--no_ssh_check)
  MASTER_ADDR=${MASTER_ADDR:-${HOSTS[0]}}
  MASTER_PORT=${MASTER_PORT:-$( [ -n "${NO_SSH_CHECK:-}" ] && tsm_free_port || tsm_free_port "${HOSTS[0]}")}
  if [ -z "${SKIP_DOCTOR:-}" ] && [ -z "${NO_SSH_CHECK:-}" ]; then   # preflight (tsm-ds doctor --hostfile); SKIP_DOCTOR=1 skips it
    "$TSM_DS_VENV/bin/python" -m tsm_ds.cli doctor --hostfile "$HOSTFILE" --master-addr "$MASTER_ADDR" \
      --master-port "$MASTER_PORT" ${SSH_PORT:+--ssh-port "$SSH_PORT"} --out "$(tsm_run_dir)/doctor" --no-progress \
      || tsm_die "the cluster preflight failed: see the table above (SKIP_DOCTOR=1 skips it)"
  fi
  export DS_ENV_FILE=$ENV_FILE   # DeepSpeed's launcher exports its NAME=VALUE lines on every host
  launcher+=(--master_addr "$MASTER_ADDR")
fi
launcher+=(--master_port "$MASTER_PORT" "${LAUNCH_OPTS[@]}")
tsm_log "hosts ${HOSTS[*]}; MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT; recipe $CONFIG"
# not exec: the trap removes the env file when the launcher ends (it reads it at start-up)
"${launcher[@]}" tsm_ds/train.py --deepspeed_config "$CONFIG" --resume auto "${TRAIN_ARGS[@]}"
