"""The GrowPage controller: everything per request that does not depend on where the KV lives.

Both homes (the reference engine's :class:`~growpage.engine.kv.manager.GrowPageManager` and the vLLM
plugin's scheduler and worker hooks) own one :class:`GrowthController` and call it the way vLLM's
scheduler calls its ``KVCacheManager``: they supply views (pages held, the pool's free pages, what
compression could free) and carry out the decisions; the controller owns

- the admission grant (:meth:`GrowthController.grant_pages`, :meth:`GrowthController.admit`);
- the boundary routine: growth-budget refill -> :class:`~growpage.core.policy.BoundaryState` ->
  the method's ``decide`` -> one decision event (:meth:`decide`, then :meth:`record_decision`);
- the per-step call (:meth:`GrowthController.plan_step`): pool pressure, the growth reserve,
  floors, every boundary's enforceable action with its fallback, and the reclaims
  (:mod:`growpage.core.step_control`); homes translate their state into views and carry it out;
- which layers are observed (:func:`observed_layer_indices`);
- the fault guard (:class:`~growpage.core.faults.FaultGuard`, the one every component uses): a
  fault inside GrowPage is counted in ``growpage_agent_errors_total`` and its traceback logged the
  first time per component only (:meth:`fault`, :meth:`guard`);
- pool gauges, stats snapshots and lifecycle listeners (through its :class:`StatsRecorder`).

It holds no tensors: summaries are read where attention is observed (the same process in the
reference engine, the worker in vLLM) and handed in as readings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from growpage.config import GrowPageConfig, Mode
from growpage.core.faults import FaultGuard
from growpage.core.methods import GROWPAGE, KVMethod
from growpage.core.policy import Action, BoundaryState, Reason, capacity_boundary_pages, refill_growth_budget
from growpage.core.stats import AdmitEvent, DecisionEvent, FinishEvent, PoolGauges, StatsRecorder, StatsSnapshot
from growpage.core.step_control import (
    ALL_ACTIONS,
    BoundaryCall,
    BoundaryPlan,
    ControlledRequest,
    Reclaim,
    RequestView,
    StepControl,
    StepPool,
    admission_blocked,
    compression_pays,
    enforceable_action,
    evict_pages_after,
    floor_pages,
    growth_reserve,
    measure_pressure,
    plan_reclaim,
    reclaim_candidates,
    request_floor,
)

_LOGGER = logging.getLogger(__name__)


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` for non-negative integers (pages for a token count)."""
    return -(-numerator // denominator)


def observed_layer_indices(num_layers: int, count: int) -> frozenset[int]:
    """The ``count`` decoder layers whose attention feeds the summaries.

    Evenly spaced interior layers (``round((i + 1) * L / (count + 1))``): 30 layers, 3 observed ->
    {8, 15, 22}. The first and last layers are skipped on purpose: the first attends almost
    uniformly (positional mixing) and the last mostly to the newest tokens, so neither says which
    older tokens a request still needs. ``count >= num_layers`` observes every layer.
    """
    if num_layers <= 0:
        raise ValueError(f"num_layers must be positive, got {num_layers}")
    count = max(1, count)
    if count >= num_layers:
        return frozenset(range(num_layers))
    return frozenset(round((i + 1) * num_layers / (count + 1)) % num_layers for i in range(count))


class StatsSource(Protocol):
    """What :class:`~growpage.telemetry.TelemetryAgent` reads from a home (both homes implement it)."""

    @property
    def config(self) -> GrowPageConfig: ...

    @property
    def stats(self) -> StatsRecorder: ...

    @property
    def device_name(self) -> str: ...

    def clock(self) -> float: ...

    def make_stats(self) -> StatsSnapshot: ...


@dataclasses.dataclass(frozen=True)
class PoolView:
    """The pool as one boundary sees it.

    Attributes:
        free_pages: pages no request holds.
        admission_reserve_pages: free pages kept for waiting requests' admission (pool pressure):
            growth sees ``free_pages - admission_reserve_pages``.
    """

    free_pages: int
    admission_reserve_pages: int = 0


@dataclasses.dataclass(frozen=True)
class Reading:
    """A request's summaries as the policy reads them."""

    sts_density: float
    lts_entropy: float


def _free_pages_change(plan: BoundaryPlan, view: RequestView) -> int:
    """How a boundary's action changes the pool's free pages this step (its next token's page included)."""
    if not plan.enforced:
        return -1  # the engine's own paging grows it
    if plan.action is Action.ALLOCATE:
        return -1
    if plan.action is Action.EVICT:
        return view.pages_held - plan.pages_after
    return 0  # quantize frees a page and writes into it; defer and preempt take none now


class GrowthController:
    """One home's per-request GrowPage logic (see the module docstring).

    Args:
        config: validated config; ``method.configure`` adjusts it for comparison methods.
        num_layers: decoder layers of the model (for the observed-layer choice); None where this
            home observes nothing (vLLM's scheduler decides from the worker's readings).
        clock: monotonic seconds (the growth throttle; injected so tests control time).
        method: what happens at page boundaries (GrowPage's contract unless a benchmark compares).
        stats: where events are recorded (a fresh recorder by default).
        logger: where the first fault per component is logged.
    """

    def __init__(self, config: GrowPageConfig, *, num_layers: int | None, clock: Callable[[], float] = time.monotonic,
                 method: KVMethod = GROWPAGE, stats: StatsRecorder | None = None,
                 logger: logging.Logger | None = None):
        self.method = method
        self.config = method.configure(config)
        self.clock = clock
        self.stats = stats if stats is not None else StatsRecorder()
        self.observed_layers = (observed_layer_indices(num_layers, self.config.observed_layers)
                                if num_layers is not None else frozenset())
        self.requests: dict[str, ControlledRequest] = {}
        self.faults = FaultGuard(self.stats.record_error, logger or _LOGGER,
                                 suffix="the engine carries on; further faults are counted in "
                                        "growpage_agent_errors_total, not logged")

    # ---- admission --------------------------------------------------------------------------------
    def mode_for(self, namespace: str | None, requested: Mode | str | None = None) -> Mode:
        return self.config.mode_for(namespace, requested)

    def prompt_pages(self, num_prompt_tokens: int) -> int:
        """Pages the prompt and the first generated token occupy."""
        return ceil_div(num_prompt_tokens + 1, self.config.block_size)

    def grant_pages(self, num_prompt_tokens: int) -> int:
        """Pages granted at admission: the prompt's pages (on demand, as vLLM admits), or
        ``max(base_pages, prompt pages)`` under reserving admission."""
        pages = self.prompt_pages(num_prompt_tokens)
        return max(self.config.base_pages, pages) if self.method.reserve_base_pages else pages

    def admit(self, request_id: str, *, prompt_tokens: int, namespace: str | None = None,
              mode: Mode | str | None = None, cached_tokens: int = 0, pages_granted: int = 0,
              latency_s: float = 0.0) -> ControlledRequest:
        """Start controlling a request (its pages were granted by the home). Records the admission."""
        if request_id in self.requests:
            raise RuntimeError(f"request {request_id!r} is already admitted; release it first")
        resolved = self.mode_for(namespace, mode)
        now = self.clock()
        request = ControlledRequest(
            request_id=request_id, namespace=namespace, mode=resolved, prompt_tokens=prompt_tokens,
            base_pages=self.config.base_pages, last_refill_s=now,
            growth_budget_pages=refill_growth_budget(0.0, max(pages_granted, 1), math.inf,
                                                     self.config.max_growth_rate))
        self.requests[request_id] = request
        self.stats.record_admit(AdmitEvent(
            request_id=request_id, namespace=namespace, mode=resolved.value, prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens, pages_granted=pages_granted, latency_s=latency_s, time_s=now))
        return request

    # ---- summaries --------------------------------------------------------------------------------
    def update_reading(self, request_id: str, reading: Reading) -> None:
        request = self.requests.get(request_id)
        if request is not None:
            request.sts_density, request.lts_entropy = float(reading.sts_density), float(reading.lts_entropy)
            request.observed = True

    def update_attention_need(self, request_id: str, tokens: int) -> None:
        """The tokens a request's observed attention needs (``attention_coverage``): its floor never
        goes below them. Only the highest need counts: after a compaction the home measures shares
        of what survived, which would let each compaction justify the next."""
        request = self.requests.get(request_id)
        if request is not None:
            request.attention_tokens = max(request.attention_tokens, int(tokens))

    def floor_of(self, view: RequestView) -> int:
        """The fewest pages ``view`` may be compressed to this step: :func:`request_floor`, raised to
        what its attention needs."""
        request = self.requests.get(view.request_id)
        need = request.attention_tokens if request is not None else 0
        return request_floor(view, self.config.base_pages, self.config.block_size, need)

    # ---- the boundary routine ---------------------------------------------------------------------
    def decide(self, request_id: str, *, pages_held: int, pool: PoolView, can_quantize: bool,
               can_evict: bool, reading: Reading | None = None, compression_pays: bool = True,
               room_for_all: bool = False, compression_idle: bool = False, commit: bool = True) -> BoundaryCall:
        """Refill the request's growth budget and run the contract on one boundary (``commit``
        False: a preview that leaves the request's budget as it was, for a forecast)."""
        started = time.perf_counter()
        request = self.requests[request_id]
        if reading is not None:
            self.update_reading(request_id, reading)
        now = self.clock()
        budget = refill_growth_budget(
            request.growth_budget_pages, pages_held, now - request.last_refill_s, self.config.max_growth_rate)
        if commit:
            request.growth_budget_pages, request.last_refill_s = budget, now
        state = BoundaryState(
            pages_held=pages_held, base_pages=request.base_pages, sts_density=request.sts_density,
            lts_entropy=request.lts_entropy, pool_free_pages=pool.free_pages,
            growth_budget_pages=budget, can_quantize=can_quantize, can_evict=can_evict,
            admission_reserve_pages=min(pool.admission_reserve_pages, pool.free_pages),
            compression_pays=compression_pays, room_for_all=room_for_all, compression_idle=compression_idle)
        boundary = capacity_boundary_pages(request.base_pages, request.lts_entropy, self.config.growth_coefficient)
        return BoundaryCall(request, state, self.method.decide(state, self.config), boundary, started, now)

    # ---- the per-step call -------------------------------------------------------------------------
    def plan_step(self, pool: StepPool, views: Sequence[RequestView], *,
                  enforceable: frozenset[Action] = ALL_ACTIONS,
                  decide_modes: frozenset[Mode] = frozenset((Mode.MONITOR, Mode.ENFORCE))) -> StepControl:
        """Decide one step for a home: pressure, reserve, boundaries, reclaims (see :mod:`~growpage.core.step_control`).

        Args:
            pool: the pool as the step starts.
            views: every running request (uncontrolled ones count for growth and floors only).
            enforceable: the actions the home can carry out; the others degrade.
            decide_modes: modes whose boundaries are decided here (a home that records monitored
                boundaries after its engine grew them passes only ENFORCE).
        """
        base = self.config.base_pages
        floors = {v.request_id: self.floor_of(v) for v in views}
        waiting = pool.waiting_prompt_tokens
        pressure = measure_pressure(
            free_pages=pool.free_pages, total_pages=pool.total_pages, growth_pages=sum(v.needs_page for v in views),
            running_floor_pages=sum(floors.values()),
            waiting_prompt_pages=self.grant_pages(waiting) if waiting is not None else None,
            waiting_floor_pages=base if waiting is not None else 0, batch_full=pool.batch_full)
        reserve = growth_reserve(pressure)
        idle = pool.compression_idle and self.method.idles_unpaid
        blocked = admission_blocked(pressure, compression_idle=idle, wider_batch_pays=pool.wider_batch_pays)
        prompts = [c for c in (self.prompt_compression(v, admission_blocked=blocked) for v in views) if c is not None]
        compressed = {c.request_id for c in prompts}
        free = pool.free_pages + sum(c.pages_gained for c in prompts)
        boundaries, free = self._plan_boundaries([v for v in views if v.request_id not in compressed], free,
                                                 reserve, enforceable, decide_modes, compression_pays(pressure),
                                                 pool.room_for_all, idle)
        waiting_for_room = [b for b in boundaries if b.enforced and b.action is Action.PREEMPT]
        # idle, the engine's preemption makes room, as it would without GrowPage
        deficit = 0 if idle else max(0, len(waiting_for_room) + pressure.admission_pages - free)
        settled = {b.request_id for b in boundaries} | compressed
        reclaims = self.plan_relief(deficit, [v for v in views if v.request_id not in settled])
        free += sum(r.pages_gained for r in reclaims)
        settled_plans = []
        for plan in boundaries:
            if plan in waiting_for_room:  # grows if the reclaims made room, else the engine preempts
                plan = dataclasses.replace(plan, fallback=Action.ALLOCATE if free >= 1 else Action.PREEMPT)
                free -= plan.fallback is Action.ALLOCATE
            settled_plans.append(plan)
        return StepControl(pressure=pressure, reserve_pages=reserve, boundaries=tuple(settled_plans),
                           reclaims=tuple(reclaims), prompt_compressions=tuple(prompts))

    def prompt_compression(self, view: RequestView, *, admission_blocked: bool = False) -> Reclaim | None:
        """A just-cached prompt compressed once to its floor (its attention need included): always
        for the fixed caps (SnapKV-style, to the cap); for GrowPage only when ``admission_blocked``
        (a waiting request the pool cannot admit: compressing widens the batch) and its floor
        follows its attention (``attention_coverage`` > 0: the scores say what the answer needs;
        with the floor alone they say nothing, and the prompt stays whole). None otherwise."""
        request = self.requests.get(view.request_id)
        for_admission = (admission_blocked and self.method.compress_prompt_for_admission
                         and self.config.attention_coverage > 0)
        wanted = self.method.compress_prompt or for_admission
        if (request is None or request.mode is not Mode.ENFORCE or not wanted
                or not view.prompt_uncompressed or not view.compressible):
            return None
        pages_after = self.floor_of(view)
        # net of the page its next token then takes
        gained = view.pages_held - pages_after
        return Reclaim(view.request_id, pages_after, gained) if gained > 0 else None

    def plan_relief(self, pages_needed: int, views: Sequence[RequestView]) -> list[Reclaim]:
        """Which of ``views`` compress, and to what, so ``pages_needed`` pages come free (enforced,
        compressible requests only, lowest LTS first, never below a floor); empty for methods that
        leave pressure to the engine."""
        if pages_needed <= 0 or not self.method.relieves_pressure:
            return []
        enforced = [v for v in views if (c := self.requests.get(v.request_id)) is not None and c.mode is Mode.ENFORCE]
        floors = {v.request_id: self.floor_of(v) for v in enforced}
        lts = {v.request_id: self.requests[v.request_id].lts_entropy for v in enforced}
        return plan_reclaim(pages_needed, reclaim_candidates(enforced, floors, lts))

    def _plan_boundaries(self, views: Sequence[RequestView], free: int, reserve: int, enforceable: frozenset[Action],
                         decide_modes: frozenset[Mode], pays: bool,
                         room_for_all: bool = False, idle: bool = False) -> tuple[list[BoundaryPlan], int]:
        """Every boundary's plan in order, each seeing the pool the ones before it left; and the free
        pages projected once this step's growth is done."""
        boundaries = []
        for view in views:
            control = self.requests.get(view.request_id)
            if control is None or control.mode not in decide_modes or not view.at_boundary:
                free -= view.needs_page  # the engine's own paging grows it
                continue
            plan = self.plan_boundary(view, free_pages=free, reserve_pages=reserve, enforceable=enforceable,
                                      compression_pays=pays or free < 1, room_for_all=room_for_all,
                                      compression_idle=idle)
            free += _free_pages_change(plan, view)
            boundaries.append(plan)
        return boundaries, free

    def plan_boundary(self, view: RequestView, *, free_pages: int, reserve_pages: int = 0,
                      enforceable: frozenset[Action] = ALL_ACTIONS, compression_pays: bool = True,
                      room_for_all: bool = False, compression_idle: bool = False, commit: bool = True) -> BoundaryPlan:
        """Run the contract on one boundary and say what the home carries out (see :class:`BoundaryPlan`;
        ``commit`` False: a preview that changes no request state)."""
        request = self.requests[view.request_id]
        to_free = self.method.pages_to_free(view.pages_held, request.base_pages, self.config.evict_min_pages)
        floor = floor_pages(request.base_pages, view.protected_tokens, self.config.block_size,
                            request.attention_tokens)
        evicted_pages = evict_pages_after(view, floor=floor, pages_to_free=to_free)
        call = self.decide(view.request_id, pages_held=view.pages_held, pool=PoolView(free_pages, reserve_pages),
                           can_quantize=view.can_quantize, can_evict=evicted_pages is not None,
                           compression_pays=compression_pays, room_for_all=room_for_all,
                           compression_idle=compression_idle, commit=commit)
        enforced = request.mode is Mode.ENFORCE
        action = call.decision.action
        if enforced:
            action = enforceable_action(action, can_evict=evicted_pages is not None, free_pages=free_pages,
                                        enforceable=enforceable)
        pages_after = {Action.ALLOCATE: view.pages_held + 1, Action.EVICT: evicted_pages}.get(action)
        return BoundaryPlan(call=call, action=action, enforced=enforced,
                            fallback=Action.ALLOCATE if free_pages >= 1 else Action.PREEMPT,
                            pages_after=view.pages_held if pages_after is None else pages_after)

    def record_decision(self, call: BoundaryCall, *, kind: Action, enforced: bool, pages_after: int,
                        bytes_in: int = 0, bytes_out: int = 0) -> DecisionEvent:
        """Record what happened at a boundary (``kind`` may differ from the decision when a home
        cannot carry it out, e.g. vLLM cannot quantize per request). An enforced allocation
        spends one page of the growth budget."""
        if enforced and kind is Action.ALLOCATE:
            call.request.growth_budget_pages = max(0.0, call.request.growth_budget_pages - 1.0)
        decision = call.decision
        event = DecisionEvent(
            request_id=call.request.request_id, namespace=call.request.namespace, kind=kind.value,
            refusal=decision.refusal.value if decision.refusal else None, reason=decision.reason.value,
            enforced=enforced, pages_before=call.state.pages_held, pages_after=pages_after,
            sts_density=call.state.sts_density, lts_entropy=call.state.lts_entropy,
            capacity_boundary_pages=call.capacity_boundary_pages, bytes_in=bytes_in, bytes_out=bytes_out,
            duration_s=time.perf_counter() - call.started_perf_s, time_s=call.time_s)
        self.stats.record_decision(event)
        return event

    def record_eviction(self, request_id: str, *, pages_before: int, pages_after: int, bytes_in: int,
                        bytes_out: int, started_perf_s: float, reason: Reason,
                        kind: Action = Action.EVICT) -> DecisionEvent:
        """A compression outside a boundary: a fixed-budget method compressed a cached prompt down
        to its budget (``PROMPT_BUDGET``), or pool pressure compressed a running request so the pool
        holds this step (``POOL_PRESSURE``; ``kind`` QUANTIZE when it quantized old pages first)."""
        request = self.requests[request_id]
        event = DecisionEvent(
            request_id=request_id, namespace=request.namespace, kind=kind.value, refusal=None,
            reason=reason.value, enforced=True, pages_before=pages_before, pages_after=pages_after,
            sts_density=request.sts_density, lts_entropy=request.lts_entropy,
            capacity_boundary_pages=float(request.base_pages), bytes_in=bytes_in, bytes_out=bytes_out,
            duration_s=time.perf_counter() - started_perf_s, time_s=self.clock())
        self.stats.record_decision(event)
        return event

    # ---- release ----------------------------------------------------------------------------------
    def release(self, request_id: str, reason: str, *, num_tokens: int) -> ControlledRequest | None:
        """Stop controlling a request (finished, aborted or preempted). Idempotent."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        lts = request.lts_entropy if request.observed else None
        self.stats.record_finish(FinishEvent(request_id=request_id, reason=reason, num_tokens=num_tokens,
                                             lts_entropy=lts, time_s=self.clock()))
        return request

    # ---- faults -----------------------------------------------------------------------------------
    def fault(self, component: str, message: str) -> None:
        """Count a caught fault in ``growpage_agent_errors_total``; log its traceback the first time
        per component only (:class:`~growpage.core.faults.FaultGuard`). Call from an ``except``."""
        self.faults.fault(component, message)

    def guard(self, component: str, message: str) -> contextlib.AbstractContextManager[None]:
        """``with controller.guard("observer", "..."):`` runs the body; a fault is counted, not raised."""
        return self.faults.guard(component, message)

    # ---- gauges and stats -------------------------------------------------------------------------
    def pool_gauges(self, *, num_pages: int, pages_free: int, pages_reserved: int, pages_used: int,
                    live_tokens: int, granted_token_slots: int, used_token_slots: int, logical_bytes: int,
                    stored_bytes: int, tracked: Sequence[str] | None = None) -> PoolGauges:
        """The pool's gauges from the home's counts plus the controller's per-request view.

        Args:
            tracked: request ids counted as running (default: every controlled request).
        """
        ids = list(self.requests) if tracked is None else [r for r in tracked if r in self.requests]
        requests = [self.requests[r] for r in ids]
        lts_by_namespace: dict[str, list[float]] = {}
        boundaries = []
        for request in requests:
            if request.mode is Mode.OFF:
                continue
            boundaries.append(capacity_boundary_pages(request.base_pages, request.lts_entropy,
                                                      self.config.growth_coefficient))
            if request.observed:
                lts_by_namespace.setdefault(request.namespace or "", []).append(request.lts_entropy)
        return PoolGauges(
            num_pages=num_pages, pages_free=pages_free, pages_reserved=pages_reserved, pages_used=pages_used,
            live_tokens=live_tokens, granted_token_slots=granted_token_slots, used_token_slots=used_token_slots,
            logical_bytes=logical_bytes, stored_bytes=stored_bytes, requests_running=len(requests),
            capacity_boundaries=tuple(boundaries),
            lts_by_namespace={ns: tuple(values) for ns, values in lts_by_namespace.items()})

    def make_stats(self, gauges: PoolGauges) -> StatsSnapshot:
        """Get-and-reset snapshot (the telemetry agent is the only caller)."""
        return self.stats.drain(gauges)
