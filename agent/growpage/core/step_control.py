"""The per-step controller call's records and its pure arithmetic (no controller state, no engine).

Each home describes the step it is about to run as a :class:`StepPool` and one :class:`RequestView`
per running request; :meth:`growpage.core.controller.GrowthController.plan_step` answers with a
:class:`StepControl`: the reserve growth leaves for the others and for admission, every boundary's
enforceable action with its fallback, and the reclaims that relieve pool pressure. A home only
translates its state into views and carries out the answer. What is computed here, and only here:

- the floor of a request (:func:`~growpage.core.pressure.floor_pages`);
- pool pressure: growth this step plus the next admission against free pages;
- the reserve a boundary leaves for them;
- whether a boundary eviction pays and how many pages it leaves (:func:`evict_pages_after`);
- what a home that cannot carry out every action does instead (:func:`enforceable_action`);
- which running requests compress under pressure, and to what (:func:`reclaim_candidates`);
- which cached prompts a fixed-cap method compresses, and to what.

The records a call passes around live here too (:class:`ControlledRequest`, the controller's state of
one request; :class:`BoundaryCall`, one run of the contract), so the controller imports this module
and nothing here imports the controller.

Page counts follow the compaction contract of both homes: a request compressed to ``pages_after``
pages keeps ``pages_after - 1`` full pages and takes a fresh one for its next token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from growpage.config import Mode
from growpage.core.policy import Action, BoundaryState, Decision
from growpage.core.pressure import PoolPressure, Reclaim, ReclaimCandidate, floor_pages

ALL_ACTIONS = frozenset(Action)


@dataclasses.dataclass
class ControlledRequest:
    """The controller's state of one request (a few scalars)."""

    request_id: str
    namespace: str | None
    mode: Mode
    prompt_tokens: int
    base_pages: int
    growth_budget_pages: float
    last_refill_s: float
    sts_density: float = 0.0  # the latest summary reading
    lts_entropy: float = 0.0
    observed: bool = False  # a reading has arrived (LTS means something)
    attention_tokens: int = 0  # the most tokens its observed attention needed (attention_coverage)


@dataclasses.dataclass(frozen=True)
class BoundaryCall:
    """One run of the contract at one boundary: the inputs, the decision and when it started."""

    request: ControlledRequest
    state: BoundaryState
    decision: Decision
    capacity_boundary_pages: float
    started_perf_s: float
    time_s: float


@dataclasses.dataclass(frozen=True)
class StepPool:
    """The pool as a step starts.

    Attributes:
        free_pages: pages no request holds.
        total_pages: the pool's size.
        waiting_prompt_tokens: the oldest waiting request's prompt, or None when none waits.
        batch_full: the engine already runs as many requests as it may.
    """

    free_pages: int
    total_pages: int
    waiting_prompt_tokens: int | None = None
    batch_full: bool = False


@dataclasses.dataclass(frozen=True)
class RequestView:
    """One running request as the step sees it.

    Attributes:
        request_id: the request (controlled or not: every running request's growth counts).
        pages_held: pages it holds now (reserved ones included).
        allowance_pages: pages it may hold before its next page is a boundary decision.
        needs_page: this step's tokens need a page it does not hold.
        protected_tokens: tokens no compression removes (sinks or shared prefix, recent window).
        compressible: the home can rewrite its KV now (enforced, nothing shared after its
            prefix, the home ready to move tokens); pressure relief picks only these.
        can_evict: a boundary eviction is possible where its KV lives (a plan exists).
        can_quantize: a boundary quantization is possible where its KV lives.
        prompt_uncompressed: its prompt is cached and was never compressed (methods that compress
            a prompt once, to their cap, do it now).
    """

    request_id: str
    pages_held: int
    allowance_pages: int
    needs_page: bool
    protected_tokens: int = 0
    compressible: bool = False
    can_evict: bool = False
    can_quantize: bool = False
    prompt_uncompressed: bool = False

    @property
    def at_boundary(self) -> bool:
        return self.needs_page and self.pages_held >= self.allowance_pages


