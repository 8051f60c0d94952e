"""What a vLLM deployment must look like for GrowPage to observe and enforce, as pure checks.

Each check returns None when GrowPage can work, or the reason label it reports otherwise
(``growpage_agent_active{component, reason}`` = 0, the ``GrowPageAgentInactive`` alert, and
``gpctl diagnose``), so an inactive agent is never silent. The same functions back the support
matrix in docs/VLLM_PLUGIN.md. They read vLLM's config sections with ``getattr`` fallbacks (a
stand-in, an older vLLM or a missing section reads as the default), so they take any ``object``.
"""

from __future__ import annotations

# Reason labels (also the runbook's table of causes).
ACTIVE = "active"
MODE_OFF = "mode_off"
CUDAGRAPH_FULL = "full_cudagraph"
UNSUPPORTED_BACKEND = "unsupported_backend"
ASYNC_SCHEDULING = "async_scheduling"
PIPELINE_PARALLEL = "pipeline_parallel"
HYBRID_KV_CACHE = "hybrid_kv_cache"
MODEL_RUNNER_V2 = "model_runner_v2"
QUANTIZED_KV_CACHE = "quantized_kv_cache"
INVALID_CONFIG = "invalid_config"


def _graph_mode_name(compilation_config: object) -> str | None:
    mode = getattr(compilation_config, "cudagraph_mode", None)
    if mode is None:
        return None
    return str(getattr(mode, "name", mode)).upper().removeprefix("CUDAGRAPHMODE.")


def cudagraph_conflict(compilation_config: object) -> str | None:
    """``full_cudagraph`` when decode attention may be replayed from a full CUDA graph.

    A full graph (``FULL``, ``FULL_DECODE_ONLY``, ``FULL_AND_PIECEWISE``) replays the attention
    kernels without running any Python: enforcement, which must see every boundary and make every
    step's inputs physical, is not tried under any of them. ``PIECEWISE`` (attention runs eagerly
    between the graphed pieces) and ``NONE`` (``enforce_eager``) are fine.
    """
    name = _graph_mode_name(compilation_config)
    return CUDAGRAPH_FULL if name is not None and "FULL" in name else None


def observer_blocker(compilation_config: object) -> str | None:
    """``full_cudagraph`` when *no* step runs attention eagerly (``FULL``: mixed batches replay too).

    vLLM's default on CUDA, ``FULL_AND_PIECEWISE`` (and ``FULL_DECODE_ONLY``), replays decode-only
    batches from full graphs but runs mixed and prefill batches eagerly; the step the observer is
    due to observe runs without its full graph (:mod:`~growpage.vllm_plugin.graph_steps`: piecewise,
    or eager under ``FULL_DECODE_ONLY``), so decode steps are observed too, one in
    ``observe_every_steps``. ``growpage_vllm_observed_steps_total`` / ``growpage_vllm_steps_total``
    says how much of the work was observed.
    """
    return CUDAGRAPH_FULL if _graph_mode_name(compilation_config) == "FULL" else None


def uses_model_runner_v2(vllm_config: object) -> bool:
    """Whether the workers run Model Runner V2 (vLLM's default on CUDA where Triton works)."""
    try:
        return bool(getattr(vllm_config, "use_v2_model_runner", False))
    except Exception:  # the property consults the platform; a stand-in config has none
        return False


def enforce_blocker(scheduler_config: object, parallel_config: object, compilation_config: object,
                    num_kv_cache_groups: int, model_runner_v2: bool = False) -> str | None:
    """Why the scheduler cannot enforce in this deployment (None: it can).

    Tensor parallelism is supported (every rank compacts its own heads to the same plan); pipeline
    parallelism is not tried; one KV cache group (full attention) only. Async scheduling plans step
    N+1 before step N's output is back, so a compaction could free blocks the step in flight still
    writes; Model Runner V2 builds its inputs in device kernels that GrowPage does not yet make
    physical. Both keep vLLM's own paging and say so; monitor works with either.
    """
    if getattr(scheduler_config, "async_scheduling", False):
        return ASYNC_SCHEDULING
    if model_runner_v2:
        return MODEL_RUNNER_V2
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
    MODEL_RUNNER_V2: "set VLLM_USE_V2_MODEL_RUNNER=0 for enforce (monitor observes under either runner)",
    MODE_OFF: "set additional_config.growpage.mode (or GROWPAGE_MODE) to monitor or enforce",
    QUANTIZED_KV_CACHE: "run with --kv-cache-dtype auto (fp8 and other scaled caches cannot be read as keys)",
    INVALID_CONFIG: "correct additional_config.growpage (or the GROWPAGE_* variables) as the message says and "
                    "restart vLLM",
}


def start_up_states(mode_is_off: bool, compilation_config: object, *, invalid_config: bool = False,
                    enforce_requested: bool = False) -> dict[str, str]:
    """``{component: "active" or reason}`` as known from the configuration, before any step.

    The observer's entry is provisional: the worker's first report replaces it (an unwrapped
    backend, a cache layout that does not round-trip). Settings GrowPage cannot honour
    (``invalid_config``) switch every component off, the enforcer too when enforce was asked for.
    """
    if invalid_config:
        states = {"scheduler": INVALID_CONFIG, "observer": INVALID_CONFIG}
        return {**states, "enforcer": INVALID_CONFIG} if enforce_requested else states
    if mode_is_off:
        return {"scheduler": MODE_OFF, "observer": MODE_OFF}
    return {"scheduler": ACTIVE, "observer": observer_blocker(compilation_config) or ACTIVE}
