#!/usr/bin/env bash
# GrowPage's paged-cache code on a GPU with CUDA torch alone: no vLLM, nothing installed or downloaded.
# Carry this repository (agent/ and scripts/ are enough) to a machine whose python has CUDA torch:
#   PYTHON=python3 scripts/gpu-torch-checks.sh            # about 2-4 minutes on one GPU
# Checks probe, read, moves (per request and per KV head), chunked scoring (per request and per KV head)
# and R-KV redundancy against dense copies in every KVCacheLayout the CUDA
# backends use (float16 and bfloat16), then times observation (before/after chunked scoring) and
# compaction at an 8B geometry for 16 and 128 requests of 2k and 8k tokens, with peak GPU memory.
# Writes ${OUT:-bench-results/gpu}/torch-checks.json; exit 0 when every check passes.
# `--device cpu --quick` runs the same code small on CPU (the test suite does).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-results/gpu}
mkdir -p "$out"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && python=.venv/bin/python
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--device cuda)
exec timeout 300 "$python" scripts/gpu_torch_checks.py "${args[@]}" --output "$out/torch-checks.json"
