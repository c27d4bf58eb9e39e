#!/usr/bin/env bash
# One device call (docs/performance.md "On a real accelerator"): the
# decode's layer loop, scan against unrolled (`rollout.decode_layers`), at 3B shapes and 128 sequences
# (bench/device_decode.py: ms per position; the unrolled run profiled kernel by kernel), then the seed's workload
# (bench/device_step.py, size 3b-seed) with the loop the trainer picks on a GPU (auto: unrolled).
# From the repository root of the GPU machine: `bash bench/device_layers.sh` (about 7 minutes); results in $OUT.
# On CPU, a check of the script itself: `LAYERS_STEP_SIZES=tiny bash bench/device_layers.sh` (tiny shapes).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
OUT="${OUT:-/tmp/device_layers}"; mkdir -p "$OUT"; export OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__, jax.devices())'
batches="${LAYERS_BATCHES:-}"  # device_decode's default on CPU; 128 sequences (the seed's 16 x 8) on a GPU
command -v nvidia-smi >/dev/null 2>&1 && batches="${LAYERS_BATCHES:-128}"
for layers in scan unrolled; do
  profile=0; [ "$layers" = unrolled ] && profile="${LAYERS_PROFILE:-1}"
  DEVICE_DECODE_LAYERS="$layers" DEVICE_DECODE_PROFILE="$profile" DEVICE_DECODE_HLO=0 \
    DEVICE_DECODE_BATCHES="$batches" timeout "${LAYERS_DECODE_S:-170}" python3 bench/device_decode.py 2>&1 \
    | tee "$OUT/decode_$layers.log" | grep -v "^W0000" | grep -v '^ *"' | tail -20
  [ -f "$OUT/device_decode.json" ] && mv "$OUT/device_decode.json" "$OUT/decode_$layers.json"
done
DEVICE_STEP_SIZES="${LAYERS_STEP_SIZES:-3b-seed}" DEVICE_STEP_STEPS="${LAYERS_STEPS:-2}" \
  DEVICE_STEP_BUDGET_S="${LAYERS_STEP_S:-230}" python3 bench/device_step.py 2>&1 | tee "$OUT/step.log" | grep -v "^W0000" | tail -30
