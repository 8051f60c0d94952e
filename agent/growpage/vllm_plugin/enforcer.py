"""Enforce in vLLM's scheduler (EngineCore): decide at block boundaries, free blocks, plan compactions.

vLLM has no API that shrinks a running request's KV, so GrowPage keeps a *physical* length next to
vLLM's logical ``num_computed_tokens`` (see :mod:`~growpage.vllm_plugin.compaction`). Per step:

1. ``before_schedule``: each enforced decode request whose blocks are full and that holds its
   allowance of blocks is at a *boundary*; :func:`growpage.core.policy.decide` runs on it:

   - ``allocate``: the allowance grows by one block and vLLM allocates it as usual;
   - ``evict``: the request's block list is truncated to the target, the tail blocks go back to the
     pool, ``request.growpage_dropped`` grows by the tokens evicted, and a compaction plan for the
     worker is recorded (the worker moves the survivors before this step's writes);
   - ``quantize`` cannot be enforced (``kv_cache_dtype`` is deployment-wide in vLLM) and degrades
     to ``evict`` when eviction can free a block, else to ``allocate``; ``defer`` (throttled)
     degrades the same way; ``preempt`` is left to vLLM (its allocation fails and vLLM preempts).
     Both the decided and the enforced kind are recorded.
2. ``KVCacheManager.allocate_slots`` (wrapped) sees ``num_computed_tokens - growpage_dropped`` and
   never hashes a compacted request's blocks again (their content no longer matches the hash chain).
3. ``after_schedule``: the plans and the ``dropped`` of every compacted running request ride to the
   workers on ``SchedulerOutput.growpage`` (:mod:`~growpage.vllm_plugin.wire`).
4. Preemption (recompute from scratch) and finish reset the request's physical accounting.

Never touched: blocks with ``ref_cnt > 1`` (shared through the prefix cache; they are a leading run
and stay in place, protected). Blocks the request alone holds lose their prefix-cache hash before
they are rewritten or freed, so no later request can hit stale content.

Admission, the boundary routine, the fault guard and the stats are the
:class:`~growpage.core.controller.GrowthController`'s, shared with the scheduler agent
(:mod:`~growpage.vllm_plugin.scheduler_agent`), whose exporter counts what is decided here. This
module imports no vLLM (tests drive it with stand-ins); the scheduler hooks do.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from typing import Any

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import BoundaryCall, GrowthController, PoolView
from growpage.core.policy import Action, Reason
from growpage.core.pressure import PoolPressure, ReclaimCandidate, measure_pressure, plan_reclaim, protected_tokens
from growpage.vllm_plugin.compaction import compaction_target_tokens
from growpage.vllm_plugin.settings import MODE_ARG, request_namespace
from growpage.vllm_plugin.wire import (
    DROPPED_ATTRIBUTE,
    ENFORCE_LOG_ENV,
    PAYLOAD_ATTRIBUTE,
    CompactionPlan,
    append_enforce_log,
    step_payload,
)

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format


@dataclasses.dataclass
class EnforcedRequest:
    """Scheduler-side state of one request GrowPage enforces (its growth state is the controller's)."""

    request_id: str
    namespace: str | None
    allowed_blocks: int
    peak_blocks: int = 0
    compactions: int = 0
    tokens_evicted: int = 0
    blocks_at_last_step: int = 0
    first_compaction_at: int | None = None  # logical length when KV first differed from vLLM's
    max_shared_blocks: int = 0  # most leading blocks shared through the prefix cache at a boundary


def enforced_action(decided: Action, can_evict: bool, pool_free_pages: int) -> Action:
    """What vLLM can do for a decision: ALLOCATE and EVICT as decided; the rest degrades.

    ``quantize`` and ``defer`` become ``evict`` when eviction frees a block, else ``allocate``;
    ``preempt`` and an ``allocate`` against an empty pool are left to vLLM's own preemption
    (reported as ``preempt``).
    """
    if decided is Action.EVICT:
        return Action.EVICT if can_evict else Action.ALLOCATE
    if decided in (Action.QUANTIZE, Action.DEFER):
        if can_evict:
            return Action.EVICT
        decided = Action.ALLOCATE
    if decided is Action.ALLOCATE and pool_free_pages >= 1:
        return Action.ALLOCATE
    return Action.PREEMPT


class SchedulerEnforcer:
    """GrowPage's enforcement state for one vLLM ``Scheduler`` (see the module docstring).

    Args:
        controller: the scheduler's growth controller, shared with
            :class:`~growpage.vllm_plugin.scheduler_agent.SchedulerAgent` (admission, readings,
            decisions and their stats are its).
    """

    def __init__(self, controller: GrowthController):
        self.controller = controller
        self.config: GrowPageConfig = controller.config
        self.block_size = self.config.block_size
        self.requests: dict[str, EnforcedRequest | None] = {}  # None: seen, not enforced
        self._plans: dict[str, CompactionPlan] = {}
        # {(decided, enforced): count}: decisions vLLM could not carry out as decided
        self.degraded_total: collections.Counter[tuple[str, str]] = collections.Counter()
        self.start_free_blocks: int | None = None
        self.log_path = os.environ.get(ENFORCE_LOG_ENV) or None
        self._had_requests = False
        self.worker_ready = False  # no compaction before the worker says it can move tokens

    # ---- fault isolation ------------------------------------------------------------------------
    def guarded(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        with self.controller.guard("plugin", f"{what} failed in the scheduler; vLLM carries on"):
            return function(*args, **kwargs)
        return None

    # ---- per step -------------------------------------------------------------------------------
    def before_schedule(self, scheduler: Any) -> None:
        """Decide every boundary with the pool's pressure in view, then compress running requests
        if the pool still cannot hold this step, before vLLM's scheduling (and preemption) runs."""
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        if self.start_free_blocks is None:
            self.start_free_blocks = pool.get_num_free_blocks()
        req_to_blocks = _req_to_blocks(manager)
        decoding: list[tuple[Any, EnforcedRequest, list, int, bool]] = []
        growth_blocks = 0  # blocks running requests need this step, enforced or not
        for request in list(scheduler.running):
            tracked = self._track(request)
            blocks = req_to_blocks.get(request.request_id)
            if blocks is None or not _is_decoding(request):
                continue
            physical = request.num_computed_tokens - getattr(request, DROPPED_ATTRIBUTE, 0)
            at_boundary = physical > 0 and physical % self.block_size == 0 and len(blocks) * self.block_size == physical
            growth_blocks += at_boundary
            if tracked is not None:
                decoding.append((request, tracked, blocks, physical, at_boundary))
        pressure = self._pressure(scheduler, growth_blocks)
        handled = set()
        waiting_for_room = []  # boundaries that could neither grow nor compress themselves
        for request, tracked, blocks, physical, at_boundary in decoding:
            if at_boundary and len(blocks) >= tracked.allowed_blocks:
                # the others' growth and the next admission come first: growth yields to them
                reserve = max(0, pressure.growth_pages - 1) + pressure.admission_pages
                stuck = self._boundary(scheduler, request, tracked, blocks, physical, reserve)
                if stuck is not None:
                    waiting_for_room.append(stuck)
                handled.add(request.request_id)
        if self.worker_ready:
            # every boundary request still takes one block this step (evicting ones free theirs first)
            pressure = self._pressure(scheduler, growth_blocks)
            if pressure.under_pressure:
                self._reclaim(scheduler, [d for d in decoding if d[0].request_id not in handled],
                              pressure.deficit_pages)
        pool = manager.block_pool
        for call, tracked, held in waiting_for_room:
            # compressing the others made room: grow; else vLLM's preemption is the last resort
            action = Action.ALLOCATE if pool.get_num_free_blocks() >= 1 else Action.PREEMPT
            self._record_boundary(call, action, tracked, held, held + 1 if action is Action.ALLOCATE else held)

    def _pressure(self, scheduler: Any, growth_blocks: int) -> PoolPressure:
        """The pool's headroom against this step's growth and the oldest waiting request."""
        pool = scheduler.kv_cache_manager.block_pool
        waiting = next(iter(scheduler.waiting), None)
        # base_pages is every running request's floor; a longer prompt is compressed too under
        # pressure (ranked by the attention the observer saw, the final prefill query's first, as
        # SnapKV ranks a prompt by its last queries); shared prefix blocks are never touched
        floors = self.config.base_pages * len(scheduler.running)
        max_seqs = getattr(getattr(scheduler, "scheduler_config", None), "max_num_seqs", None)
        return measure_pressure(
            free_pages=pool.get_num_free_blocks(), total_pages=getattr(pool, "num_gpu_blocks", 1 << 30) - 1,
            growth_pages=growth_blocks, running_floor_pages=floors,
            waiting_prompt_pages=(self.controller.prompt_pages(waiting.num_prompt_tokens)
                                  if waiting is not None else None),
            waiting_floor_pages=self.config.base_pages if waiting is not None else 0,
            batch_full=max_seqs is not None and len(scheduler.running) >= max_seqs)

    def _reclaim(self, scheduler: Any, decoding: list, deficit: int) -> None:
        """Compress running requests (lowest LTS first) so vLLM need not preempt (core.pressure)."""
        block_size, config = self.block_size, self.config
        eligible = {}
        candidates = []
        for request, tracked, blocks, physical, at_boundary in decoding:
            shared_blocks = _leading_shared_blocks(blocks)
            if not all(getattr(b, "ref_cnt", 1) <= 1 for b in blocks[shared_blocks:]):
                continue
            protected = protected_tokens(physical, shared_blocks * block_size, config.sink_tokens,
                                         config.recent_window_tokens)
            floor = max(config.base_pages, -(-protected // block_size) + 1)
            control = self.controller.requests.get(request.request_id)
            eligible[request.request_id] = (request, tracked, blocks, physical, shared_blocks)
            candidates.append(ReclaimCandidate(request.request_id, len(blocks), floor,
                                               control.lts_entropy if control else 0.0, at_boundary))
        token_bytes = _token_bytes(scheduler) if candidates else 0
        for reclaim in plan_reclaim(deficit, candidates):
            request, tracked, blocks, physical, shared_blocks = eligible[reclaim.request_id]
            target = (reclaim.pages_after - 1) * block_size
            if target >= physical:
                continue
            started = time.perf_counter()
            held = len(blocks)
            self._compact(scheduler, request, tracked, blocks, physical, target, shared_blocks)
            tracked.allowed_blocks = max(tracked.allowed_blocks, reclaim.pages_after)
            self.controller.stats.record_compression(physical * token_bytes, target * token_bytes)
            self.controller.record_eviction(
                request.request_id, pages_before=held, pages_after=reclaim.pages_after,
                bytes_in=physical * token_bytes, bytes_out=target * token_bytes, started_perf_s=started,
                reason=Reason.POOL_PRESSURE)

    def _track(self, request: Any) -> EnforcedRequest | None:
        request_id = request.request_id
        if request_id in self.requests:
            return self.requests[request_id]
        extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
        namespace = request_namespace(extra)
        mode = self.controller.mode_for(namespace, extra.get(MODE_ARG))
        tracked = None
        if mode is Mode.ENFORCE:
            granted = self.controller.grant_pages(request.num_prompt_tokens)
            if request_id not in self.controller.requests:  # the scheduler agent admits it first
                self.controller.admit(request_id, prompt_tokens=request.num_prompt_tokens, namespace=namespace,
                                      mode=mode)
            tracked = EnforcedRequest(request_id, namespace, allowed_blocks=granted)
        self.requests[request_id] = tracked
        self._had_requests = True
        return tracked

    def _boundary(self, scheduler: Any, request: Any, tracked: EnforcedRequest, blocks: list,
                  physical: int, reserve_blocks: int = 0) -> tuple[BoundaryCall, EnforcedRequest, int] | None:
        """Run the contract on one boundary and carry it out; returns the boundary instead when it
        can neither grow nor compress (the pool is empty), for :meth:`before_schedule` to settle
        after relieving pressure."""
        config, block_size = self.config, self.block_size
        pool = scheduler.kv_cache_manager.block_pool
        held = len(blocks)
        shared_blocks = _leading_shared_blocks(blocks)
        tracked.max_shared_blocks = max(tracked.max_shared_blocks, shared_blocks)
        shareable = all(getattr(b, "ref_cnt", 1) <= 1 for b in blocks[shared_blocks:])
        protected = protected_tokens(physical, shared_blocks * block_size, config.sink_tokens,
                                     config.recent_window_tokens)
        target = None
        if shareable and self.worker_ready:
            # never below the floor (base_pages) that protects a running request
            target = compaction_target_tokens(physical, max(tracked.allowed_blocks, config.base_pages),
                                              block_size, config.evict_min_pages, protected)
        pool_free = pool.get_num_free_blocks()
        call = self.controller.decide(
            request.request_id, pages_held=held, pool=PoolView(pool_free, reserve_blocks),
            can_quantize=True,  # what the contract wants; vLLM cannot quantize per request (degraded below)
            can_evict=target is not None)
        decision = call.decision
        action = enforced_action(decision.action, target is not None, pool_free)
        if action is Action.PREEMPT:
            return call, tracked, held
        pages_after = held
        bytes_in = bytes_out = 0
        if action is Action.EVICT:
            assert target is not None
            self._compact(scheduler, request, tracked, blocks, physical, target, shared_blocks)
            pages_after = target // block_size + 1  # vLLM allocates the next token's block
            token_bytes = _token_bytes(scheduler)
            bytes_in, bytes_out = physical * token_bytes, target * token_bytes
            self.controller.stats.record_compression(bytes_in, bytes_out)
        elif action is Action.ALLOCATE:
            pages_after = held + 1
        self._record_boundary(call, action, tracked, held, pages_after, bytes_in, bytes_out)
        return None

    def _record_boundary(self, call: BoundaryCall, action: Action, tracked: EnforcedRequest, held: int,
                         pages_after: int, bytes_in: int = 0, bytes_out: int = 0) -> None:
        if action is not call.decision.action:
            self.degraded_total[(call.decision.action.value, action.value)] += 1
        if action is Action.ALLOCATE:
            tracked.allowed_blocks = held + 1
        self.controller.record_decision(call, kind=action, enforced=True, pages_after=pages_after,
                                        bytes_in=bytes_in, bytes_out=bytes_out)

    def _compact(self, scheduler: Any, request: Any, tracked: EnforcedRequest, blocks: list, physical: int,
                 target: int, shared_blocks: int) -> None:
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        keep_blocks = target // self.block_size
        # NOTE: unhash before rewriting or freeing: a hit on a block whose content moved would be wrong.
        for block in blocks[shared_blocks:]:
            if getattr(block, "block_hash", None) is not None:
                pool._maybe_evict_cached_block(block)
        tail = blocks[keep_blocks:]
        del blocks[keep_blocks:]
        pool.free_blocks(reversed(tail))
        for single in manager.coordinator.single_type_managers:
            cached = getattr(single, "num_cached_block", None)
            if cached is not None and request.request_id in cached:
                cached[request.request_id] = min(cached[request.request_id], keep_blocks)
        dropped = getattr(request, DROPPED_ATTRIBUTE, 0) + physical - target
        setattr(request, DROPPED_ATTRIBUTE, dropped)
        tracked.compactions += 1
        if tracked.first_compaction_at is None:
            tracked.first_compaction_at = request.num_computed_tokens
        if self.log_path:  # every compaction, as it happens (a finished request's record may come late)
            self._log({"compaction": request.request_id, "namespace": tracked.namespace,
                       "decode_step": request.num_computed_tokens - request.num_prompt_tokens})
        tracked.tokens_evicted += physical - target
        self._plans[request.request_id] = CompactionPlan(
            physical_tokens=physical, keep_tokens=target, logical_length=request.num_computed_tokens,
            shared_prefix_tokens=shared_blocks * self.block_size, dropped=dropped)

    def after_schedule(self, scheduler: Any, output: Any) -> None:
        """Record block peaks and attach this step's plans for the workers."""
        req_to_blocks = _req_to_blocks(scheduler.kv_cache_manager)
        dropped: dict[str, int] = {}
        for request in scheduler.running:
            tracked = self.requests.get(request.request_id)
            if tracked is None:
                continue
            held = len(req_to_blocks.get(request.request_id, ()))
            tracked.blocks_at_last_step = held
            tracked.peak_blocks = max(tracked.peak_blocks, held)
            value = getattr(request, DROPPED_ATTRIBUTE, 0)
            if value:
                dropped[request.request_id] = value
        setattr(output, PAYLOAD_ATTRIBUTE, step_payload(self._plans, dropped))
        self._plans = {}
        if self.log_path and self._had_requests and not scheduler.running and not scheduler.waiting:
            self._had_requests = False
            self._log({"idle": True, "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                       "start_free_blocks": self.start_free_blocks})

    def on_worker_ready(self, ready: bool) -> None:
        """The worker said whether it can move tokens (no compaction before it can)."""
        self.worker_ready = bool(ready)

    def on_preempt(self, request: Any) -> None:
        """vLLM freed the request's blocks and will recompute it from scratch: physical = logical."""
        setattr(request, DROPPED_ATTRIBUTE, 0)
        tracked = self.requests.get(request.request_id)
        if tracked is not None:
            tracked.blocks_at_last_step = 0
        self._plans.pop(request.request_id, None)

    def on_free(self, request: Any) -> None:
        """The request finished or was aborted; its blocks are back in the pool."""
        setattr(request, DROPPED_ATTRIBUTE, 0)
        tracked = self.requests.pop(request.request_id, None)
        self._plans.pop(request.request_id, None)
        if tracked is not None and self.log_path:
            self._log({"request_id": request.request_id, "namespace": tracked.namespace,
                       "peak_blocks": tracked.peak_blocks, "allowed_blocks": tracked.allowed_blocks,
                       "compactions": tracked.compactions, "first_compaction_at": tracked.first_compaction_at,
                       "tokens_evicted": tracked.tokens_evicted, "num_tokens": request.num_tokens,
                       "num_prompt_tokens": request.num_prompt_tokens,
                       "prompt_token_ids": list(request.prompt_token_ids or ()),
                       "num_preemptions": getattr(request, "num_preemptions", 0),
                       "max_shared_blocks": tracked.max_shared_blocks})

    def _log(self, record: dict) -> None:
        append_enforce_log(self.log_path, record)


def _token_bytes(scheduler: Any) -> int:
    """KV bytes of one token across the group's layers, from vLLM's own cache spec."""
    group = scheduler.kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    return spec.page_size_bytes * len(group.layer_names) // spec.block_size


def _req_to_blocks(manager: Any) -> dict[str, list]:
    return manager.coordinator.single_type_managers[0].req_to_blocks


def _leading_shared_blocks(blocks: list) -> int:
    count = 0
    for block in blocks:
        if getattr(block, "ref_cnt", 1) <= 1:
            break
        count += 1
    return count


def _is_decoding(request: Any) -> bool:
    """Past its prompt, with only the last sampled token to compute (chunked prefill never compacts)."""
    return (request.num_computed_tokens >= request.num_prompt_tokens
            and request.num_tokens - request.num_computed_tokens == 1
            and not getattr(request, "spec_token_ids", None))
