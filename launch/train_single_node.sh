#!/usr/bin/env bash
# One machine, NPROC ranks (GPUs, or CPU ranks with DS_ACCELERATOR=cpu): the official Kinetics
# recipe by default; every argument is passed to train.py.
#   NPROC=8 CONFIG=ds_configs/gpu_fp16.json bash launch/train_single_node.sh --data /data/k400 --arch resnet50
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(pwd)/.venv/bin:$PATH"
NPROC=${NPROC:-2}
CONFIG=${CONFIG:-ds_configs/cpu_fp32.json}
launcher=(deepspeed --num_gpus "$NPROC")
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
  if command -v numactl >/dev/null; then launcher+=(--bind_cores_to_rank); fi
fi
exec "${launcher[@]}" tsm_ds/train.py --deepspeed_config "$CONFIG" --resume auto "$@"
