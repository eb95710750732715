#!/usr/bin/env bash
# The GPU proof: one script, at most 5 minutes on one GPU, every section time-boxed, each section's
# JSON appended to OUT/gpu_check.jsonl as soon as it ends (a later time-out loses nothing before it).
#
#   bash launch/gpu_check.sh --prepare            # HERE (registry access): wheels + a few clips -> build/gpu_check/
#   bash launch/gpu_check.sh --out "$OUT"         # THERE (the GPU machine, carrying build/gpu_check)
#   bash launch/gpu_check.sh --dry-run --out DIR  # on CPU: every non-CUDA section at tiny sizes (the tests)
#
# The GPU machine's python3 has torch / torchvision and most of what tsm_ds needs, but no deepspeed,
# PyAV or registry: --prepare builds build/gpu_check/wheels (deepspeed 0.19.8 built as a pure-Python
# wheel, PyAV's abi3 manylinux wheel, simplejpeg, pydantic + pydantic-core for CPython 3.12, annotated-types,
# typing-inspection, hjson) and build/gpu_check/clips (2 small clips per class of the shared data),
# at most 60 MiB. The run installs the wheels and tsm_ds (--no-deps) into /tmp/site.
#
# Sections and their time boxes (BOX below; each box + KILL_AFTER s to be killed; the sum is at most
# 300 s, checked by tests/cli/test_launch_scripts.py): setup (install the carried wheels), doctor
# (environment, compute, data: real clips through the DataLoader and the whole pipeline against
# synthetic input, verdict), precisions (TSM-R50 8x224 training clips/s fp16 / bf16 / channels-last),
# recipes (every gpu_* recipe but gpu_kinetics_1536 for 20 steps; that one resolved), onebit (the
# 1-bit compressor, two ranks over gloo with CUDA tensors on one GPU), gpudecode (training clips/s of
# CPU DataLoader workers vs --decode-device cuda, nvJPEG in batches, and the pixel difference of the
# two paths; tsm_ds/bench/decode_device.py), largebatch (launch/gpu_large_batch.sh --smoke: the
# large-batch study's GPU loop at 512 and 4,096 clips, ghost BatchNorm over 8, bf16, data on the
# device; ~30 s by its estimate), fusedlamb (gpu_fp16_lamb: DeepSpeed's FusedLamb,
# JIT-built with nvcc in its own box: the likeliest to run out of time), compile (torch.compile of a
# small TSM, resnet18 8x112: a cold compile of TSM-R50 8x224 does not fit a box), last.
# The GPU machine's own stack is its image's python3 with torch 2.11 + CUDA 13.0 (the device tool's
# docs), not the pinned torch 2.14.1: the setup section prints the versions it found.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/build/gpu_check"
OUTDIR="${OUT:-$ROOT/gpu_check_out}"
MODE=run
DATA=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) MODE=prepare ;;
    --dry-run) MODE=dry ;;
    --out) OUTDIR="$2"; shift ;;
    --data) DATA="$2"; shift ;;
    -h|--help) awk 'NR == 1 && /^#!/ { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# ------------------------------------------------------------------------------------- prepare (here)
if [ "$MODE" = prepare ]; then
  PY="${PYTHON:-$ROOT/.venv/bin/python}"
  mkdir -p "$CARRY/wheels" "$CARRY/clips"
  rm -f "$CARRY"/wheels/*.whl
  plat=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  # the versions this checkout runs (setup.py pins deepspeed; the rest as installed here)
  ver() { "$PY" -c "from importlib.metadata import version; print(version('$1'))"; }
  set -e
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$CARRY/wheels" "deepspeed==$(ver deepspeed)"
  "$PY" -m pip download -q "${plat[@]}" -d "$CARRY/wheels" "av==$(ver av)" "pydantic==$(ver pydantic)" \
      "pydantic-core==$(ver pydantic-core)" "annotated-types==$(ver annotated-types)" \
      "typing-inspection==$(ver typing-inspection)" "hjson==$(ver hjson)" \
      "simplejpeg==$(ver simplejpeg)"
  set +e
  src="${DATA:-${TSM_DS_DATA:-$ROOT/../shared/data/videos}}"
  if [ -d "$src" ]; then
    for cls in "$src"/*/; do
      c="$(basename "$cls")"; mkdir -p "$CARRY/clips/$c"
      ls -S -r "$cls" | head -2 | while read -r f; do cp "$cls/$f" "$CARRY/clips/$c/"; done
    done
  else
    echo "gpu_check.sh: no clips at $src: the GPU run generates none (its data section is skipped)" >&2
  fi
  size=$(du -sm "$CARRY" | cut -f1)
  echo "prepared $CARRY: ${size} MiB ($(ls "$CARRY/wheels" | wc -l) wheels, $(find "$CARRY/clips" -type f | wc -l) clips)"
  [ "$size" -le 60 ] || { echo "gpu_check.sh: $CARRY is over 60 MiB: the device carries 64 MiB in all" >&2; exit 1; }
  echo "run it there: device run with carry [\"build/gpu_check\"], command: bash launch/gpu_check.sh --out \$OUT"
  exit 0