@dataclasses.dataclass(frozen=True)
class BoundaryPlan:
    """One boundary's answer.

    Attributes:
        call: the contract's inputs and decision (record it with ``record_decision``).
        action: what the home carries out: the decision, or what it degrades to where the home
            cannot carry it out. PREEMPT means "nothing this request can do itself": grow if the
            reclaims made room, else the engine's preemption decides.
        fallback: plain paging, for when carrying out ``action`` fails or is PREEMPT: ALLOCATE if
            the pool is projected to have a page for it after the reclaims, else PREEMPT.
        pages_after: pages the request holds once ``action`` is carried out.
        enforced: the request's mode lets the home act (monitor only records).
    """

    call: BoundaryCall
    action: Action
    fallback: Action
    pages_after: int
    enforced: bool

    @property
    def request_id(self) -> str:
        return self.call.request.request_id

    @property
    def degraded(self) -> bool:
        return self.action is not self.call.decision.action


@dataclasses.dataclass(frozen=True)
class StepControl:
    """The controller's answer for one step."""

    pressure: PoolPressure
    reserve_pages: int
    boundaries: tuple[BoundaryPlan, ...]
    reclaims: tuple[Reclaim, ...]
    prompt_compressions: tuple[Reclaim, ...] = ()  # cached prompts compressed to their floor (a cap's, GrowPage's)

    def boundary(self, request_id: str) -> BoundaryPlan | None:
        return next((b for b in self.boundaries if b.request_id == request_id), None)


def request_floor(view: RequestView, base_pages: int, block_size: int, attention_tokens: int = 0) -> int:
    """A request's floor this step: :func:`floor_pages` if it can be compressed, else what it holds."""
    if not view.compressible:
        return view.pages_held
    return floor_pages(base_pages, view.protected_tokens, block_size, attention_tokens)


def growth_reserve(pressure: PoolPressure) -> int:
    """Pages one boundary leaves free: the others' growth this step and the next admission."""
    return max(0, pressure.growth_pages - 1) + pressure.admission_pages


def compression_pays(pressure: PoolPressure) -> bool:
    """Freeing a page this step avoids a preemption (the pool cannot hold the step's growth) or
    widens the batch (a request waits and its admission fits the floors)."""
    return pressure.under_pressure or pressure.admission_pages > 0


def admission_blocked(pressure: PoolPressure) -> bool:
    """A request waits whose admission fits the floors, and the pool cannot take it this step:
    compressing a just-cached prompt to its floor widens the batch (GrowPage's prompt rule)."""
    return pressure.admission_pages > 0 and pressure.under_pressure


def evict_pages_after(view: RequestView, *, floor: int, pages_to_free: int) -> int | None:
    """Pages a boundary eviction leaves (the next token's page included), never below ``floor``;
    None when it would save no page over growing (or the home cannot evict)."""
    if not view.can_evict:
        return None
    pages_after = max(floor, view.pages_held + 1 - pages_to_free)
    return pages_after if pages_after <= view.pages_held else None


def enforceable_action(decided: Action, *, can_evict: bool, free_pages: int,
                       enforceable: frozenset[Action] = ALL_ACTIONS) -> Action:
    """What a home able to carry out ``enforceable`` does for a decision.

    An eviction that cannot run grows instead; QUANTIZE and DEFER where the home cannot carry them
    out (vLLM: ``kv_cache_dtype`` is deployment-wide, its scheduler has no "skip this step") become
    an eviction when one is possible, else growth; growth against an empty pool, and PREEMPT, leave
    the request to the fallback (reclaims, then the engine's preemption).
    """
    action = decided
    if action is Action.EVICT and not can_evict:
        action = Action.ALLOCATE
    if action not in enforceable and action in (Action.QUANTIZE, Action.DEFER):
        action = Action.EVICT if can_evict else Action.ALLOCATE
    if action is Action.ALLOCATE and free_pages < 1:
        return Action.PREEMPT
    return action


def reclaim_candidates(views: Sequence[RequestView], floors: dict[str, int],
                       lts_entropy: dict[str, float]) -> list[ReclaimCandidate]:
    """Running requests pressure relief may compress: compressible and above their floor."""
    return [ReclaimCandidate(v.request_id, v.pages_held, floors[v.request_id], lts_entropy.get(v.request_id, 0.0),
                             v.needs_page)
            for v in views if v.compressible and v.pages_held > floors[v.request_id]]
