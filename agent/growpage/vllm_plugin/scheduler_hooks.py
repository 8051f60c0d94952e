"""The scheduler hooks (EngineCore): where Stage 2 meets vLLM's block accounting.

Five wrapped methods, installed once per process by :func:`install_scheduler_hooks` (``register``
calls it); each does nothing unless the scheduler's deployment runs ``mode=enforce``:

- ``Scheduler.schedule``: :meth:`SchedulerEnforcer.before_schedule` (boundaries, compactions),
  then vLLM's scheduling, then :meth:`SchedulerEnforcer.after_schedule` (the worker's payload);
- ``KVCacheManager.allocate_slots``: sizes blocks from the physical length
  (``num_computed_tokens - growpage_dropped``) and never hashes a compacted request again;
- ``Scheduler._preempt_request`` / ``Scheduler._free_request``: reset the physical accounting;
- ``Scheduler.update_from_output``: the worker's summary readings for the next decisions.

Async scheduling is not supported with enforce (the CPU platform turns it off anyway): a scheduler
with ``async_scheduling`` keeps vLLM's own paging and logs a warning once. So does a model with more
than one KV cache group (hybrid or sliding-window layers), and so does a deployment with more than
one worker (tensor or pipeline parallel: only rank 0 has a compactor today).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from growpage.vllm_plugin.enforcer import DROPPED_ATTRIBUTE, OUTPUT_ATTRIBUTE, SchedulerEnforcer

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

_WRAPPED_ATTRIBUTE = "__growpage_wrapped__"
_ENFORCER_ATTRIBUTE = "_growpage_enforcer"
_INACTIVE_ATTRIBUTE = "_growpage_enforcer_inactive"  # why a deployment that enforces has no enforcer


def enforcer_of(scheduler: Any) -> SchedulerEnforcer | None:
    """The scheduler's enforcer, built on first use; None when the deployment does not enforce."""
    enforcer = scheduler.__dict__.get(_ENFORCER_ATTRIBUTE, False)
    if enforcer is False:
        enforcer = None
        inactive: str | None = None
        try:
            enforcer, inactive = _build_enforcer(scheduler)
        except Exception:
            inactive = "start_failed"
            logger.exception("growpage: cannot start enforcement in the scheduler; vLLM's own paging runs")
        scheduler.__dict__[_ENFORCER_ATTRIBUTE] = enforcer
        scheduler.__dict__[_INACTIVE_ATTRIBUTE] = inactive
    return enforcer


def inactive_reason(scheduler: Any) -> str | None:
    """Why a deployment that runs mode=enforce has no enforcer (None: it has one, or does not enforce)."""
    return scheduler.__dict__.get(_INACTIVE_ATTRIBUTE)


def _build_enforcer(scheduler: Any) -> tuple[SchedulerEnforcer | None, str | None]:
    """The enforcer, or None and why not (None when the deployment does not enforce at all)."""
    from growpage.config import Mode
    from growpage.vllm_plugin.settings import settings_from_vllm_config
    from growpage.vllm_plugin.support import REMEDIES, enforce_blocker

    config, settings = settings_from_vllm_config(scheduler.vllm_config)
    if config.mode is not Mode.ENFORCE:
        return None, None
    vllm_config = scheduler.vllm_config
    blocker = enforce_blocker(scheduler.scheduler_config, vllm_config.parallel_config,
                              getattr(vllm_config, "compilation_config", None),
                              len(scheduler.kv_cache_manager.coordinator.single_type_managers))
    if blocker is not None:
        logger.warning("growpage: mode=enforce cannot run in this deployment (%s), so requests are monitored "
                       "only; to enforce, %s", blocker, REMEDIES[blocker])
        return None, blocker
    logger.info("growpage: enforcing KV budgets in the scheduler (base_pages=%d, block_size=%d)",
                config.base_pages, config.block_size)
    return SchedulerEnforcer(config, settings), None


def install_scheduler_hooks() -> bool:
    """Wrap the scheduler and KV cache manager once per process. Returns False when already done."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler.schedule, _WRAPPED_ATTRIBUTE, False):
        return False
    original_schedule = Scheduler.schedule
    original_allocate = KVCacheManager.allocate_slots
    allocate_signature = inspect.signature(original_allocate)
    if "delay_cache_blocks" not in allocate_signature.parameters:
        raise RuntimeError("this vLLM's KVCacheManager.allocate_slots has no delay_cache_blocks; "
                           "GrowPage's enforce needs it (see SUPPORTED_VLLM_SPEC)")
    original_preempt = Scheduler._preempt_request
    original_free = Scheduler._free_request
    original_update = Scheduler.update_from_output

    @functools.wraps(original_schedule)
    def schedule(self, *args, **kwargs):
        enforcer = enforcer_of(self)
        if enforcer is not None:
            enforcer.guarded("boundary decisions", enforcer.before_schedule, self)
        output = original_schedule(self, *args, **kwargs)
        if enforcer is not None:
            enforcer.guarded("step payload", enforcer.after_schedule, self, output)
        elif inactive_reason(self) is not None:  # the worker's exporter says why enforce does nothing
            setattr(output, OUTPUT_ATTRIBUTE, {"enforcer_state": inactive_reason(self)})
        return output

    @functools.wraps(original_allocate)
    def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
        dropped = getattr(request, DROPPED_ATTRIBUTE, 0)
        if not dropped:
            return original_allocate(self, request, num_new_tokens, *args, **kwargs)
        # NOTE: physical accounting; a compacted request's blocks no longer match its hash chain,
        # so they are never cached (delay_cache_blocks, bound by name whatever its position).
        bound = allocate_signature.bind(self, request, num_new_tokens, *args, **kwargs)
        bound.arguments["delay_cache_blocks"] = True
        logical = request.num_computed_tokens
        request.num_computed_tokens = logical - dropped
        try:
            return original_allocate(*bound.args, **bound.kwargs)
        finally:
            request.num_computed_tokens = logical

    @functools.wraps(original_preempt)
    def _preempt_request(self, request, *args, **kwargs):
        result = original_preempt(self, request, *args, **kwargs)
        enforcer = enforcer_of(self)
        if enforcer is not None:
            enforcer.guarded("preemption", enforcer.on_preempt, request)
        elif getattr(request, DROPPED_ATTRIBUTE, 0):
            setattr(request, DROPPED_ATTRIBUTE, 0)
        return result

    @functools.wraps(original_free)
    def _free_request(self, request, *args, **kwargs):
        result = original_free(self, request, *args, **kwargs)
        enforcer = enforcer_of(self)
        if enforcer is not None:
            enforcer.guarded("request end", enforcer.on_free, request)
        return result

    @functools.wraps(original_update)
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        enforcer = enforcer_of(self)
        if enforcer is not None:
            enforcer.guarded("worker readings", enforcer.on_output, model_runner_output)
        return original_update(self, scheduler_output, model_runner_output, *args, **kwargs)

    for wrapper in (schedule, allocate_slots, _preempt_request, _free_request, update_from_output):
        setattr(wrapper, _WRAPPED_ATTRIBUTE, True)
    Scheduler.schedule = schedule
    KVCacheManager.allocate_slots = allocate_slots
    Scheduler._preempt_request = _preempt_request
    Scheduler._free_request = _free_request
    Scheduler.update_from_output = update_from_output
    return True
