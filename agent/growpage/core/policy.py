"""The growth contract as a pure function: ``decide(state, config) -> Decision``.

A request reaches a *page boundary* when it needs a token slot and holds no free slot. Below its
capacity boundary (``base_pages * (1 + growth_coefficient * LTS)``) it simply grows; at the boundary
the STS density and LTS entropy choose between compressing in place and growing:

==========================  =================================================================
density > density_threshold  quantize (all tokens kept), else evict
density <= threshold, LTS >  allocate one page (pool and ``max_growth_rate`` permitting)
density <= threshold, LTS <= evict lowest-scored tokens (sinks and recent window kept)
==========================  =================================================================

The third row could as well grow; it evicts because low entropy means attention is concentrated
on few tokens, which is exactly when dropping the unattended ones costs least.

Fallbacks, so that every outcome is defined: an allocation refused (pool empty: ``denied``; budget
spent: ``throttled``) falls back to compression in density order; a compression that cannot free a
page falls back to the other one, then to allocation; when nothing can be freed and the pool is
empty the request is preempted (recomputed later, as vLLM does); when only the throttle stands in
the way the request defers one step (its budget refills with time).

Growth yields to admission: ``admission_reserve_pages`` (the grant the oldest waiting request needs)
are not available for growth, so under pressure running requests compress and the pool's pages go
to concurrency instead of to one request's tail. The reserve is a preference, not a wall: a request
with nothing to compress takes a reserved page rather than being preempted.
"""

from __future__ import annotations

import dataclasses
import enum

from growpage.config import GrowPageConfig


class Action(str, enum.Enum):
    """What the actuator does at a page boundary."""

    ALLOCATE = "allocate"
    QUANTIZE = "quantize"
    EVICT = "evict"
    DEFER = "defer"
    PREEMPT = "preempt"


class Refusal(str, enum.Enum):
    """Why a wanted allocation was refused (counted as its own decision kind)."""

    DENIED = "denied"  # the pool has no free page
    THROTTLED = "throttled"  # the request's max_growth_rate budget is spent


class Reason(str, enum.Enum):
    """Which row of the contract produced the decision."""

    WITHIN_BOUNDARY = "within_boundary"
    DENSE_WORKING_SET = "dense_working_set"
    BROAD_DEMAND = "broad_demand"
    NARROW_DEMAND = "narrow_demand"
    NOTHING_TO_COMPRESS = "nothing_to_compress"
    # Rows of the comparison methods (growpage.core.methods), never produced by ``decide``.
    NO_BUDGET = "no_budget"  # full KV: always grow
    BUDGET_REACHED = "budget_reached"  # fixed per-request budget: compress at the cap
    UNIFORM_QUANTIZATION = "uniform_quantization"  # quantize whenever possible
    RANDOM_CHOICE = "random_choice"  # ablation: a feasible action drawn at random
    # the cached prompt compressed to its floor: a fixed budget's always, GrowPage's when a waiting
    # request cannot be admitted (core.step_control.admission_blocked)
    PROMPT_BUDGET = "prompt_budget"
    POOL_PRESSURE = "pool_pressure"  # compressed outside its boundary so the pool holds the step (core.step_control)
    NO_PRESSURE = "no_pressure"  # grew although the contract would compress: nothing waits, the pool has room
    # grew although the contract would compress: the pool holds every admitted and waiting request
    # at its full length, so no compression can buy a preemption avoided or a wider batch
    ROOM_FOR_ALL = "room_for_all"
    # grew (or left the request to the engine's preemption) although the contract would compress:
    # decode-time compression has bought neither a wider batch nor a dear recompute lately
    # (growpage.core.compression_gate), so it would cost more than it buys
    WOULD_NOT_PAY = "would_not_pay"