fi

# ------------------------------------------------------------------------------------------- run
mkdir -p "$OUTDIR"
WORK="${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
JSONL="$OUTDIR/gpu_check.jsonl"
LOG="$OUTDIR/gpu_check.log"
: > "$JSONL"
: > "$LOG"
# JIT-built DeepSpeed ops (FusedLamb there; the CPU accelerator's op here, built once by launch/setup.sh)
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$WORK/torch_extensions}"
if [ "$MODE" = dry ]; then
  PY="${PYTHON:-python}"
  # tiny sizes: one thread each (OpenMP threads on a busy CPU wait for each other at every barrier)
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  [ -n "$DATA" ] || DATA="${TSM_DS_DATA:-}"
else
  PY="${PYTHON:-python3}"
  [ -n "$DATA" ] || DATA="$CARRY/clips"
fi
DATA_FLAG=()
[ -n "$DATA" ] && [ -d "$DATA" ] && DATA_FLAG=(--data "$DATA")

# record NAME RC SECONDS BOX [doctor.json]: one JSON line per section
record() {
  "$PY" - "$@" >> "$JSONL" <<'EOF'
import json, sys
name, rc, secs, box = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
doc = None
if len(sys.argv) > 5:
    try:
        doc = json.load(open(sys.argv[5]))
    except (OSError, ValueError):
        pass
status = "skipped" if rc == -1 else ("timed out" if rc in (124, 137) else ("ok" if rc == 0 else "failed"))
print(json.dumps({"section": name, "status": status, "rc": rc, "seconds": round(secs, 1), "box_s": box,
                  "doctor": doc}))
EOF
}

# section NAME BOX cmd...: run under `timeout BOX`, log, record
FAILED=0
section() {
  local name="$1" box="$2"; shift 2
  echo "== $name (time box ${box} s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --kill-after="$KILL_AFTER" "$box" "$@" >> "$LOG" 2>&1
  local rc=$?
  record "$name" "$rc" "$((SECONDS - t0))" "$box" "$WORK/$name/doctor.json"
  echo "   $name: rc $rc in $((SECONDS - t0)) s" | tee -a "$LOG"
  [ "$rc" -eq 0 ] || FAILED=1
}
skip() { record "$1" -1 0 0; echo "== $1: skipped ($2)" | tee -a "$LOG"; }

# the time boxes in seconds (section name -> box); a section is killed KILL_AFTER s after its box
declare -A BOX=([setup]=25 [doctor]=35 [precisions]=20 [recipes]=30 [onebit]=20 [gpudecode]=20 [largebatch]=35
                [fusedlamb]=45 [compile]=25)
