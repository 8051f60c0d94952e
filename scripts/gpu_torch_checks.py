"""Run ``growpage.bench.gpu_checks`` with torch and this repository's ``agent/`` folder only.

A machine with CUDA torch but neither vLLM nor GrowPage's other dependencies (PyYAML, typer,
prometheus_client) can run it: the ``growpage`` packages are entered without running their
``__init__`` modules (which import the configuration, and so PyYAML), and the checks import
only torch-only modules. Nothing is installed or downloaded. Usage:
``python scripts/gpu_torch_checks.py [--device cuda|cpu] [--quick] [--output report.json]``.
"""

import sys
import types
from pathlib import Path

AGENT = Path(__file__).resolve().parent.parent / "agent"


def _enter_packages_without_init() -> None:
    for name in ("growpage", "growpage.bench", "growpage.vllm_plugin"):
        package = types.ModuleType(name)
        package.__path__ = [str(AGENT.joinpath(*name.split(".")))]
        sys.modules[name] = package


if __name__ == "__main__":
    _enter_packages_without_init()
    from growpage.bench import gpu_checks

    sys.exit(gpu_checks.main())
