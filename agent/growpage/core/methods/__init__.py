"""KV methods: GrowPage, the fixed-budget methods it is compared against, and its ablations, each
one object with the hooks both homes call (:mod:`growpage.core.methods.base`).

Importing the package registers every method, one module per family: adding a method is one file
and an import here (:mod:`growpage.core.methods.tova` is the example).
"""

from __future__ import annotations

from growpage.core.methods import caps, full_kv, growpage, quantization, tova  # noqa: F401  (they register)
from growpage.core.methods.base import (
    KVMethod,
    Observation,
    Protection,
    build_method,
    observation_kind,
    registered,
)
from growpage.core.methods.growpage import PROMPT_PRIOR_STEPS, PUBLISHED_THRESHOLDS

METHOD_NAMES = registered()
_IN_VLLM = {name: method.family for name in METHOD_NAMES if (method := build_method(name)).in_vllm}
# the methods the vLLM plugin runs (its ``method`` setting): GrowPage's first, then the fixed caps
VLLM_CAP_NAMES = tuple(name for name, family in _IN_VLLM.items() if family == "fixed_budget")
VLLM_METHOD_NAMES = tuple(name for name in _IN_VLLM if name not in VLLM_CAP_NAMES) + VLLM_CAP_NAMES
GROWPAGE = build_method("growpage")

__all__ = ["GROWPAGE", "METHOD_NAMES", "PROMPT_PRIOR_STEPS", "PUBLISHED_THRESHOLDS", "VLLM_CAP_NAMES",
           "VLLM_METHOD_NAMES", "KVMethod", "Observation", "Protection", "build_method", "observation_kind"]
