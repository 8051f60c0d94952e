"""The scheduler hooks (EngineCore): where GrowPage meets vLLM's scheduler and block accounting.

Installed once per process by :func:`install_scheduler_hooks` (``register`` calls it, in every
mode); each wrapper calls vLLM's own method and lets the scheduler's
:class:`~growpage.vllm_plugin.scheduler_agent.SchedulerAgent` look before or after, its faults
counted and swallowed:

- ``Executor.__init__`` (EngineCore, before the model loads): the exporter serves the start-up
  series (:mod:`~growpage.vllm_plugin.startup`);
- ``Scheduler.__init__``: builds the agent, which takes that exporter over (or binds its own);
- ``Scheduler.schedule``: boundaries and compactions (enforce) before vLLM schedules; admissions,
  grants, monitored boundaries and the workers' payload after;
- ``KVCacheManager.allocate_slots``: times each allocation (grant latency) and, for a compacted
  request, sizes blocks from the physical length (``num_computed_tokens - growpage_dropped``),
  never hashing its blocks again;
- ``Scheduler._preempt_request`` / ``Scheduler._free_request``: releases (and counts preemptions);
- ``Scheduler.update_from_output``: the worker's report (readings, observer state).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
from collections.abc import Callable

from growpage.config import Mode
from growpage.provenance import host_cpu_kind
from growpage.vllm_plugin.patching import is_wrapped, wrap_methods
from growpage.vllm_plugin.rank_faults import RankFaultReader, board_for
from growpage.vllm_plugin.resolve import settings_from_vllm_config
from growpage.vllm_plugin.scheduler_agent import SchedulerAgent, SchedulerView
from growpage.vllm_plugin.startup import close_early, deployment_device, rank_exporter_port, served_model, start_early
from growpage.vllm_plugin.support import (
    INVALID_CONFIG,
    REMEDIES,
    enforce_blocker,
    start_up_states,
    uses_model_runner_v2,
)
from growpage.vllm_plugin.versions import check_vllm_version
from growpage.vllm_plugin.vllm_types import KVCacheManager, Request, Scheduler, VllmConfig
from growpage.vllm_plugin.wire import DROPPED_ATTRIBUTE

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

_AGENT_ATTRIBUTE = "_growpage_agent"


def agent_of(scheduler: Scheduler) -> SchedulerAgent | None:
    """The scheduler's agent, built on first use (None when it could not start: vLLM runs unchanged)."""
    agent = scheduler.__dict__.get(_AGENT_ATTRIBUTE, False)
    if agent is False:
        agent = None
        try:
            agent = build_agent(scheduler)
        except Exception:
            logger.exception("growpage: cannot start the scheduler agent; vLLM's own paging runs, unobserved")
            close_early()
        scheduler.__dict__[_AGENT_ATTRIBUTE] = agent
        manager = getattr(scheduler, "kv_cache_manager", None)
        if manager is not None and agent is not None:
            manager.__dict__[_AGENT_ATTRIBUTE] = agent  # allocate_slots times its grants for it
    return agent


def existing_agent(scheduler: Scheduler) -> SchedulerAgent | None:
    """The scheduler's agent if one was built (never builds one: for readers such as the demo)."""
    agent = scheduler.__dict__.get(_AGENT_ATTRIBUTE)
    return agent if isinstance(agent, SchedulerAgent) else None


def build_agent(scheduler: Scheduler, *, start_telemetry: bool = True) -> SchedulerAgent:
    """The agent for ``scheduler``'s deployment.

    Settings GrowPage cannot honour never stop vLLM: the agent then runs ``off``, serves
    ``growpage_agent_active{reason="invalid_config"}`` = 0 and logs one line saying what to fix.
    """
    vllm_config = scheduler.vllm_config
    resolved = settings_from_vllm_config(vllm_config)
    config = resolved.config
    settings = dataclasses.replace(resolved.settings, exporter_port=rank_exporter_port(
        resolved.settings.exporter_port, getattr(vllm_config, "parallel_config", None)))  # one port per DP rank
    if resolved.problem is not None:
        logger.error("growpage: the settings cannot be honoured, so GrowPage is off (reason %s) and vLLM pages on "
                     "its own: %s; %s", INVALID_CONFIG, resolved.problem, REMEDIES[INVALID_CONFIG])
    compilation = getattr(vllm_config, "compilation_config", None)
    groups = scheduler.kv_cache_manager.coordinator.single_type_managers
    blocker = None
    if config.mode is Mode.ENFORCE:
        blocker = enforce_blocker(scheduler.scheduler_config, vllm_config.parallel_config, compilation, len(groups),
                                  uses_model_runner_v2(vllm_config))
        if blocker is not None:
            logger.warning("growpage: mode=enforce cannot run in this deployment (%s), so requests are monitored "
                           "only; to enforce, %s", blocker, REMEDIES[blocker])
    view = SchedulerView(
        model=served_model(vllm_config), engine_version=check_vllm_version(), device=deployment_device(vllm_config),
        num_pages=max(0, int(scheduler.kv_cache_manager.block_pool.num_gpu_blocks) - 1),  # less the null block
        token_bytes=token_bytes(scheduler),
        component_states=start_up_states(config.mode is Mode.OFF, compilation,
                                         invalid_config=resolved.problem is not None,
                                         enforce_requested=resolved.requested_mode == Mode.ENFORCE.value),
        otlp_traces_endpoint=getattr(getattr(vllm_config, "observability_config", None), "otlp_traces_endpoint",
                                     None),
        cpu_kind=host_cpu_kind())
    board = board_for(vllm_config) if config.mode is not Mode.OFF else None  # workers observe only when on
    agent = SchedulerAgent(config, settings, view, enforcer_blocker=blocker,
                           rank_faults=RankFaultReader(board) if board is not None else None)
    if start_telemetry:
        agent.start_telemetry()
    logger.info("growpage: scheduler agent started (mode=%s, base_pages=%d, block_size=%d, admission=%s)",
                config.mode.value, config.base_pages, config.block_size,
                "growth-aware" if agent.admission is not None else "vLLM's own")
    return agent


