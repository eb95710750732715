#!/usr/bin/env bash
# Several machines listed in a hostfile (see launch/hostfile.example); run on the first host.
# The launcher ssh-es into every host (passwordless ssh; pdsh if installed) and starts the
# ranks there with the variables of .deepspeed_env (see launch/deepspeed_env.example).
# The run directory (--output-dir) must be on a filesystem all hosts share: checkpoints are
# written by every rank and resumed with --resume auto.
#   HOSTFILE=hosts CONFIG=ds_configs/gpu_kinetics_1536.json bash launch/train_multi_node.sh \
#       --data /shared/k400/videos --arch resnet50 --output-dir /shared/runs
# Without ssh: start this script on every node with NODE_RANK=0..N-1 and MASTER_ADDR set
# (the launcher's --no_ssh --node_rank mode).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(pwd)/.venv/bin:$PATH"
HOSTFILE=${HOSTFILE:-launch/hostfile.example}
CONFIG=${CONFIG:-ds_configs/gpu_fp16.json}
MASTER_PORT=${MASTER_PORT:-29500}
launcher=(deepspeed --hostfile "$HOSTFILE" --master_port "$MASTER_PORT")
# NO_SSH_CHECK=1: skip the launcher's ssh probe (a hostfile naming only localhost, a trial run)
if [ -n "${NO_SSH_CHECK:-}" ]; then launcher+=(--no_ssh_check); fi
if [ -n "${NODE_RANK:-}" ]; then
  launcher+=(--no_ssh --node_rank "$NODE_RANK" --master_addr "${MASTER_ADDR:?set MASTER_ADDR to node 0}")
elif [ -n "${MASTER_ADDR:-}" ]; then
  launcher+=(--master_addr "$MASTER_ADDR")
fi
exec "${launcher[@]}" tsm_ds/train.py --deepspeed_config "$CONFIG" --resume auto "$@"
