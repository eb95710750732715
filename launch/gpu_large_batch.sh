#!/usr/bin/env bash
# The large-batch study's GPU version (5 runs, fixed lrs): the hard demo task to a global batch of 4,096 within 10 minutes.
#
#   bash launch/gpu_large_batch.sh --out "$OUT"             # THERE (one GPU): the grid, ~7 min by its estimate
#   bash launch/gpu_large_batch.sh --smoke --out "$OUT"     # launch/gpu_check.sh's 35 s box (~30 s by its estimate)
#   bash launch/gpu_large_batch.sh --plan-only --workers 16 # the plan and the printed estimate, run nothing
#   bash launch/gpu_large_batch.sh --dry-run --out DIR      # on CPU: the same code at tiny sizes (the tests)
#
# Grid (tsm_ds/experiments/large_batch/gpu.py, entry point tsm_ds/cli/gpu_large_batch.py): TSM-R18 T=4 32 px from scratch, batches 128 / 512 /
# 4,096 (32x), 15 epochs of 81,920 clips = 300 optimizer steps at 4,096 (20 per epoch), BatchNorm over
# groups of 8 clips (ghost BatchNorm: the paper's 8 clips per GPU), bf16 autocast, the data rendered
# by the CPU cores and held on the GPU (16 GB of uint8 frames); (a) SGD with the linear rule and a
# 5-epoch warm-up above the base batch, (b) LARS and (c) LAMB (timm) at 4,096; cosine decay. The
# estimate is printed before anything runs (assumed H100 rates: 428 s with 16 cores; the run is
# refused above --budget-s 600), and again from the first run's measured rate. Every run's row is
# appended to OUT/gpu_large_batch.jsonl as it ends; OUT/gpu_large_batch.json holds the summary and
# the verdicts (the CPU study's pass rule, one seed). Other options: --sgd-lr, --lars-lr, --lamb-lr.
# Needs torch with CUDA and timm (LARS / LAMB are skipped without timm); no DeepSpeed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY="$ROOT/.venv/bin/python"
KW=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) awk 'NR == 1 && /^#!/ { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    --smoke) KW+=(mode=smoke) ;;
    --dry-run) KW+=(mode=dry) ;;
    --plan-only) KW+=(plan_only=1) ;;
    --out|--budget-s|--workers|--sgd-lr|--lars-lr|--lamb-lr)
      [ $# -ge 2 ] || { echo "gpu_large_batch.sh: $1 needs a value" >&2; exit 2; }
      k="${1#--}"; KW+=("${k//-/_}=$2"); shift ;;
    *) echo "gpu_large_batch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
# gpu_check.sh installs tsm_ds and its wheels into /tmp/site; else this checkout
if [ -d /tmp/site/tsm_ds ]; then export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"; fi
exec "$PY" -m tsm_ds.cli.gpu_large_batch "${KW[@]}"
