#!/usr/bin/env bash
# One machine, NPROC ranks (default: the visible GPUs; on CPU 2 ranks, threads = cores / ranks).
#   NPROC=8 CONFIG=gpu_fp16 bash launch/train_single_node.sh --data /data/k400 --arch resnet50
#   bash launch/train_single_node.sh --master_port 29600 --include localhost:0,1 -- --data /data/k400
# Launcher options (--include/--exclude/--master_port/--nproc) come first, '--' ends them; every
# other argument goes to train.py. MASTER_PORT defaults to a free port: two jobs on one machine
# do not collide.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$TSM_DS_ROOT"
tsm_parse_args "$@"
tsm_setup_env
if [ -z "${NPROC:-}" ]; then
  if [ "${DS_ACCELERATOR:-}" = cpu ]; then NPROC=2; else NPROC=$(tsm_ranks_per_node); fi
fi
tsm_set_threads "$NPROC"
tsm_prebuild_op
MASTER_PORT=${MASTER_PORT:-$(tsm_free_port)}
CONFIG=${CONFIG:-$([ "${DS_ACCELERATOR:-}" = cpu ] && echo cpu_fp32 || echo gpu_fp16)}
tsm_log "deepspeed --num_gpus $NPROC --master_port $MASTER_PORT ${LAUNCH_OPTS[*]:-}; recipe $CONFIG"
exec deepspeed --num_gpus "$NPROC" --master_port "$MASTER_PORT" "${LAUNCH_OPTS[@]}" \
  tsm_ds/train.py --deepspeed_config "$CONFIG" --resume auto "${TRAIN_ARGS[@]}"