KILL_AFTER=5
DOCTOR=("$PY" -m tsm_ds.cli doctor --no-progress)
# gpudecode DEVICE SECONDS BOX: CPU workers vs batched decoding on DEVICE (needs clips)
gpudecode() {
  if [ ${#DATA_FLAG[@]} -eq 0 ]; then skip gpudecode "no clips (--data)"; return; fi
  section gpudecode "$3" "$PY" -c "from tsm_ds.bench.decode_device import run_decode_bench as r; \
r('$DATA', '$1', '$WORK/gpudecode', seconds=$2, workers=min(8, __import__('os').cpu_count()))"
}
# largebatch MODE BOX: launch/gpu_large_batch.sh --smoke (the GPU) or --dry-run (CPU); its summary is the record
largebatch() {
  section largebatch "$2" bash -c "PYTHON='$PY' bash '$ROOT/launch/gpu_large_batch.sh' $1 --out '$WORK/largebatch' \
&& cp '$WORK/largebatch/gpu_large_batch.json' '$WORK/largebatch/doctor.json'"
}
if [ "$MODE" = dry ]; then
  skip setup "dry run: this python's packages"
  TINY=(--arch resnet18 --num-segments 2 --img-size 32 --micro-batch-size 2 --quick)
  # the compute variants of the precisions section ride along (one process less)
  section doctor 240 "${DOCTOR[@]}" "${DATA_FLAG[@]}" "${TINY[@]}" --workers 1 --precisions bf16 --channels-last \
      --out "$WORK/doctor"
  skip precisions "dry run: measured in the doctor section (bf16, channels-last)"
  section recipes 240 "${DOCTOR[@]}" --recipes --recipe-names cpu_fp32,gpu_fp16,gpu_kinetics_1536 \
      --recipe-steps 2 --num-segments 2 --out "$WORK/recipes"
  skip fusedlamb "CUDA only"
  section onebit 120 "${DOCTOR[@]}" --only onebit --quick --out "$WORK/onebit"
  gpudecode cpu 2 60   # 2 s of decoding; the rest is start-up, slow on a loaded CPU (15 s timed out there)
  largebatch --dry-run 60
  skip compile "on CPU torch.compile takes minutes"
else
  section setup "${BOX[setup]}" bash -c "set -e; nvidia-smi -L; \
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $CARRY/wheels/*.whl; \
    PYTHONPATH=/tmp/site $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site $ROOT; \
    PYTHONPATH=/tmp/site $PY -c 'import torch, deepspeed, av, tsm_ds; print(torch.__version__, torch.version.cuda, deepspeed.__version__, av.__version__, torch.cuda.get_device_name(0))'"
  export PYTHONPATH=/tmp/site
  R50=(--arch resnet50 --num-segments 8 --img-size 224)
  section doctor "${BOX[doctor]}" "${DOCTOR[@]}" "${DATA_FLAG[@]}" "${R50[@]}" --deepspeed_config gpu_bf16 --quick \
      --out "$WORK/doctor"
  section precisions "${BOX[precisions]}" "${DOCTOR[@]}" --only compute "${R50[@]}" --deepspeed_config cpu_fp32 \
      --precisions fp16,bf16 --channels-last --quick --out "$WORK/precisions"
  section recipes "${BOX[recipes]}" "${DOCTOR[@]}" --recipes --recipe-steps 20 \
      --recipe-names gpu_autocast_bf16_onebit,gpu_bf16,gpu_fp16,gpu_fp16_comm_fp16,gpu_kinetics_1536 --out "$WORK/recipes"
  section onebit "${BOX[onebit]}" "${DOCTOR[@]}" --only onebit --out "$WORK/onebit"
  gpudecode cuda 6 "${BOX[gpudecode]}"
  largebatch --smoke "${BOX[largebatch]}"
  section fusedlamb "${BOX[fusedlamb]}" "${DOCTOR[@]}" --recipes --recipe-steps 20 --recipe-names gpu_fp16_lamb \
      --out "$WORK/fusedlamb"
  section compile "${BOX[compile]}" "${DOCTOR[@]}" --only compute --arch resnet18 --num-segments 8 --img-size 112 \
      --deepspeed_config cpu_fp32 --compile --quick --out "$WORK/compile"
fi
for f in doctor.md doctor.png; do [ -f "$WORK/doctor/$f" ] && cp "$WORK/doctor/$f" "$OUTDIR/"; done
echo "gpu_check: $(grep -c '^{"section": "[a-z]*", "status": "ok"' "$JSONL") ok of $(wc -l < "$JSONL") sections; $JSONL" | tee -a "$LOG"
exit "$FAILED"
