#!/usr/bin/env bash
# Create ./.venv and install tsm_ds with everything it needs (idempotent; ~1-2 min the first time).
# torch/torchvision are pinned to the wheels on this machine's disk (see setup.py).
#   bash launch/setup.sh          # PYTHON=python3.12 to choose the interpreter of the venv
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR == 1 && /^#!/ { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import tsm_ds, deepspeed, av, torch, litdata, moto" 2>/dev/null \
   || [ setup.py -nt .venv/.tsm_ds_installed ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/pip install -q -e ".[test,export,shards]"   # export: onnx + onnxruntime; shards: litdata + moto
  touch .venv/.tsm_ds_installed
fi
echo "tsm_ds installed in $(pwd)/.venv"
# without CUDA, DeepSpeed's CPU accelerator JIT-builds its shared-memory comm op on first use (~40 s):
# build it now, into the node-local cache every command uses (tsm_ds.utils.node.ops_cache_dir)
if [ "$(.venv/bin/python -m tsm_ds.cli.launch_helper accelerator)" = cpu ]; then
  ops=${TORCH_EXTENSIONS_DIR:-$(.venv/bin/python -m tsm_ds.cli.launch_helper ops-cache)}
  if [ ! -e "$ops/deepspeed_shm_comm/deepspeed_shm_comm.so" ]; then
    echo "building DeepSpeed's CPU comm op into $ops (once per machine, ~40 s)"
    TORCH_EXTENSIONS_DIR=$ops DS_ACCELERATOR=cpu PATH="$(pwd)/.venv/bin:$PATH" \
      .venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 \
      || echo "warning: building DeepSpeed's CPU comm op failed; training builds it on first use" >&2
  fi
fi