def token_bytes(scheduler: Scheduler) -> int:
    """KV bytes of one token across the first group's layers, from vLLM's own cache spec."""
    group = scheduler.kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    return int(spec.page_size_bytes * len(group.layer_names) // spec.block_size)


def _new_blocks(result: object) -> int:
    """Blocks an ``allocate_slots`` result (vLLM's ``KVCacheBlocks``, read duck-typed) newly took from the
    pool (its first KV cache group)."""
    groups = getattr(result, "blocks", None)
    return len(groups[0]) if groups else 0


def install_scheduler_hooks() -> bool:
    """Wrap the executor, scheduler and KV cache manager once per process. Returns False when already done."""
    # deferred: vLLM's modules load when the hooks install; vllm_child's parents import this module too
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.executor.abstract import Executor

    if is_wrapped(Scheduler.schedule):
        return False
    allocate_signature = inspect.signature(KVCacheManager.allocate_slots)
    if "delay_cache_blocks" not in allocate_signature.parameters:
        raise RuntimeError("this vLLM's KVCacheManager.allocate_slots has no delay_cache_blocks; "
                           "GrowPage needs it (see SUPPORTED_VLLM_SPEC)")
    wrap_methods([
        (Executor, "__init__", _wrap_executor_init),
        (Scheduler, "__init__", _wrap_init), (Scheduler, "schedule", _wrap_schedule),
        (KVCacheManager, "allocate_slots", functools.partial(_wrap_allocate, signature=allocate_signature)),
        (Scheduler, "_preempt_request", _wrap_preempt), (Scheduler, "_free_request", _wrap_free),
        (Scheduler, "update_from_output", _wrap_update)])
    return True


# Each wrapper below calls vLLM's method with the arguments vLLM passed and hands its result back as it
# came: those it does not read are ``object``, the original and the wrapper ``Callable[..., object]``.
def _wrap_executor_init(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def __init__(self: object, vllm_config: VllmConfig, *args: object, **kwargs: object) -> None:
        start_early(vllm_config)  # before the executor loads the model; never raises
        original(self, vllm_config, *args, **kwargs)

    return __init__


def _wrap_init(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def __init__(self: Scheduler, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        agent_of(self)  # the exporter serves from start-up, before any request

    return __init__


def _wrap_schedule(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def schedule(self: Scheduler, *args: object, **kwargs: object) -> object:
        agent = agent_of(self)
        if agent is None:
            return original(self, *args, **kwargs)
        with agent.observed.scheduler_time.step():
            agent.guarded("boundary decisions", agent.before_schedule, self)
            output = original(self, *args, **kwargs)
            agent.guarded("step accounting", agent.after_schedule, self, output)
        return output

    return schedule


def _wrap_allocate(original: Callable[..., object], signature: inspect.Signature) -> Callable[..., object]:
    @functools.wraps(original)
    def allocate_slots(self: KVCacheManager, request: Request, num_new_tokens: int, *args: object,
                       **kwargs: object) -> object:
        agent = self.__dict__.get(_AGENT_ATTRIBUTE)
        started = time.perf_counter()
        dropped = getattr(request, DROPPED_ATTRIBUTE, 0)
        if not dropped:
            result = original(self, request, num_new_tokens, *args, **kwargs)
        else:
            # NOTE: physical accounting; a compacted request's blocks no longer match its hash chain,
            # so they are never cached (delay_cache_blocks, bound by name whatever its position).
            bound = signature.bind(self, request, num_new_tokens, *args, **kwargs)
            bound.arguments["delay_cache_blocks"] = True
            logical = request.num_computed_tokens
            request.num_computed_tokens = logical - dropped
            try:
                result = original(*bound.args, **bound.kwargs)
            finally:
                request.num_computed_tokens = logical
        if agent is not None and result is not None:
            agent.guarded("grant timing", agent.on_allocated, request.request_id, _new_blocks(result),
                          time.perf_counter() - started)
        return result

    return allocate_slots


def _wrap_preempt(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def _preempt_request(self: Scheduler, request: Request, *args: object, **kwargs: object) -> object:
        result = original(self, request, *args, **kwargs)
        agent = agent_of(self)
        if agent is not None:
            agent.guarded("preemption", agent.on_preempt, request)
        elif getattr(request, DROPPED_ATTRIBUTE, 0):
            setattr(request, DROPPED_ATTRIBUTE, 0)
        return result

    return _preempt_request


def _wrap_free(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def _free_request(self: Scheduler, request: Request, *args: object, **kwargs: object) -> object:
        result = original(self, request, *args, **kwargs)
        agent = agent_of(self)
        if agent is not None:
            agent.guarded("request end", agent.on_free, request)
        return result

    return _free_request


def _wrap_update(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def update_from_output(self: Scheduler, scheduler_output: object, model_runner_output: object, *args: object,
                           **kwargs: object) -> object:
        agent = agent_of(self)
        if agent is None:
            return original(self, scheduler_output, model_runner_output, *args, **kwargs)
        with agent.observed.scheduler_time.step():
            agent.guarded("worker report", agent.on_output, model_runner_output, scheduler_output)
            result = original(self, scheduler_output, model_runner_output, *args, **kwargs)
            agent.guarded("idle poll", agent.after_output, self)
        return result

    return update_from_output
