#!/usr/bin/env bash
# The trainer's real GRPO step on one GPU at Qwen2.5-0.5B, 1.5B and 3B shapes, beside its roofline
# (bench/device_step.py; docs/performance.md "On a real accelerator"). From the repository root:
#   bash bench/device_step.sh                          # the GPU sizes, about 8 minutes in all
#   DEVICE_STEP_SIZES=tiny bash bench/device_step.sh   # a CPU check of the script itself
# Results: stdout, and $OUT/device_step.{json,txt} when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# One process per size holds the GPU at a time: let XLA take most of it (the 3B update needs ~60 GB).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
exec "${PYTHON:-python3}" bench/device_step.py "$@"
