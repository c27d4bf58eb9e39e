#!/usr/bin/env bash
# The whole device session in one command (docs/performance.md "On a real accelerator"): a probe (card, driver,
# jax, commit), the seed's workload (bench/device_step.py, size 3b-seed) with today's defaults, then each change
# as a variant measured one at a time, in this order: cuDNN's fused attention in the update and the prefill (the
# update is most of the step; the decode loop comes from the session's compilation cache), the decode's attention
# as one Pallas GPU kernel per layer (rollout.attention_impl=pallas: the cache read in place, no window copies;
# the update comes from the cache), XLA's command buffers around the decode loop (a new XLA flag: every program
# compiles again), the end-of-sequence test once per 8 positions; then google-tunix's GRPO step at the 3B seed shape (bench/bench_peers.py --only tunix, one process
# at a time). The probe and `before` have fixed caps; each variant runs on what is left of the session's budget
# (DEVICE_SESSION_BUDGET_S, 560 s: one 10-minute device call) when at least DEVICE_SESSION_VARIANT_MIN_S (100 s)
# is left, and is skipped and named otherwise; tunix (its own cap) is a second call:
# `DEVICE_SESSION_PARTS=tunix bash bench/device_session.sh`. A variant's cold compile takes about as long as
# `before`'s, so a cap of its own would either waste the budget or stop the variant short of its one timed step.
# Records: every finished seed run as a results record (bench/results_record.py) in $DEVICE_SESSION_RESULTS
# (default bench/results/, and a copy under $OUT/results when OUT is set); tunix's as peers/DATE-CARD-tunix.json.
# On CPU, a check of the script: `DEVICE_STEP_SIZES=tiny DEVICE_SESSION_RESULTS=/tmp/x bash bench/device_session.sh`;
# `DEVICE_SESSION_PLAN=1` prints the plan (part, cap in seconds or `rest`, settings) and runs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
PY="${PYTHON:-python3}"
SIZE="${DEVICE_STEP_SIZES:-3b-seed}"
BUDGET="${DEVICE_SESSION_BUDGET_S:-560}"
PARTS="${DEVICE_SESSION_PARTS:-probe,before,cudnn,pallas,cmdbuf,eos8,tunix}"
RESULTS="${DEVICE_SESSION_RESULTS:-bench/results}"
# The parts: name, cap (s; `rest`: what is left of the budget), settings. A variant is the defaults plus one
# change (DEVICE_STEP_SETS: trainer overrides; DEVICE_STEP_XLA_FLAGS: XLA's; both land in the record's command).
CMDBUF="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"  # the loop's while and its test in a CUDA graph
declare -a PLAN=(
  "probe 20 -"
  "before ${DEVICE_SESSION_STEP_S:-270} DEVICE_STEP_PROFILE=update"
  "cudnn rest DEVICE_STEP_SETS=train.attention_impl=cudnn"
  "pallas rest DEVICE_STEP_SETS=rollout.attention_impl=pallas"
  "cmdbuf rest DEVICE_STEP_XLA_FLAGS=$CMDBUF"
  "eos8 rest DEVICE_STEP_SETS=rollout.eos_check_every=8"
  "tunix ${DEVICE_SESSION_TUNIX_S:-180} -"
)
VARIANT_MIN="${DEVICE_SESSION_VARIANT_MIN_S:-100}"
[ "$SIZE" = tiny ] && PLAN[1]="before 120 DEVICE_STEP_PROFILE=update" && PLAN[6]="tunix 60 -" && VARIANT_MIN="${DEVICE_SESSION_VARIANT_MIN_S:-60}"
if [ -n "${DEVICE_SESSION_PLAN:-}" ]; then
  for p in "${PLAN[@]}"; do set -- $p; [[ ",$PARTS," == *",$1,"* ]] && echo "part $1 $2 $3"; done
  echo "budget $BUDGET variant_min $VARIANT_MIN size $SIZE results $RESULTS"
  exit 0
fi
# One compilation cache for the session: a variant that leaves a program unchanged (the update, for a decode
# change) loads it instead of compiling it again.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/device-session-jax-cache}"
start=$(date +%s); failed=0
left() { echo $((BUDGET - ($(date +%s) - start))); }
mkdir -p "$RESULTS"
for p in "${PLAN[@]}"; do
  set -- $p; name=$1; cap=$2; setting=$3
  [[ ",$PARTS," == *",$name,"* ]] || continue
  need=$cap; [ "$cap" = rest ] && need=$VARIANT_MIN && cap=$(left)
  if [ "$(left)" -lt "$need" ]; then echo "device_session: $name skipped ($(left) s left, it needs $need s)"; continue; fi
  echo "device_session: $name (cap $cap s, $(left) s left)"
  case "$name" in
    probe)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
      timeout "$cap" "$PY" -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__, jax.devices())'
      echo "tree: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed paths" ;;
    tunix)
      if ! ls .whl/*.whl >/dev/null 2>&1; then echo "device_session: no .whl/ (bash bench/device_wheels.sh): tunix skipped"; continue; fi
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      peers="$RESULTS/peers"; mkdir -p "$peers"
      card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE '[A-Z][0-9]{2,3}' | head -1)
      PYTHONPATH=/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$cap" "$PY" bench/bench_peers.py --only tunix \
        --tunix-python "$PY" --platform '' --preset qwen2.5-3b --dtype bfloat16 --prompts 16 --samples 8 \
        --prompt-len 512 --new-tokens 1024 --micro-batch 8 --steps 3 --rounds 1 \
        --json "$peers/$(date -u +%F)-${card:-gpu}-tunix.json" 2>&1 | grep -v "^W0000" | tail -20 || failed=1 ;;
    *)
      env ${setting/#-/} DEVICE_STEP_SIZES="$SIZE" DEVICE_STEP_STEPS="${DEVICE_STEP_STEPS:-1}" \
        DEVICE_STEP_BUDGET_S=$((cap - 5)) "$PY" bench/device_step.py --results "$RESULTS" 2>&1 \
        | grep -v "^W0000" | tail -25 || failed=1 ;;
  esac
done
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/results" && cp -r "$RESULTS"/. "$OUT/results/" 2>/dev/null; fi
echo "device_session: done in $(( $(date +%s) - start )) s"
exit "$failed"
