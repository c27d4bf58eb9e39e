#!/usr/bin/env bash
# One device call (docs/performance.md "On a real accelerator"): where the
# decode loop's time goes (bench/device_decode.py: ms per token at 128 and 32 sequences, a profiled rollout,
# the compiled decode program), then google-tunix's GRPO step beside this trainer's on the GPU
# (bench/bench_peers.py, tunix from the wheels `bash bench/device_wheels.sh` put in .whl/, carried along).
# From the repository root of the GPU machine: `bash bench/device_probe.sh` (about 8 minutes); results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
OUT="${OUT:-/tmp/device_probe}"; mkdir -p "$OUT"; export OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__, jax.devices())'
echo "tree: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed paths"
[ "${PROBE_DECODE_S:-230}" = 0 ] || timeout "${PROBE_DECODE_S:-230}" python3 bench/device_decode.py 2>&1 | tee "$OUT/device_decode.log" | grep -v "^W0000"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && PYTHONPATH=/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout "${PROBE_PEERS_S:-280}" python3 bench/bench_peers.py --tunix-python python3 \
      --platform '' --preset qwen2.5-0.5b --dtype bfloat16 --prompts 16 --samples 8 --prompt-len 256 \
      --new-tokens 128 --micro-batch "${PROBE_MICRO:-16}" --steps 4 --rounds 1 --json "$OUT/peers.json" 2>&1 | tee "$OUT/peers.log" | grep -v "^W0000" | tail -30
else
  echo "device_probe: no .whl/ (run bash bench/device_wheels.sh here first): tunix skipped"
fi
