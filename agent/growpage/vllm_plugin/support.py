"""What a vLLM deployment must look like for GrowPage to observe and enforce, as pure checks.

Each check returns None when GrowPage can work, or the reason label it reports otherwise
(``growpage_agent_active{component, reason}`` = 0, the ``GrowPageAgentInactive`` alert, and
``gpctl diagnose``), so an inactive agent is never silent. The same functions back the support
matrix in docs/VLLM_PLUGIN.md.
"""

from __future__ import annotations

from typing import Any

# Reason labels (also the runbook's table of causes).
CUDAGRAPH_FULL = "full_cudagraph"
UNSUPPORTED_BACKEND = "unsupported_backend"
ASYNC_SCHEDULING = "async_scheduling"
PIPELINE_PARALLEL = "pipeline_parallel"
HYBRID_KV_CACHE = "hybrid_kv_cache"


def cudagraph_conflict(compilation_config: Any) -> str | None:
    """``full_cudagraph`` when decode attention may be replayed from a full CUDA graph.

    A full graph (``FULL``, ``FULL_DECODE_ONLY``, ``FULL_AND_PIECEWISE``) replays the attention
    kernels without running any Python, so the observer would see only the steps vLLM happens not
    to replay: a silently partial summary. ``PIECEWISE`` (attention runs eagerly between the graphed
    pieces) and ``NONE`` (``enforce_eager``) are fine.
    """
    mode = getattr(compilation_config, "cudagraph_mode", None)
    if mode is None:
        return None
    has_full = getattr(mode, "has_full_cudagraphs", None)
    if callable(has_full):
        return CUDAGRAPH_FULL if has_full() else None
    return CUDAGRAPH_FULL if "FULL" in str(mode).upper() else None


def enforce_blocker(scheduler_config: Any, parallel_config: Any, compilation_config: Any,
                    num_kv_cache_groups: int) -> str | None:
    """Why the scheduler cannot enforce in this deployment (None: it can).

    Tensor parallelism is supported (every rank compacts its own heads to the same plan); pipeline
    parallelism is not tried; one KV cache group (full attention) only.
    """
    if getattr(scheduler_config, "async_scheduling", False):
        return ASYNC_SCHEDULING
    if getattr(parallel_config, "pipeline_parallel_size", 1) > 1:
        return PIPELINE_PARALLEL
    if num_kv_cache_groups != 1:
        return HYBRID_KV_CACHE
    return cudagraph_conflict(compilation_config)


REMEDIES = {
    CUDAGRAPH_FULL: "start vLLM with --compilation-config '{\"cudagraph_mode\": \"PIECEWISE\"}' (or --enforce-eager)",
    UNSUPPORTED_BACKEND: "select FLASH_ATTN, FLASHINFER or TRITON_ATTN on CUDA (--attention-backend)",
    ASYNC_SCHEDULING: "start vLLM with --no-async-scheduling",
    PIPELINE_PARALLEL: "run enforce with pipeline_parallel_size=1 (monitor works with any)",
    HYBRID_KV_CACHE: "enforce needs a model with full attention only (one KV cache group)",
}
