#!/usr/bin/env bash
# One machine, NPROC ranks (default: the visible GPUs; on CPU 2 ranks, threads = cores / ranks).
#   NPROC=8 CONFIG=gpu_fp16 bash launch/train_single_node.sh --data /data/k400 --arch resnet50
#   bash launch/train_single_node.sh --master_port 29600 --include localhost:0,1 -- --data /data/k400
# Launcher options: --master_port PORT, --num_gpus / --nproc N, --include / --exclude (DeepSpeed's),
# then '--' and train.py's flags (python -m tsm_ds.train --help); without '--', the first of
# train.py's flags ends the launcher options. Any other option stops the script, naming these.
# MASTER_PORT defaults to a free port: two jobs on one machine do not collide. CONFIG (the recipe)
# defaults to cpu_fp32 without CUDA, else gpu_fp16.
set -euo pipefail
source "$(dirname "$0")/common.sh"
if tsm_help_requested "$@"; then tsm_usage "$0"; exit 0; fi
cd "$TSM_DS_ROOT"
tsm_setup_env
tsm_parse_args single "$@"
NPROC=${NPROC:-$(tsm_ranks_per_node 2)}   # 2 CPU ranks here
tsm_set_threads "$NPROC"
tsm_prebuild_op
MASTER_PORT=${MASTER_PORT:-$(tsm_free_port)}
CONFIG=${CONFIG:-$(tsm_default_recipe)}
tsm_log "deepspeed --num_gpus $NPROC --master_port $MASTER_PORT ${LAUNCH_OPTS[*]:-}; recipe $CONFIG"
exec deepspeed --num_gpus "$NPROC" --master_port "$MASTER_PORT" "${LAUNCH_OPTS[@]}" \
  tsm_ds/train.py --deepspeed_config "$CONFIG" --resume auto "${TRAIN_ARGS[@]}"
