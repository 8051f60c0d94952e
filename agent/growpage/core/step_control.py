"""The per-step controller call's records and its pure arithmetic (no controller state, no engine, no tensors).

Each home describes the step it is about to run as a :class:`StepPool` and one :class:`RequestView`
per running request; :meth:`growpage.core.controller.GrowthController.plan_step` answers with a
:class:`StepControl`: the reserve growth leaves for the others and for admission, every boundary's
enforceable action with its fallback, and the reclaims that relieve pool pressure (before the
engine's own preemption can run). A home only translates its state into views and carries out the
answer. What is computed here, and only here:

- the floor of a request (:func:`floor_pages`, over its :func:`protected_tokens`): the one floor
  both homes use (pressure relief, boundary evictions, the headroom a router sees);
- pool pressure (:func:`measure_pressure`): growth this step plus the next admission against free
  pages. Admission counts only while every running request's floor still fits: ``base_pages``
  protects a running request, so GrowPage never admits a request whose floor would push another
  below its own;
- the reserve a boundary leaves for them;
- whether a boundary eviction pays and how many pages it leaves (:func:`evict_pages_after`);
- what a home that cannot carry out every action does instead (:func:`enforceable_action`);
- which running requests compress under pressure, and to what (:func:`reclaim_candidates`,
  :func:`plan_reclaim`): the lowest LTS entropy first (attention concentrated on few tokens:
  evicting the unattended ones costs least), then those holding the most pages above their floor.
  None goes below its floor; what cannot be covered is left to the engine's preemption;
- which cached prompts a fixed-cap method compresses, and to what.

The records a call passes around live here too (:class:`ControlledRequest`, the controller's state of
one request; :class:`BoundaryCall`, one run of the contract), so the controller imports this module
and nothing here imports the controller.

Page counts follow the compaction contract of both homes: a request compressed to ``pages_after``
pages keeps ``pages_after - 1`` full pages and takes a fresh one for its next token, so it frees
``pages_held - pages_after + 1`` pages now and needs one page this step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from growpage.config import Mode
from growpage.core.policy import Action, BoundaryState, Decision

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
        room_for_all: the free pages hold every running request to its full length and every
            waiting one besides (:func:`holds_everyone`; False where the home cannot tell).
        compression_idle: decode-time compression is idle this step
            (:mod:`growpage.core.compression_gate`): boundaries of methods that honour it grow or
            leave the request to the engine's preemption, and pressure relief makes no room;
            a fresh prompt is still compressed for admission where ``wider_batch_pays``.
        wider_batch_pays: one more running request speeds decoding by more than decode-time
            compression costs (:func:`~growpage.core.compression_gate.wider_batch_pays`, from the
            engine's measured step costs; True where unmeasured).
    """

    free_pages: int
    total_pages: int
    waiting_prompt_tokens: int | None = None
    batch_full: bool = False
    room_for_all: bool = False
    compression_idle: bool = False
    wider_batch_pays: bool = True


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


def protected_tokens(physical_tokens: int, shared_prefix_tokens: int, sink_tokens: int,
                     recent_window_tokens: int) -> int:
    """How many of a request's physical tokens a compaction must keep.

    Sinks and shared-prefix tokens sit at the start (they were never dropped), the recent window at
    the end (its tokens were always inside the window when earlier compactions ran).
    """
    head = max(shared_prefix_tokens, sink_tokens)
    return min(physical_tokens, head + recent_window_tokens)


