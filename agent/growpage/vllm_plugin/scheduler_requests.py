"""The scheduler side's one owner of requests (:class:`SchedulerRequests`) and the enforcement that
plans each step over it (:class:`SchedulerEnforcer`).

**The requests.** An entry lives from the step a request is first scheduled to the step it finishes
or is aborted, across preemptions. It holds what the request is (prompt, namespace, mode, the blocks
a first run is granted), where its current run stands (the blocks it held after the last step; none
while it is preempted), under enforce what enforcement did to it (:class:`EnforcedRequest`), and the
compaction planned for it this step until the plan rides to the workers.

Everything that happens to a request as a whole happens there, once: its admission to the growth
controller (:meth:`SchedulerRequests.admit`), its preemption (:meth:`~SchedulerRequests.preempted`:
physical length back to logical, its run ended, its prompt to be compressed again, growth-aware
admission told) and its end (:meth:`~SchedulerRequests.finished`: the same, its admission's
history taught its attention need, its enforcement record logged). The agent
(:mod:`~growpage.vllm_plugin.scheduler_agent`) calls these from vLLM's hooks; the growth state
(budget, readings, floors) is the shared controller's, keyed by the same id
(:class:`~growpage.core.controller.GrowthController`).

**Enforce** (EngineCore): decide at block boundaries, free blocks, plan compactions.

vLLM has no API that shrinks a running request's KV, so GrowPage keeps a *physical* length next to
vLLM's logical ``num_computed_tokens`` (see :mod:`~growpage.vllm_plugin.compaction`). Per step:

1. ``before_schedule``: one call to :meth:`~growpage.core.controller.GrowthController.plan_step`
   with a view of every running request (blocks held, whether its blocks are full, protected
   tokens, whether its blocks are its own) answers for the whole step; the enforcer carries it out:

   - ``allocate``: the allowance grows by one block and vLLM allocates it as usual;
   - ``evict``: the request's block list is truncated to the planned pages, the tail blocks go
     back to the pool, ``request.growpage_dropped`` grows by the tokens evicted, and a compaction
     plan for the worker is recorded (the worker moves the survivors before this step's writes);
   - ``quantize`` and ``defer`` cannot be carried out here (``kv_cache_dtype`` is deployment-wide;
     vLLM's scheduler has no "skip this request") and the controller degrades them to ``evict`` or
     ``allocate`` (:data:`VLLM_ACTIONS`); both the decided and the enforced kind are recorded;
   - the reclaims compress other running requests when the pool cannot hold this step's growth
     and the next admission; a boundary that could do nothing itself then grows into the room
     made, or is left to vLLM's preemption.
2. ``KVCacheManager.allocate_slots`` (wrapped) sees ``num_computed_tokens - growpage_dropped`` and
   never hashes a compacted request's blocks again (their content no longer matches the hash chain).
3. ``after_schedule``: the plans and the ``dropped`` of every compacted running request ride to the
   workers on ``SchedulerOutput.growpage`` (:mod:`~growpage.vllm_plugin.wire`).
4. Preemption (recompute from scratch) and finish reset the request's physical accounting:
   :class:`SchedulerRequests` does that, with its admission and this step's plans; the enforcer
   only plans steps over its entries.

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
import time
from collections.abc import Iterator
from typing import Any

from growpage.config import GrowPageConfig, Mode
from growpage.core.admission import StepCostFit, StepCosts
from growpage.core.compression_gate import CompressionGate, StepGate, wider_batch_pays
from growpage.core.controller import GrowthController
from growpage.core.policy import Action, Reason
from growpage.core.step_control import BoundaryPlan, Reclaim, RequestView, StepPool, protected_tokens
from growpage.vllm_plugin.admission import AdmissionGate, compression_of, need_share_at_end
from growpage.vllm_plugin.blocks import (
    blocks_by_request,
    leading_shared_blocks,
    owns_tail,
    physical_tokens,
    room_for_all,
)
from growpage.vllm_plugin.settings import MODE_ARG, request_namespace
from growpage.vllm_plugin.vllm_types import KVBlock, Request, Scheduler
from growpage.vllm_plugin.wire import (
    DROPPED_ATTRIBUTE,
    PAYLOAD_ATTRIBUTE,
    CompactionPlan,
    append_enforce_log,
    enforce_log_path,
    step_payload,
)


@dataclasses.dataclass
class EnforcedRequest:
    """What enforcement did to one request (its growth state is the controller's)."""

    request_id: str
    namespace: str | None
    allowed_blocks: int
    peak_blocks: int = 0
    compactions: int = 0
    tokens_evicted: int = 0
    blocks_at_last_step: int = 0
    first_compaction_at: int | None = None  # logical length when KV first differed from vLLM's
    max_shared_blocks: int = 0  # most leading blocks shared through the prefix cache at a boundary
    prompt_settled: bool = False  # its first decode step was planned (a cap compresses the prompt then, once)


@dataclasses.dataclass
class SchedulerRequest:
    """One request, from its first scheduled step to its end (see the module docstring)."""

    request_id: str
    namespace: str | None
    mode: Mode
    prompt_tokens: int
    grant_pages: int  # blocks a first run is granted before its boundaries start
    pages_held: int | None = None  # blocks after the last step of this run; None: not admitted since (re)start
    enforced: EnforcedRequest | None = None  # under enforce, once the enforcer first planned for it


class SchedulerRequests:
    """Every request the scheduler side knows, by id, and what happens to each as a whole.

    Args:
        controller: the scheduler's growth controller (mode resolution, first grants, admission).
        admission: growth-aware admission, where GrowPage enforces with it (None: vLLM admits on
            its own); it learns from the requests that end here.
        log_path: where each enforced request's record is appended when it ends (the enforce log;
            None: no log).
    """

    def __init__(self, controller: GrowthController, admission: AdmissionGate | None = None,
                 log_path: str | None = None):
        self.controller = controller
        self.admission = admission
        self.log_path = log_path
        self._entries: dict[str, SchedulerRequest] = {}
        self._plans: dict[str, CompactionPlan] = {}  # this step's compactions, until they ride to the workers

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def __getitem__(self, request_id: str) -> SchedulerRequest:
        return self._entries[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, request_id: str) -> SchedulerRequest | None:
        return self._entries.get(request_id)

    def track(self, request: Request) -> SchedulerRequest:
        """The request's entry, made at its first sight: its namespace and mode from its sampling
        parameters, as the deployment resolves them."""
        entry = self._entries.get(request.request_id)
        if entry is None:
            extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
            namespace = request_namespace(extra)
            prompt_tokens = int(request.num_prompt_tokens)
            entry = self._entries[request.request_id] = SchedulerRequest(
                request.request_id, namespace, self.controller.mode_for(namespace, extra.get(MODE_ARG)),
                prompt_tokens, self.controller.grant_pages(prompt_tokens))
        return entry

    def admit(self, request: Request, *, cached_tokens: int = 0, pages_granted: int = 0,
              latency_s: float = 0.0) -> bool:
        """Start the controller's growth state for the request's run (the one admission path of this
        side): False when it is not observed (mode off) or already admitted. The agent admits at a
        run's first step with its grant; the enforcer when it plans for a request first."""
        entry = self.track(request)
        if entry.mode is Mode.OFF or request.request_id in self.controller.requests:
            return False
        self.controller.admit(request.request_id, prompt_tokens=entry.prompt_tokens, namespace=entry.namespace,
                              mode=entry.mode, cached_tokens=cached_tokens, pages_granted=pages_granted,
                              latency_s=latency_s)
        return True

    def enforced(self, request_id: str) -> EnforcedRequest | None:
        """What enforcement did to the request, if it is enforced and was planned for."""
        entry = self._entries.get(request_id)
        return entry.enforced if entry is not None else None

    # ---- admission -----------------------------------------------------------------------------------
    def gate_admission(self, scheduler: Scheduler) -> bool:
        """Set this step's admission limit (growth-aware admission, where it runs); True when the
        oldest waiting request is held back this step (pressure relief then makes no room for it)."""
        if self.admission is None:
            return False
        return self.admission.before_schedule(
            scheduler, blocks_by_request(scheduler.kv_cache_manager),
            lambda request: compression_of(self.controller, request, Mode.ENFORCE))

    # ---- this step's compactions -------------------------------------------------------------------
    def plan_compaction(self, request_id: str, plan: CompactionPlan) -> None:
        """The enforcer compacted the request's blocks this step; the workers move its KV by ``plan``."""
        self._plans[request_id] = plan

    def take_plans(self) -> dict[str, CompactionPlan]:
        """This step's plans, handed over once (to the step's payload)."""
        plans, self._plans = self._plans, {}
        return plans

    # ---- a request's run ends ------------------------------------------------------------------------
    def preempted(self, request: Request) -> None:
        """vLLM freed the request's blocks and will recompute it from scratch: its physical length is
        its logical one again, no plan moves its KV, its run ends; its entry stays (enforcement's
        record spans its life) and a cap compresses its prompt again when it is recomputed."""
        self._forget_physical(request)
        if self.admission is not None:
            self.admission.on_preempt()
        entry = self._entries.get(request.request_id)
        if entry is None:
            return
        entry.pages_held = None
        if entry.enforced is not None:
            entry.enforced.blocks_at_last_step = 0
            entry.enforced.prompt_settled = False

    def finished(self, request: Request) -> SchedulerRequest | None:
        """The request finished or was aborted (its blocks are back in the pool): its entry goes,
        growth-aware admission learns its attention need, and its enforcement record is logged.
        Call it before the controller releases the request (the need is the controller's)."""
        self._forget_physical(request)
        entry = self._entries.pop(request.request_id, None)
        if self.admission is not None:
            self.admission.on_finish(request, need_share_at_end(self.controller, request))
        tracked = entry.enforced if entry is not None else None
        if tracked is not None and self.log_path:
            append_enforce_log(self.log_path, {
                "request_id": request.request_id, "namespace": tracked.namespace,
                "peak_blocks": tracked.peak_blocks, "allowed_blocks": tracked.allowed_blocks,
                "compactions": tracked.compactions, "first_compaction_at": tracked.first_compaction_at,
                "tokens_evicted": tracked.tokens_evicted, "num_tokens": request.num_tokens,
                "num_prompt_tokens": request.num_prompt_tokens,
                "prompt_token_ids": list(request.prompt_token_ids or ()),
                "num_preemptions": getattr(request, "num_preemptions", 0),
                "max_shared_blocks": tracked.max_shared_blocks})
        return entry

    def _forget_physical(self, request: Request) -> None:
        """vLLM's blocks for the request are gone: nothing GrowPage dropped stands, nothing is to move."""
        setattr(request, DROPPED_ATTRIBUTE, 0)
        self._plans.pop(request.request_id, None)


logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format


VLLM_ACTIONS = frozenset((Action.ALLOCATE, Action.EVICT, Action.PREEMPT))
"""What vLLM's scheduler can carry out: ``kv_cache_dtype`` is deployment-wide (no per-request
quantization) and it has no "skip this request this step"."""


@dataclasses.dataclass
class _Running:
    """One running request's blocks as this step starts, and what follows from them."""

    request: Request
    tracked: EnforcedRequest | None
    blocks: list
    block_size: int
    physical: int = 0  # tokens its blocks hold as the step starts (vLLM's count less what compaction dropped)

    def __post_init__(self) -> None:
        self.physical = physical_tokens(self.request)

    @property
    def decoding(self) -> bool:
        return _is_decoding(self.request)

    @property
    def at_boundary(self) -> bool:
        """Its blocks are full: this step's token needs a new one."""
        physical = self.physical
        return (self.decoding and physical > 0 and physical % self.block_size == 0
                and len(self.blocks) * self.block_size == physical)

    @property
    def shared_blocks(self) -> int:
        return leading_shared_blocks(self.blocks)

    @property
    def private_tail(self) -> bool:
        """No block after the shared prefix is shared (compaction rewrites only its own blocks)."""
        return owns_tail(self.blocks, self.shared_blocks)


class SchedulerEnforcer:
    """GrowPage's enforcement state for one vLLM ``Scheduler`` (see the module docstring).

    Args:
        controller: the scheduler's growth controller, shared with
            :class:`~growpage.vllm_plugin.scheduler_agent.SchedulerAgent` (admission, readings,
            decisions and their stats are its).
        requests: the scheduler side's owner of requests, shared with the agent: their entries,
            growth-aware admission, this step's plans and the enforce log (a new one, admitting as
            vLLM does, when the enforcer runs alone, as in tests).
        grow_with_room_for_all: tell the controller and the workers when the pool holds every
            request at its full length (``PluginSettings.grow_with_room_for_all``).
        step_costs: the engine's measured step costs (the scheduler's step meter), which price a
            preempted request's recompute for the compression gate.
        compression_gate: leave decode-time compression idle while it buys neither a wider batch
            nor a dear recompute (:mod:`growpage.core.compression_gate`;
            ``PluginSettings.compression_gate``, on in the plugin); False compresses as the
            contract decides at every boundary, as the tests of compaction do.
    """

    def __init__(self, controller: GrowthController, requests: SchedulerRequests | None = None,
                 grow_with_room_for_all: bool = True, *, step_costs: StepCostFit | None = None,
                 compression_gate: bool = False):
        self.controller = controller
        self.config: GrowPageConfig = controller.config
        self.block_size = self.config.block_size
        self.requests = (requests if requests is not None
                         else SchedulerRequests(controller, log_path=enforce_log_path()))
        # {(decided, enforced): count}: decisions vLLM could not carry out as decided
        self.degraded_total: collections.Counter[tuple[str, str]] = collections.Counter()
        self.start_free_blocks: int | None = None
        self._had_requests = False
        self.worker_ready = False  # no compaction before the worker says it can move tokens
        # this step's pool holds every request at its full length (core.step_control.holds_everyone):
        # boundaries grow and the workers observe only prompt ends (wire.StepPayload.prompts_only)
        self.room_for_all = False
        self.grow_with_room_for_all = grow_with_room_for_all
        self.step_costs = step_costs
        # its verdict each step: idle, boundaries grow or leave the request to vLLM's preemption, no
        # relief, and the workers observe only prompt ends
        self.gate = StepGate(CompressionGate() if compression_gate and controller.method.idles_unpaid else None)

    # ---- per step -------------------------------------------------------------------------------
    def before_schedule(self, scheduler: Scheduler, *, admission_held: bool = False) -> None:
        """One controller call for the step (boundaries and pressure relief, with the pool's pressure
        in view), carried out before vLLM's scheduling (and preemption) runs. ``admission_held``: the
        oldest waiting request is held this step, so no room is made for it."""
        pool = scheduler.kv_cache_manager.block_pool
        if self.start_free_blocks is None:
            self.start_free_blocks = pool.get_num_free_blocks()
        req_to_blocks = blocks_by_request(scheduler.kv_cache_manager)
        running: dict[str, _Running] = {}
        for request in list(scheduler.running):
            tracked = self._track(request)
            blocks = req_to_blocks.get(request.request_id)
            if blocks is not None:
                running[request.request_id] = _Running(request, tracked, blocks, self.block_size)
        idle = self.gate.step(dropped_tokens=sum(getattr(r.request, DROPPED_ATTRIBUTE, 0) for r in running.values()),
                              pages_held=[len(r.blocks) for r in running.values()], block_size=self.block_size,
                              costs=self._step_costs)
        step_pool = self._step_pool(scheduler, req_to_blocks, admission_held, compression_idle=idle)
        self.room_for_all = step_pool.room_for_all
        if idle and not any(r.at_boundary or (r.tracked is not None and not r.tracked.prompt_settled)
                            for r in running.values()):
            # idle, with no boundary and no prompt just cached: the controller would plan nothing (no
            # relief while idle), and most idle steps are such, so their views are not built
            return
        control = self.controller.plan_step(
            step_pool, [self._view(r) for r in running.values()],
            enforceable=VLLM_ACTIONS,
            decide_modes=frozenset((Mode.ENFORCE,)))
        for plan in control.boundaries:
            self._boundary(scheduler, running[plan.request_id], plan)
        for compression in control.prompt_compressions:
            self._reclaim(scheduler, running[compression.request_id], compression, Reason.PROMPT_BUDGET)
        for reclaim in control.reclaims:
            self._reclaim(scheduler, running[reclaim.request_id], reclaim)
        for entry in running.values():
            if entry.tracked is not None and entry.decoding:
                entry.tracked.prompt_settled = True
        for plan in control.boundaries:
            if plan.action is Action.PREEMPT:
                # the fallback, on the pool as it is now: compressing the others made room, or
                # vLLM's preemption is the last resort
                action = Action.ALLOCATE if pool.get_num_free_blocks() >= 1 else Action.PREEMPT
                held = len(running[plan.request_id].blocks)
                self._record_boundary(plan, action, held, held + 1 if action is Action.ALLOCATE else held)

    @property
    def compression_idle(self) -> bool:
        """Decode-time compression is idle this step (the compression gate's verdict)."""
        return self.gate.idle

    def note_preemption(self, request: Request) -> None:
        """vLLM preempted ``request``: its tokens are recomputed when it runs again (the gate prices them)."""
        self.gate.note_preemption(int(getattr(request, "num_tokens", 0) or 0))

    def _step_costs(self) -> StepCosts | None:
        return self.step_costs.costs() if self.step_costs is not None else None

    def _step_pool(self, scheduler: Scheduler, req_to_blocks: dict[str, list[KVBlock]],
                   admission_held: bool = False, compression_idle: bool = False) -> StepPool:
        pool = scheduler.kv_cache_manager.block_pool
        waiting = None if admission_held else next(iter(scheduler.waiting), None)
        max_seqs = getattr(getattr(scheduler, "scheduler_config", None), "max_num_seqs", None)
        free = pool.get_num_free_blocks()
        return StepPool(free_pages=free,
                        total_pages=getattr(pool, "num_gpu_blocks", 1 << 30) - 1,  # block 0 is vLLM's null block
                        waiting_prompt_tokens=waiting.num_prompt_tokens if waiting is not None else None,
                        batch_full=max_seqs is not None and len(scheduler.running) >= max_seqs,
                        room_for_all=self.grow_with_room_for_all and room_for_all(
                            free, scheduler.running, scheduler.waiting, req_to_blocks, self.block_size),
                        compression_idle=compression_idle,
                        # priced only where it is read: a request waits while compression idles
                        wider_batch_pays=(not compression_idle or waiting is None
                                          or wider_batch_pays(self._step_costs(), len(scheduler.running))))

    def _view(self, running: _Running) -> RequestView:
        """A running request as the controller sees it: a decoding one needs a block when its blocks
        are full; only enforced requests whose blocks vLLM alone holds (past a shared prefix) are
        compressible, and only once the worker can move tokens."""
        held = len(running.blocks)
        if not running.decoding:
            return RequestView(running.request.request_id, pages_held=held, allowance_pages=held, needs_page=False)
        config = self.config
        compressible = running.tracked is not None and running.private_tail and self.worker_ready
        return RequestView(
            running.request.request_id, pages_held=held,
            allowance_pages=running.tracked.allowed_blocks if running.tracked is not None else held,
            needs_page=running.at_boundary,
            protected_tokens=protected_tokens(running.physical, running.shared_blocks * self.block_size,
                                              config.sink_tokens, config.recent_window_tokens),
            compressible=compressible, can_evict=compressible,
            can_quantize=True,  # what the contract wants; vLLM cannot quantize per request (degraded)
            prompt_uncompressed=running.tracked is not None and not running.tracked.prompt_settled)

    def _reclaim(self, scheduler: Scheduler, running: _Running, reclaim: Reclaim,
                 reason: Reason = Reason.POOL_PRESSURE) -> None:
        """Compress a running request to the controller's pages: under pool pressure so vLLM need not
        preempt (core.step_control), or a fixed cap's cached prompt to its cap (``PROMPT_BUDGET``)."""
        tracked = running.tracked
        target = (reclaim.pages_after - 1) * self.block_size
        if tracked is None or target >= running.physical:
            return
        started = time.perf_counter()
        held = len(running.blocks)
        token_bytes = _token_bytes(scheduler)
        self._compact(scheduler, running, target)
        # a cap's prompt compression sets where its boundaries start; pressure relief keeps what was granted
        tracked.allowed_blocks = (reclaim.pages_after if reason is Reason.PROMPT_BUDGET
                                  else max(tracked.allowed_blocks, reclaim.pages_after))
        self.controller.stats.record_compression(running.physical * token_bytes, target * token_bytes)
        self.controller.record_eviction(
            reclaim.request_id, pages_before=held, pages_after=reclaim.pages_after,
            bytes_in=running.physical * token_bytes, bytes_out=target * token_bytes, started_perf_s=started,
            reason=reason)

    def _track(self, request: Request) -> EnforcedRequest | None:
        """The request's enforcement record, started the first time the enforcer plans for it
        (None: not enforced)."""
        entry = self.requests.track(request)
        self._had_requests = True
        if entry.mode is not Mode.ENFORCE or entry.enforced is not None:
            return entry.enforced
        self.requests.admit(request)  # no-op where the scheduler agent admitted it first
        entry.enforced = EnforcedRequest(request.request_id, entry.namespace, allowed_blocks=entry.grant_pages)
        return entry.enforced

    def _boundary(self, scheduler: Scheduler, running: _Running, plan: BoundaryPlan) -> None:
        """Carry out one boundary's plan (a PREEMPT plan is settled after the reclaims)."""
        tracked = running.tracked
        assert tracked is not None, "boundaries are planned for enforced requests only"
        tracked.max_shared_blocks = max(tracked.max_shared_blocks, running.shared_blocks)
        if plan.action is Action.PREEMPT:
            return
        held = len(running.blocks)
        bytes_in = bytes_out = 0
        if plan.action is Action.EVICT:
            target = (plan.pages_after - 1) * self.block_size  # vLLM allocates the next token's block
            self._compact(scheduler, running, target)
            token_bytes = _token_bytes(scheduler)
            bytes_in, bytes_out = running.physical * token_bytes, target * token_bytes
            self.controller.stats.record_compression(bytes_in, bytes_out)
        self._record_boundary(plan, plan.action, held, plan.pages_after, bytes_in, bytes_out)

    def _record_boundary(self, plan: BoundaryPlan, action: Action, held: int, pages_after: int,
                         bytes_in: int = 0, bytes_out: int = 0) -> None:
        call = plan.call
        if action is not call.decision.action:
            self.degraded_total[(call.decision.action.value, action.value)] += 1
        tracked = self.requests.enforced(plan.request_id)
        if action is Action.ALLOCATE and tracked is not None:
            tracked.allowed_blocks = held + 1
        self.controller.record_decision(call, kind=action, enforced=True, pages_after=pages_after,
                                        bytes_in=bytes_in, bytes_out=bytes_out)

    def _compact(self, scheduler: Scheduler, running: _Running, target: int) -> None:
        request, tracked, blocks = running.request, running.tracked, running.blocks
        assert tracked is not None, "only enforced requests are compacted"
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        keep_blocks = target // self.block_size
        # NOTE: unhash before rewriting or freeing: a hit on a block whose content moved would be wrong.
        for block in blocks[running.shared_blocks:]:
            if getattr(block, "block_hash", None) is not None:
                pool._maybe_evict_cached_block(block)
        tail = blocks[keep_blocks:]
        del blocks[keep_blocks:]
        pool.free_blocks(reversed(tail))
        for single in manager.coordinator.single_type_managers:
            cached = getattr(single, "num_cached_block", None)
            if cached is not None and request.request_id in cached:
                cached[request.request_id] = min(cached[request.request_id], keep_blocks)
        physical = running.physical
        dropped = getattr(request, DROPPED_ATTRIBUTE, 0) + physical - target
        setattr(request, DROPPED_ATTRIBUTE, dropped)
        tracked.compactions += 1
        if tracked.first_compaction_at is None:
            tracked.first_compaction_at = request.num_computed_tokens
        if self.requests.log_path:  # every compaction, as it happens (a finished request's record may come late)
            self._log({"compaction": request.request_id, "namespace": tracked.namespace,
                       "decode_step": request.num_computed_tokens - request.num_prompt_tokens,
                       "gate": self.gate.reason})
        tracked.tokens_evicted += physical - target
        self.requests.plan_compaction(request.request_id, CompactionPlan(
            physical_tokens=physical, keep_tokens=target, logical_length=request.num_computed_tokens,
            shared_prefix_tokens=running.shared_blocks * self.block_size, dropped=dropped,
            prompt_tokens=request.num_prompt_tokens))

    def after_schedule(self, scheduler: Scheduler, output: Any) -> None:
        """Record block peaks and attach this step's plans for the workers."""
        req_to_blocks = blocks_by_request(scheduler.kv_cache_manager)
        dropped: dict[str, int] = {}
        for request in scheduler.running:
            tracked = self.requests.enforced(request.request_id)
            if tracked is None:
                continue
            held = len(req_to_blocks.get(request.request_id, ()))
            tracked.blocks_at_last_step = held
            tracked.peak_blocks = max(tracked.peak_blocks, held)
            value = getattr(request, DROPPED_ATTRIBUTE, 0)
            if value:
                dropped[request.request_id] = value
        setattr(output, PAYLOAD_ATTRIBUTE, step_payload(self.requests.take_plans(), dropped,
                                                        self.room_for_all or self.compression_idle))
        if self.requests.log_path and self._had_requests and not scheduler.running and not scheduler.waiting:
            self._had_requests = False
            self._log({"idle": True, "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                       "start_free_blocks": self.start_free_blocks})

    def on_worker_ready(self, ready: bool) -> None:
        """The worker said whether it can move tokens (no compaction before it can)."""
        self.worker_ready = bool(ready)

    def _log(self, record: dict) -> None:
        append_enforce_log(self.requests.log_path, record)


def _token_bytes(scheduler: Scheduler) -> int:
    """KV bytes of one token across the group's layers, from vLLM's own cache spec."""
    group = scheduler.kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    return spec.page_size_bytes * len(group.layer_names) // spec.block_size


def _is_decoding(request: Request) -> bool:
    """Past its prompt, with only the last sampled token to compute (chunked prefill never compacts)."""
    return (request.num_computed_tokens >= request.num_prompt_tokens
            and request.num_tokens - request.num_computed_tokens == 1
            and not getattr(request, "spec_token_ids", None))