@dataclasses.dataclass(frozen=True)
class BoundaryState:
    """Everything ``decide`` looks at, for one request at one page boundary.

    Attributes:
        pages_held: pages in the request's page table (shared prefix pages included).
        base_pages: the request's admission grant.
        sts_density: active STS bins / number of bins, in [0, 1].
        lts_entropy: bias-corrected long-term attention entropy, nats.
        pool_free_pages: free pages in the pool right now.
        growth_budget_pages: pages the request may still add under ``max_growth_rate``.
        can_quantize: quantizing the request's eligible pages would free at least one page.
        can_evict: evicting unprotected tokens would free at least ``evict_min_pages`` pages.
        admission_reserve_pages: free pages kept for the next waiting request's admission.
        compression_pays: the step is under pool pressure or a request waits to be admitted, so
            freeing a page avoids a preemption or widens the batch (read by methods that compress
            only when it pays; the contract itself compresses at its boundary either way).
        room_for_all: the pool's free pages hold every running request to its full length and every
            waiting one besides (:func:`growpage.core.step_control.holds_everyone`): nothing this
            boundary frees can buy anything, so GrowPage's methods grow (a home that cannot tell
            leaves it False).
        compression_idle: decode-time compression is idle this step (:mod:`growpage.core.compression_gate`):
            GrowPage's methods grow where the pool has a page and leave the request to the engine's
            preemption where it has none.
    """

    pages_held: int
    base_pages: int
    sts_density: float
    lts_entropy: float
    pool_free_pages: int
    growth_budget_pages: float
    can_quantize: bool
    can_evict: bool
    admission_reserve_pages: int = 0
    compression_pays: bool = True
    room_for_all: bool = False
    compression_idle: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of one boundary: an action, the contract row, and a refusal if one occurred."""

    action: Action
    reason: Reason
    refusal: Refusal | None = None


def capacity_boundary_pages(base_pages: int, lts_entropy: float, growth_coefficient: float) -> float:
    """``base_pages * (1 + growth_coefficient * LTS)``: where a request stops growing freely."""
    return base_pages * (1.0 + growth_coefficient * max(lts_entropy, 0.0))


def refill_growth_budget(budget_pages: float, pages_held: int, elapsed_s: float,
                         max_growth_rate: float) -> float:
    """Token-bucket refill for ``max_growth_rate`` (a fraction of held pages per second).

    The bucket holds at most one second of growth, and never less than one page, so a small
    request can always grow by a page after ``1 / (rate * pages_held)`` seconds.
    """
    per_second = max_growth_rate * max(pages_held, 1)
    capacity = max(per_second, 1.0)
    return min(capacity, budget_pages + per_second * max(elapsed_s, 0.0))


def decide(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Apply the growth contract (see the module docstring) to one boundary."""
    dense = state.sts_density > config.density_threshold
    wanted, reason = _wanted_action(state, config, dense)

    refusal: Refusal | None = None
    if wanted is Action.ALLOCATE:
        refusal = allocation_refusal(state)
        if refusal is None:
            return Decision(Action.ALLOCATE, reason)

    compress_order = (Action.QUANTIZE, Action.EVICT) if dense else (Action.EVICT, Action.QUANTIZE)
    for action in compress_order:
        if (state.can_quantize if action is Action.QUANTIZE else state.can_evict):
            return Decision(action, reason, refusal)
    return _nothing_to_compress(state, wanted, reason, refusal)


def _wanted_action(state: BoundaryState, config: GrowPageConfig, dense: bool) -> tuple[Action, Reason]:
    """What the contract asks for before the pool, the growth budget or the cache have a say."""
    boundary = capacity_boundary_pages(state.base_pages, state.lts_entropy, config.growth_coefficient)
    if state.pages_held < boundary:
        return Action.ALLOCATE, Reason.WITHIN_BOUNDARY
    if dense:
        return Action.QUANTIZE, Reason.DENSE_WORKING_SET
    if state.lts_entropy > config.lts_grow_threshold:
        return Action.ALLOCATE, Reason.BROAD_DEMAND
    return Action.EVICT, Reason.NARROW_DEMAND


def _nothing_to_compress(state: BoundaryState, wanted: Action, reason: Reason,
                         refusal: Refusal | None) -> Decision:
    """The request cannot shrink, so it grows if the pool allows, else it waits or is preempted.

    ``refusal`` is why a wanted allocation was already refused (None when compression was wanted).
    A denial may still be granted from the admission reserve, since the request would otherwise be
    preempted; a throttled request only has to wait for its growth budget to refill.
    """
    if wanted is not Action.ALLOCATE:
        refusal = allocation_refusal(state)
        if refusal is None:
            return Decision(Action.ALLOCATE, Reason.NOTHING_TO_COMPRESS)
    if refusal is Refusal.DENIED and state.admission_reserve_pages:
        ignoring_reserve = allocation_refusal(state, use_reserve=True)
        if ignoring_reserve is None:
            return Decision(Action.ALLOCATE, Reason.NOTHING_TO_COMPRESS, refusal)
        refusal = ignoring_reserve
    if refusal is Refusal.THROTTLED:
        return Decision(Action.DEFER, reason, refusal)
    return Decision(Action.PREEMPT, reason, refusal)


def allocation_refusal(state: BoundaryState, use_reserve: bool = False) -> Refusal | None:
    """Why an allocation would be refused right now (None: it would be granted); growth sees the
    pool less the admission reserve unless ``use_reserve``."""
    available = state.pool_free_pages - (0 if use_reserve else state.admission_reserve_pages)
    if available < 1:
        return Refusal.DENIED
    if state.growth_budget_pages < 1.0:
        return Refusal.THROTTLED
    return None