def floor_pages(base_pages: int, protected: int, block_size: int, attention_tokens: int = 0) -> int:
    """The fewest pages a running request may be compressed to: its ``base_pages``, and never fewer
    than its protected tokens (or the tokens its observed attention needs, ``attention_coverage``,
    if more) plus the page its next token takes. The one floor both homes use (pressure relief,
    boundary evictions, the headroom a router sees)."""
    return max(base_pages, -(-max(protected, attention_tokens) // block_size) + 1)


@dataclasses.dataclass(frozen=True)
class PoolPressure:
    """The pool at the start of a step.

    Attributes:
        free_pages: pages no request holds.
        growth_pages: pages running requests need this step (those whose last page is full).
        admission_pages: pages the oldest waiting request needs to be admitted (0: none waits, the
            batch is full, or admitting it would break a running request's floor).
    """

    free_pages: int
    growth_pages: int
    admission_pages: int

    @property
    def deficit_pages(self) -> int:
        """Pages missing to grow everyone this step and admit the next request (0: no pressure)."""
        return max(0, self.growth_pages + self.admission_pages - self.free_pages)

    @property
    def under_pressure(self) -> bool:
        return self.deficit_pages > 0


def measure_pressure(*, free_pages: int, total_pages: int, growth_pages: int, running_floor_pages: int,
                     waiting_prompt_pages: int | None, waiting_floor_pages: int, batch_full: bool) -> PoolPressure:
    """The pressure a step starts under.

    Args:
        free_pages, total_pages: the pool now, and its size.
        growth_pages: pages running requests need this step.
        running_floor_pages: the sum of the running requests' floors (``max(base_pages, prompt)``).
        waiting_prompt_pages: pages the oldest waiting request's prompt needs, or None if none waits.
        waiting_floor_pages: that request's floor once running.
        batch_full: the engine runs as many requests as it may (``max_num_seqs``).
    """
    admission = 0
    if (waiting_prompt_pages is not None and not batch_full
            and running_floor_pages + waiting_floor_pages <= total_pages):
        admission = waiting_prompt_pages
    return PoolPressure(free_pages=free_pages, growth_pages=growth_pages, admission_pages=admission)


@dataclasses.dataclass(frozen=True)
class ReclaimCandidate:
    """A running request that could be compacted now.

    Attributes:
        request_id: the request.
        pages_held: pages it holds.
        floor_pages: the fewest pages it may be left with (its floor, and enough for its protected
            tokens plus the page its next token takes).
        lts_entropy: its long-term attention entropy (nats).
        needs_page: whether it needs a fresh page this step anyway (its last page is full).
    """

    request_id: str
    pages_held: int
    floor_pages: int
    lts_entropy: float
    needs_page: bool


@dataclasses.dataclass(frozen=True)
class Reclaim:
    """Compact ``request_id`` to ``pages_after`` pages (see the module docstring); frees ``pages_gained``
    net of the page it then needs."""

    request_id: str
    pages_after: int
    pages_gained: int


def plan_reclaim(deficit_pages: int, candidates: Sequence[ReclaimCandidate]) -> list[Reclaim]:
    """Compactions that cover ``deficit_pages`` (or as much of it as the floors allow)."""
    order = sorted(candidates, key=lambda c: (c.lts_entropy, -(c.pages_held - c.floor_pages), c.request_id))
    plan: list[Reclaim] = []
    remaining = deficit_pages
    for candidate in order:
        if remaining <= 0:
            break
        already_needed = 1 if candidate.needs_page else 0
        pages_after = max(candidate.floor_pages, candidate.pages_held + already_needed - remaining)
        gained = candidate.pages_held - pages_after + already_needed
        if gained <= 0:
            continue
        plan.append(Reclaim(candidate.request_id, pages_after, gained))
        remaining -= gained
    return plan


def request_floor(view: RequestView, base_pages: int, block_size: int, attention_tokens: int = 0) -> int:
    """A request's floor this step: :func:`floor_pages` if it can be compressed, else what it holds."""
    if not view.compressible:
        return view.pages_held
    return floor_pages(base_pages, view.protected_tokens, block_size, attention_tokens)


def growth_reserve(pressure: PoolPressure) -> int:
    """Pages one boundary leaves free: the others' growth this step and the next admission."""
    return max(0, pressure.growth_pages - 1) + pressure.admission_pages


def holds_everyone(free_pages: int, pages_still_needed: Iterable[int]) -> bool:
    """Whether ``free_pages`` hold what every request still needs to reach its full length
    (``pages_still_needed``: the running ones' pages beyond those they hold, the waiting ones'
    whole): then no page freed now can avoid a preemption or widen the batch before another request
    arrives. Stops reading at the first request the pool cannot also hold (a long queue costs no
    more than the pool's size)."""
    left = free_pages
    for pages in pages_still_needed:
        left -= max(0, pages)
        if left < 0:
            return False
    return True


def compression_pays(pressure: PoolPressure) -> bool:
    """Freeing a page this step avoids a preemption (the pool cannot hold the step's growth) or
    widens the batch (a request waits and its admission fits the floors)."""
    return pressure.under_pressure or pressure.admission_pages > 0


def admission_blocked(pressure: PoolPressure, *, compression_idle: bool = False, wider_batch_pays: bool = True) -> bool:
    """A request waits whose admission fits the floors, and the pool cannot take it this step:
    compressing a just-cached prompt to its floor widens the batch (GrowPage's prompt rule). While
    decode-time compression is idle, only where the wider batch pays for switching it on
    (:func:`~growpage.core.compression_gate.wider_batch_pays`): the prompts' savings reopen it."""
    if compression_idle and not wider_batch_pays:
        return False
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
