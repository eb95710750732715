#!/usr/bin/env bash
# The test command: set up ./.venv if needed, then run the whole suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export PATH="$(pwd)/.venv/bin:$PATH"   # one ninja on PATH: DeepSpeed's op cache is not rebuilt
# DeepSpeed JIT-compiles its CPU ops into this cache; one per checkout, or several venvs
# on one machine rebuild each other's ops at every launch (minutes each)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(pwd)/.venv/torch_extensions}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
exec .venv/bin/python -m pytest "$@"
