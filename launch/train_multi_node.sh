#!/usr/bin/env bash
# Several machines listed in a hostfile (launch/hostfile.example); run it on the first host.
#   bash launch/train_multi_node.sh --hostfile hosts --ssh_port 2222 -- \
#       --data /shared/k400/videos --arch resnet50 --output-dir /shared/runs
# Launcher options: --hostfile FILE, --ssh_port PORT, --master_addr ADDR, --master_port PORT,
# --include / --exclude / --num_nodes / --launcher (DeepSpeed's), then '--' and train.py's flags
# (python -m tsm_ds.train --help). Any other option before '--' stops the script, naming these.
# DeepSpeed's launcher reaches every host by ssh through pdsh (required: apt-get install pdsh)
# and starts the hostfile's `slots` ranks on each. Before it does, this script checks that every
# host answers ssh without a prompt (ssh's own error and the fix are shown; NO_SSH_CHECK=1 skips),
# picks a port free on the first host (MASTER_PORT to choose), sets MASTER_ADDR to the first host
# (MASTER_ADDR to choose the interface's address) and writes the environment of every rank (venv
# PATH, op cache, DS_ACCELERATOR, threads, GLOO/NCCL_SOCKET_IFNAME, TSM_DS_*, your
# ~/.deepspeed_env / ./.deepspeed_env / $TSM_DS_ENV_FILE) to a file the launcher exports on every
# host. Then `tsm-ds doctor --hostfile` checks every host (versions, shared run dir, MASTER_ADDR,
# the port, a one-step all-reduce; SKIP_DOCTOR=1 skips it). Every host needs the repo and venv at
# the same path; --output-dir must be shared.
# Exit status: the launcher's. With several hosts that is pdsh's: 255 when ssh could not reach a
# host (the ranks' own statuses are pdsh's "ssh exited with exit code N" lines); the script ends
# with one line saying what the status means.
# Without ssh (each node started by something else): NODE_RANK=k MASTER_ADDR=node0 on every node.
set -euo pipefail
source "$(dirname "$0")/common.sh"
if tsm_help_requested "$@"; then tsm_usage "$0"; exit 0; fi
cd "$TSM_DS_ROOT"
tsm_setup_env
tsm_parse_args multi "$@"
[ -n "${HOSTFILE:-}" ] || tsm_die "no hostfile: give --hostfile FILE or set HOSTFILE (one line per host: '<host> slots=<ranks>', launch/hostfile.example; --help for the options)"
HOSTFILE=$(cd "$(dirname "$HOSTFILE")" && pwd)/$(basename "$HOSTFILE")
tsm_prebuild_op
HOSTS_TEXT=$(tsm_hostfile_hosts "$HOSTFILE")   # a malformed hostfile stops here, naming file:line
mapfile -t HOSTS <<< "$HOSTS_TEXT"
export TSM_DS_HOSTS=$(IFS=,; echo "${HOSTS[*]}")   # named by the rendezvous when a rank is missing
RPN=$(tsm_helper slots "$HOSTFILE")                # this (the first) host's ranks
tsm_set_threads "$RPN"
CONFIG=${CONFIG:-$(tsm_default_recipe)}
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
    RUN_DIR=$(tsm_run_dir)   # training's --output-dir (a flag train.py would refuse stops here)
    "$TSM_DS_VENV/bin/python" -m tsm_ds.cli doctor --hostfile "$HOSTFILE" --master-addr "$MASTER_ADDR" \
      --master-port "$MASTER_PORT" ${SSH_PORT:+--ssh-port "$SSH_PORT"} --out "$RUN_DIR/doctor" --no-progress \
      || tsm_die "the cluster preflight failed: see the table above (SKIP_DOCTOR=1 skips it)"
  fi
  export DS_ENV_FILE=$ENV_FILE   # DeepSpeed's launcher exports its NAME=VALUE lines on every host
  launcher+=(--master_addr "$MASTER_ADDR")
fi
launcher+=(--master_port "$MASTER_PORT" "${LAUNCH_OPTS[@]}")
tsm_log "hosts ${HOSTS[*]}; MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT; recipe $CONFIG"
# not exec: the trap removes the env file when the launcher ends (it reads it at start-up)
rc=0
"${launcher[@]}" tsm_ds/train.py --deepspeed_config "$CONFIG" --resume auto "${TRAIN_ARGS[@]}" || rc=$?
[ "$rc" -eq 0 ] || tsm_explain_exit "$rc"
exit "$rc"
