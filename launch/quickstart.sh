#!/usr/bin/env bash
# The README's first command: set up ./.venv, then the main job: TSM (resnet18, 8 segments,
# 112 px, from scratch) trained by the deepspeed launcher with 2 ranks on the real clips of
# ../shared/data/videos, a few epochs, checkpoints + TensorBoard under runs/, val top-1 printed.
#
#   bash launch/quickstart.sh                      # the defaults below
#   TSM_DS_DATA=/my/videos bash launch/quickstart.sh   # your own class-per-folder tree
#   bash launch/quickstart.sh --epochs 10          # any train.py flag is appended (later wins)
#
# Without ../shared (and without TSM_DS_DATA / --data) train.py generates the demo dataset
# (tsm_ds.data.synthetic) or, if that module is missing, stops and says which data it needs.
# Settings: NPROC (2 ranks), MASTER_PORT (a free one), TSM_DS_CONFIG (ds_configs/cpu_fp32.json:
# fp32 SGD runs on GPUs as well). train.py's own flags: python -m tsm_ds.train --help.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR == 1 && /^#!/ { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
bash launch/setup.sh
source launch/common.sh   # venv on PATH, DeepSpeed's op cache on this node (built by set-up), this node's accelerator
tsm_setup_env
tsm_prebuild_op           # one build of DeepSpeed's CPU comm op (20 s to 2 min the first time), not one per rank

NPROC=${NPROC:-2}
DATA=${TSM_DS_DATA:-../shared/data/videos}
args=()
if [ -d "$DATA" ]; then
  args+=(--data "$DATA")
elif [ -n "${TSM_DS_DATA:-}" ]; then
  echo "quickstart: TSM_DS_DATA=$TSM_DS_DATA is not a directory" >&2; exit 2
else
  # no real clips: train.py generates the demo dataset (64 px motion-direction clips, 4 classes)
  echo "quickstart: $DATA not found: training on the generated demo dataset instead"
  args+=(--img-size 64 --epochs 3 --batch-size 8 --micro-batch-size 4 --lr 0.02 --lr-steps 2)
fi

launcher=(deepspeed --num_gpus "$NPROC" --master_port "${MASTER_PORT:-$(tsm_free_port)}")
CONFIG=${TSM_DS_CONFIG:-ds_configs/cpu_fp32.json}        # fp32 SGD runs on GPUs as well
if [ "${TSM_NODE_ACCELERATOR:-}" = cpu ]; then           # set by tsm_setup_env: no CUDA here (gloo)
  # every rank needs its own cores (2 unpinned ranks on 2 cores run ~10x slower): pin with
  # numactl when present, else train.py sets torch threads = cores / local ranks
  if command -v numactl >/dev/null; then launcher+=(--bind_cores_to_rank); fi
fi

start=$(date +%s)
"${launcher[@]}" tsm_ds/train.py --deepspeed_config "$CONFIG" \
  --arch resnet18 --num-segments 8 --img-size 112 --epochs 6 \
  --batch-size 4 --micro-batch-size 2 --lr 0.004 --warmup-steps 2 --lr-steps 4 --num-workers 1 \
  --output-dir runs --run-name quickstart --resume auto "${args[@]}" "$@"
echo "quickstart: wall time $(( $(date +%s) - start )) s; TensorBoard: tensorboard --logdir runs/quickstart/tensorboard"
