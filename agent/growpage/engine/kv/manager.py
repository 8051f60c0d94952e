"""The actuator: owns the pool, page bytes and summaries, and applies the policy's decisions.

Engine-facing API, in step order (check/commit pairs, nano-vllm style):

1. ``can_admit`` / ``admit``: grant ``base_pages`` (reserved, never over-committed), reuse
   published prefix pages.
2. ``ensure_slots(request, n)``: make room for this step's new tokens; crossing a page boundary runs
   the growth contract. Returns :class:`SlotStatus` (``OK``, ``DEFER`` or ``PREEMPT``).
3. ``plan_step``: assign slots and logical positions, build the :class:`StepLayout`.
4. per layer ``attend``: store new K/V, gather pages, attend; observed layers feed the summaries.
5. ``finish_step``: fold the step's observations into STS/LTS (device ops, no host sync).
6. ``release``: on finish, abort or preemption every page goes back.

The manager is the reference engine's home of GrowPage: it owns where the KV lives (pool, page
bytes, summaries) and carries out decisions; admission grants, the boundary routine, the observed
layers, the fault guard and the stats belong to its :class:`~growpage.core.controller.GrowthController`,
which the vLLM plugin's hooks share. Faults inside GrowPage's own logic (summaries, decisions,
compression) are caught, counted in ``stats.agent_errors_total[component]`` and fall back to plain
paging, so a bug in GrowPage never takes the engine down.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import time
from collections.abc import Callable, Sequence

import torch

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import GrowthController, Reading
from growpage.core.devices import device_name
from growpage.core.evict import protected_mask, tokens_to_drop
from growpage.core.methods import GROWPAGE, KVMethod, Protection, observation_kind
from growpage.core.policy import Action, Reason
from growpage.core.stats import PoolGauges, StatsSnapshot
from growpage.core.step_control import (
    BoundaryPlan,
    ControlledRequest,
    RequestView,
    StepControl,
    StepPool,
    admission_blocked,
    compression_pays,
    protected_tokens,
)
from growpage.core.summaries import SummaryBank, summarize_attention
from growpage.engine.kv import attention as attn
from growpage.engine.kv.kv_store import DTYPES, KVStore, PageFormat
from growpage.engine.kv.pool import PagePool
from growpage.errors import GrowPageError

logger = logging.getLogger(__name__)

# tokens a request grows by between two measurements of its attention need (attention_coverage):
# the need moves slowly, and each measurement reads its scores back from the device
NEED_EVERY_TOKENS = 8


class SlotStatus(str, enum.Enum):
    OK = "ok"
    DEFER = "defer"  # throttled with nothing to compress: skip this step, budget refills with time
    PREEMPT = "preempt"  # nothing can be freed and the pool is empty: release and recompute later


@dataclasses.dataclass(frozen=True)
class Admission:
    """Result of ``admit``: how many prompt tokens are already cached (shared prefix pages)."""

    cached_tokens: int
    pages_granted: int


@dataclasses.dataclass
class RequestKV:
    """One request's page table; its GrowPage state is the controller's ``control``."""

    control: ControlledRequest
    summary_row: int
    pages: list[int]  # pages holding tokens; a format's pages are in chronological order
    reserved: list[int]  # granted, not yet written
    logical_length: int = 0  # tokens seen so far (the next token's position)
    peak_pages_held: int = 0  # the most pages held at once, transient peaks (a whole prompt) included
    need_measured_at: int = -1  # logical length when its attention need was last measured (-1: never)

    @property
    def request_id(self) -> str:
        return self.control.request_id

    @property
    def namespace(self) -> str | None:
        return self.control.namespace

    @property
    def mode(self) -> Mode:
        return self.control.mode

    @property
    def base_pages(self) -> int:
        return self.control.base_pages

    @property
    def pages_held(self) -> int:
        return len(self.pages) + len(self.reserved)


@dataclasses.dataclass
class StepPlan:
    """One step of a batch: who, where the new tokens go, and what to observe."""

    request_ids: list[str]
    layout: attn.StepLayout
    write_pages: torch.Tensor  # [N] long
    write_slots: torch.Tensor  # [N] long
    observed_rows: torch.Tensor  # [B] bool: rows whose attention feeds the summaries
    summary_rows: torch.Tensor  # [B] long
    bin_mass: torch.Tensor  # [B, bins] accumulated over observed layers
    entropy: torch.Tensor  # [B]
    score_weights: torch.Tensor  # [B] what each row's observation weighs in its tokens' scores
    layers_observed: int = 0


@dataclasses.dataclass(frozen=True)
class _QuantizePlan:
    pages: list[int]
    fmt: PageFormat


@dataclasses.dataclass(frozen=True)
class _EvictPlan:
    fmt: PageFormat
    pages: list[int]
    keep: torch.Tensor  # [N] bool over the group's tokens


class GrowPageManager:
    """GrowPage for one engine: a page pool of ``num_pages`` pages shared by all requests.

    Args:
        config: validated GrowPage config (block size, thresholds, deployment mode).
        num_layers, num_kv_heads, head_dim: the model's KV geometry.
        num_pages: physical pages in the pool.
        device: where the pages and summaries live ("cpu", "cuda").
        compute_dtype: dtype attention runs in (pages are stored at ``config.kv_dtype``).
        max_requests: rows of the summary bank (running requests at most).
        clock: seconds, monotonic; injected so tests control the growth throttle.
        method: what happens at page boundaries; GrowPage's contract unless a benchmark compares
            it with a baseline (``growpage.core.methods``).
    """

    def __init__(self, config: GrowPageConfig, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 num_pages: int, device: torch.device | str = "cpu",
                 compute_dtype: torch.dtype = torch.float32, max_requests: int = 256,
                 clock: Callable[[], float] = time.monotonic, method: KVMethod = GROWPAGE):
        self.method = method
        self.controller = GrowthController(config, num_layers=num_layers, clock=clock, method=method,
                                           logger=logger)
        config = self.controller.config
        self.config = config
        self.clock = clock
        self.compute_dtype = compute_dtype
        self.pool = PagePool(num_pages)
        self.store = KVStore(num_layers, num_pages, config.block_size, num_kv_heads, head_dim,
                             DTYPES[config.kv_dtype], device)
        self.summaries = SummaryBank(config, max_requests, device)
        self.stats = self.controller.stats
        self.requests: dict[str, RequestKV] = {}
        # Pages the oldest waiting request needs to be admitted; set by the scheduler each step so
        # growth yields to admission (see growpage.core.policy).
        self.admission_reserve_pages = 0
        self._step_boundaries: dict[str, BoundaryPlan] = {}  # this step's planned boundaries, not yet reached
        self._compression_pays = True  # this step's pressure says freeing a page pays (no step planned: yes)
        self._admission_blocked = False  # this step's waiting request cannot be admitted (GrowPage's prompt rule)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self.observed_layers = self.controller.observed_layers
        self._quant_format = PageFormat.for_bits(config.quantization_bits)
        self._attention_coverage = method.attention_coverage(config)  # the floor that follows attention

    # ---- admission ----------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return device_name(self.store.device)

    def pages_for_prompt(self, num_prompt_tokens: int) -> int:
        """Pages a request is granted at admission (see :meth:`GrowthController.grant_pages`)."""
        return self.controller.grant_pages(num_prompt_tokens)

    def _prefix_hits(self, num_prompt_tokens: int, block_hashes: Sequence[int]) -> list[int]:
        # Keep at least one prompt token uncached: the engine needs its logits.
        limit = (num_prompt_tokens - 1) // self.config.block_size
        hits = []
        for block_hash in list(block_hashes)[:limit]:
            page = self.pool.lookup(block_hash)
            if page is None:
                break
            hits.append(page)
        return hits

    def can_admit(self, num_prompt_tokens: int, block_hashes: Sequence[int] = ()) -> bool:
        if not self._free_rows:
            return False
        hits = self._prefix_hits(num_prompt_tokens, block_hashes)
        return self.pool.can_reserve(self.pages_for_prompt(num_prompt_tokens) - len(hits))

    def admit(self, request_id: str, num_prompt_tokens: int, *, namespace: str | None = None,
              mode: Mode | str | None = None, block_hashes: Sequence[int] = ()) -> Admission:
        """Grant pages to a new request. Call ``can_admit`` first (no over-commit)."""
        if request_id in self.requests:
            raise RuntimeError(f"request {request_id!r} is already admitted; request ids must be unique")
        if not self.can_admit(num_prompt_tokens, block_hashes):
            raise RuntimeError(f"cannot admit {request_id!r}: call can_admit() first")
        hits = self._prefix_hits(num_prompt_tokens, block_hashes)
        started = time.perf_counter()
        reserved = self.pool.reserve(self.pages_for_prompt(num_prompt_tokens) - len(hits))
        grant_latency_s = time.perf_counter() - started
        for page in hits:
            self.pool.share(page)
        row = self._free_rows.pop()
        self.summaries.reset([row])
        cached_tokens = len(hits) * self.config.block_size
        control = self.controller.admit(
            request_id, prompt_tokens=num_prompt_tokens, namespace=namespace, mode=mode,
            cached_tokens=cached_tokens, pages_granted=len(reserved), latency_s=grant_latency_s)
        request = RequestKV(control=control, summary_row=row, pages=list(hits), reserved=reserved,
                            logical_length=cached_tokens)
        request.peak_pages_held = request.pages_held
        self.requests[request_id] = request
        return Admission(cached_tokens=request.logical_length, pages_granted=len(reserved))

    def publish_prefix(self, request_id: str, block_hashes: Sequence[int]) -> int:
        """Offer the request's full prompt pages to later requests; returns pages published."""
        request = self.requests[request_id]
        published = 0
        for page, block_hash in zip(request.pages, block_hashes, strict=False):  # hashes cover full pages
            if self.store.format[page] is not PageFormat.FULL or self.store.fill[page] < self.config.block_size:
                break
            self.pool.publish(page, block_hash)
            published += 1
        return published

    # ---- room for new tokens ------------------------------------------------------------------
    def _head_page(self, request: RequestKV) -> int | None:
        for page in reversed(request.pages):
            if (self.store.format[page] is PageFormat.FULL and not self.pool.is_shared(page)
                    and self.store.fill[page] < self.config.block_size):
                return page
        return None

    def free_slots(self, request_id: str) -> int:
        request = self.requests[request_id]
        head = self._head_page(request)
        head_room = self.config.block_size - self.store.fill[head] if head is not None else 0
        return head_room + len(request.reserved) * self.config.block_size

    def ensure_slots(self, request_id: str, num_tokens: int) -> SlotStatus:
        """Make room for ``num_tokens`` new tokens, crossing page boundaries as needed."""
        while self.free_slots(request_id) < num_tokens:
            status = self._cross_boundary(self.requests[request_id])
            if status is not SlotStatus.OK:
                return status
        return SlotStatus.OK

    def _grant_one(self, request: RequestKV) -> None:
        started = time.perf_counter()
        request.reserved.extend(self.pool.reserve(1))
        self.stats.record_grant(1, time.perf_counter() - started)
        request.peak_pages_held = max(request.peak_pages_held, request.pages_held)

    def _plain_paging(self, request: RequestKV) -> SlotStatus:
        """vLLM's default: take a page if the pool has one, else preempt."""
        if self.pool.can_reserve(1):
            self._grant_one(request)
            return SlotStatus.OK
        self.stats.record_oom()
        return SlotStatus.PREEMPT

    # ---- the per-step controller call ------------------------------------------------------------
    def control_step(self, batch: Sequence[tuple[str, int]], *, waiting_prompt_tokens: int | None = None,
                  batch_full: bool = False) -> StepControl:
        """Ask the controller about this step (pressure, reserve, boundaries, reclaims) and relieve
        pool pressure now, before any request needs a page; boundaries are carried out as each
        request's ``ensure_slots`` reaches them.

        Args:
            batch: ``(request_id, num_new_tokens)`` of the running requests, in scheduling order.
            waiting_prompt_tokens: the oldest waiting request's tokens (None: none waits).
            batch_full: no more requests may run.
        """
        if self._attention_coverage > 0:
            with self.controller.guard("observer", "measuring attention needs failed; floors stay as they were"):
                self._measure_attention_needs([self.requests[r] for r, _ in batch if r in self.requests])
        views = [self._view(self.requests[r], n) for r, n in batch if r in self.requests]
        pool = StepPool(self.pool.num_free, self.pool.num_pages, waiting_prompt_tokens, batch_full)
        control = self.controller.plan_step(pool, views)
        self.admission_reserve_pages = control.reserve_pages
        self._compression_pays = compression_pays(control.pressure)
        self._admission_blocked = admission_blocked(control.pressure)
        self._step_boundaries = {b.request_id: b for b in control.boundaries}
        for reclaim in control.reclaims:
            with self.controller.guard("actuator", "relieving pool pressure failed; the engine may preempt"):
                self._relieve(self.requests[reclaim.request_id], reclaim.pages_gained)
        return control

    def _view(self, request: RequestKV, num_tokens: int) -> RequestView:
        """A request as the controller sees it; compression plans are probed only at a boundary."""
        needs_page = self.free_slots(request.request_id) < num_tokens
        shared = [p for p in request.pages if self.pool.is_shared(p)]
        stored = sum(self.store.fill[p] for p in request.pages)
        protected = protected_tokens(stored, len(shared) * self.config.block_size, self.config.sink_tokens,
                                     self.config.recent_window_tokens)
        at_boundary = needs_page and request.mode is not Mode.OFF
        return RequestView(
            request.request_id, pages_held=request.pages_held, allowance_pages=request.pages_held,
            needs_page=needs_page, protected_tokens=protected,
            compressible=request.mode is Mode.ENFORCE and not request.reserved and len(shared) < len(request.pages),
            can_evict=at_boundary and self._plan_evict(request) is not None,
            can_quantize=at_boundary and self._plan_quantize(request) is not None)

    def _boundary_plan(self, request: RequestKV) -> BoundaryPlan:
        """This boundary's plan: the one the step planned, or (a second boundary in one step, a
        request admitted after the plan) the controller's answer now, with the step's reserve."""
        planned = self._step_boundaries.pop(request.request_id, None)
        if planned is not None and planned.call.state.pages_held == request.pages_held:
            return planned
        reading = self.summaries.read([request.summary_row])[0]
        self.controller.update_reading(request.request_id, Reading(reading.sts_density, reading.lts_entropy))
        view = self._view(request, self.free_slots(request.request_id) + 1)
        return self.controller.plan_boundary(view, free_pages=self.pool.num_free,
                                             reserve_pages=self.admission_reserve_pages,
                                             compression_pays=self._compression_pays or self.pool.num_free < 1)

    def _cross_boundary(self, request: RequestKV) -> SlotStatus:
        if request.mode is Mode.OFF:
            return self._plain_paging(request)
        plan: BoundaryPlan | None = None
        with self.controller.guard("policy", "decision failed; falling back to plain paging"):
            plan = self._boundary_plan(request)
        if plan is None:
            return self._plain_paging(request)
        applied = None
        if plan.enforced and plan.action is not Action.PREEMPT:
            with self.controller.guard("actuator", f"{plan.action.value} failed; falling back to plain paging"):
                applied = self._apply(request, plan)
        # the fallback (nothing to carry out, no compression plan any more, or a fault): plain paging
        status, bytes_in, bytes_out = applied if applied is not None else (self._plain_paging(request), 0, 0)
        self.controller.record_decision(plan.call, kind=plan.call.decision.action, enforced=plan.enforced,
                                        pages_after=request.pages_held, bytes_in=bytes_in, bytes_out=bytes_out)
        return status

    def _apply(self, request: RequestKV, plan: BoundaryPlan) -> tuple[SlotStatus, int, int] | None:
        """Carry out an enforced boundary; None when its compression plan no longer exists."""
        action = plan.action
        if action is Action.ALLOCATE:
            self._grant_one(request)
            return SlotStatus.OK, 0, 0
        if action is Action.QUANTIZE:
            quantize_plan = self._plan_quantize(request)
            return None if quantize_plan is None else (SlotStatus.OK, *self._quantize(request, quantize_plan))
        if action is Action.EVICT:
            evict_plan = self._plan_evict(request, pages_to_free=request.pages_held + 1 - plan.pages_after)
            return None if evict_plan is None else (SlotStatus.OK, *self._evict(request, evict_plan))
        if action is Action.DEFER:
            return SlotStatus.DEFER, 0, 0
        return None

    def compress_prompt(self, request_id: str) -> None:
        """Once a request's prompt is cached: methods that compress after prefill (fixed budgets,
        SnapKV-style) evict it down to the controller's answer (their budget, never below the
        floor); GrowPage does so only when this step's waiting request cannot be admitted
        (down to its floor, its attention need included); full KV never."""
        request = self.requests.get(request_id)
        if request is None:
            return
        started = time.perf_counter()
        pages_before = request.pages_held
        with self.controller.guard("actuator", "compressing the prompt failed; keeping it whole"):
            if self._attention_coverage > 0:  # its floor includes what its prompt's attention needs
                self._measure_attention_needs([request])
            # its first token's page may still be reserved: the prompt's pages are its own all the same
            view = dataclasses.replace(self._view(request, 0), prompt_uncompressed=True,
                                       compressible=request.mode is Mode.ENFORCE)
            target = self.controller.prompt_compression(view, admission_blocked=self._admission_blocked)
            # pages_after counts the next token's page: the first token's reserved page, if the
            # prompt filled its pages, else the first page the eviction empties
            has_next_page = bool(request.reserved)
            plan = None if target is None else self._plan_evict(
                request, pages_to_free=pages_before - target.pages_after + (0 if has_next_page else 1))
            if plan is None:
                return
            bytes_in, bytes_out = self._evict(request, plan, keep_next_page=not has_next_page)
            self.controller.record_eviction(request_id, pages_before=pages_before, pages_after=request.pages_held,
                                            bytes_in=bytes_in, bytes_out=bytes_out, started_perf_s=started,
                                            reason=Reason.PROMPT_BUDGET)

    def relieve_pressure(self, pages_needed: int, exclude: str | None = None) -> int:
        """The fallback when a page is still missing: compress other running requests so
        ``pages_needed`` pages come free, before the engine preempts anyone (the controller's
        relief plan: lowest LTS first, never below a request's floor).

        Returns:
            Pages returned to the pool (may be fewer than asked; then preemption is the last resort).
        """
        if not self.method.relieves_pressure or pages_needed <= 0:
            return 0
        reclaims = []
        with self.controller.guard("actuator", "relieving pool pressure failed; the engine may preempt"):
            self._refresh_readings(list(self.requests.values()))
            views = [self._view(r, 0) for r in self.requests.values() if r.request_id != exclude]
            reclaims = self.controller.plan_relief(pages_needed, views)
        freed = 0
        for item in reclaims:
            request = self.requests[item.request_id]
            free_before = self.pool.num_free
            with self.controller.guard("actuator", "relieving pool pressure failed; the engine may preempt"):
                self._relieve(request, item.pages_gained)
            freed += self.pool.num_free - free_before
        return freed

    def _relieve(self, request: RequestKV, pages: int) -> None:
        """Free ``pages`` pages of ``request`` for the pool: quantize its oldest full pages first
        (when the method quantizes: INT8 halves them and drops no token), then evict the
        lowest-ranked tokens for what is still missing."""
        gained = 0
        while self.method.quantizes_under_pressure and gained < pages:
            plan = self._plan_quantize(request)
            if plan is None:
                break
            pages_before, free_before, started = request.pages_held, self.pool.num_free, time.perf_counter()
            bytes_in, bytes_out = self._quantize(request, plan, keep_next_page=False)
            gained += self.pool.num_free - free_before
            self.controller.record_eviction(
                request.request_id, pages_before=pages_before, pages_after=request.pages_held, bytes_in=bytes_in,
                bytes_out=bytes_out, started_perf_s=started, reason=Reason.POOL_PRESSURE, kind=Action.QUANTIZE)
        if gained >= pages:
            return
        pages_before, started = request.pages_held, time.perf_counter()
        # the first page a compaction empties stays the request's next page: free one more
        evict_plan = self._plan_evict(request, pages_to_free=pages - gained + 1)
        if evict_plan is None:
            return
        bytes_in, bytes_out = self._evict(request, evict_plan)
        self.controller.record_eviction(
            request.request_id, pages_before=pages_before, pages_after=request.pages_held,
            bytes_in=bytes_in, bytes_out=bytes_out, started_perf_s=started, reason=Reason.POOL_PRESSURE)

    # ---- compression ----------------------------------------------------------------------------
    def _private_pages(self, request: RequestKV, fmt: PageFormat) -> list[int]:
        return [p for p in request.pages if self.store.format[p] is fmt and not self.pool.is_shared(p)]

    def _plan_quantize(self, request: RequestKV) -> _QuantizePlan | None:
        """The oldest full FP pages that hold no protected token, enough to free one page."""
        per_target = self.store.tokens_per_page[self._quant_format]
        group = per_target // self.config.block_size
        candidates = [p for p in self._private_pages(request, PageFormat.FULL)
                      if self.store.fill[p] == self.config.block_size]
        if len(candidates) < group:
            return None
        index = torch.tensor(candidates, dtype=torch.long, device=self.store.device)
        positions = self.store.positions[index, :self.config.block_size]
        low = positions.min(dim=1).values.tolist()
        high = positions.max(dim=1).values.tolist()
        recent_start = request.logical_length - self.config.recent_window_tokens
        eligible = [page for page, lo, hi in zip(candidates, low, high, strict=True)
                    if lo >= self.config.sink_tokens and hi < recent_start]
        if len(eligible) < group:
            return None
        return _QuantizePlan(pages=eligible[:group], fmt=self._quant_format)

    def _group_tokens(self, pages: list[int], fmt: PageFormat) -> tuple[torch.Tensor, torch.Tensor, int]:
        per_page = self.store.tokens_per_page[fmt]
        index = torch.tensor(pages, dtype=torch.long, device=self.store.device)
        count = sum(self.store.fill[p] for p in pages)
        positions = self.store.positions[index, :per_page].reshape(-1)[:count]
        scores = self.store.scores[index, :per_page].reshape(-1)[:count]
        return positions, scores, count

    def _plan_evict(self, request: RequestKV, pages_to_free: int | None = None) -> _EvictPlan | None:
        """Drop the lowest-ranked unprotected tokens of one format group to free pages.

        Full-precision tokens go first (compaction is exact); quantized groups are compacted only
        when the full-precision group cannot free a page (their survivors are re-quantized).
        ``pages_to_free`` defaults to what the method frees at a boundary.
        """
        if pages_to_free is None:
            pages_to_free = self.method.pages_to_free(request.pages_held, request.base_pages,
                                                      self.config.evict_min_pages)
        for fmt in (PageFormat.FULL, PageFormat.INT8, PageFormat.INT4):
            pages = self._private_pages(request, fmt)
            if not pages:
                continue
            positions, scores, count = self._group_tokens(pages, fmt)
            per_page = self.store.tokens_per_page[fmt]
            drop = tokens_to_drop(count, per_page, pages_to_free)
            if drop == 0 or math.ceil(count / per_page) < pages_to_free:
                continue
            protection = Protection(request.logical_length, self.config.sink_tokens,
                                    self.config.recent_window_tokens)
            survivors = self.method.survivors(positions, self.method.rank(positions, scores), count - drop, protection)
            if survivors is None:
                continue
            keep = torch.zeros(count, dtype=torch.bool, device=positions.device)
            keep[survivors] = True
            return _EvictPlan(fmt=fmt, pages=pages, keep=keep)
        return None

    def _reclaim(self, request: RequestKV, emptied: list[int], keep_next_page: bool = True) -> None:
        """The first page a compression empties becomes the request's next page (that is the room
        it compressed for) unless ``keep_next_page`` is False (pressure relief: the pool needs it);
        any others go back to the pool."""
        for index, page in enumerate(emptied):
            request.pages.remove(page)
            self.store.clear(page)
            if index == 0 and keep_next_page:
                self.pool.mark_reserved(page)
                request.reserved.append(page)
            else:
                self.pool.release(page)

    def _quantize(self, request: RequestKV, plan: _QuantizePlan, keep_next_page: bool = True) -> tuple[int, int]:
        bytes_in = sum(self.store.stored_bytes(p) for p in plan.pages)
        values = self.store.read_all_layers(plan.pages, torch.float32)
        positions, scores, _ = self._group_tokens(plan.pages, PageFormat.FULL)
        emptied = self.store.write_group(plan.pages, plan.fmt, values, positions.clone(), scores.clone())
        bytes_out = sum(self.store.stored_bytes(p) for p in plan.pages if p not in emptied)
        self._reclaim(request, emptied, keep_next_page)
        self.stats.record_compression(bytes_in, bytes_out)
        return bytes_in, bytes_out

    def _evict(self, request: RequestKV, plan: _EvictPlan, keep_next_page: bool = True) -> tuple[int, int]:
        # Tokens before the first dropped one stay where they are: only the pages from the one
        # holding it onward are read and rewritten (a group's pages are chronological and full but
        # the last). That is less copying, and untouched quantized pages keep their codes and scales
        # instead of being re-quantized from their own dequantized values.
        positions, scores, _ = self._group_tokens(plan.pages, plan.fmt)
        keep = plan.keep
        dropped = (~keep).nonzero()
        first_page = int(dropped[0, 0]) // self.store.tokens_per_page[plan.fmt] if dropped.numel() else len(plan.pages)
        tail_pages = plan.pages[first_page:]
        start = first_page * self.store.tokens_per_page[plan.fmt]
        kept_tail = keep[start:]
        emptied = []
        if tail_pages:
            values = self.store.read_all_layers(tail_pages, torch.float32)
            emptied = self.store.write_group(tail_pages, plan.fmt, values[:, kept_tail],
                                             positions[start:][kept_tail].clone(), scores[start:][kept_tail].clone())
        self._reclaim(request, emptied, keep_next_page)
        # bytes before / after, over the compacted group (as inside vLLM): protected tokens count on
        # both sides, so the ratio is finite even when every unprotected token goes
        token_bytes = self.store.token_bytes(plan.fmt)
        bytes_in = round(keep.numel() * token_bytes)
        bytes_out = round(int(keep.sum()) * token_bytes)
        self.stats.record_compression(bytes_in, bytes_out)
        return bytes_in, bytes_out

    # ---- token scores and attention needs -------------------------------------------------------
    def _score_weight(self, request: RequestKV, num_tokens: int) -> float:
        """What this step's observation of ``request`` weighs in its tokens' scores (its
        ``logical_length`` already counts the step's tokens): the method's weight for a prompt
        chunk, the step that ends the prompt, or a decode step."""
        kind = observation_kind(request.control.prompt_tokens, request.logical_length - num_tokens, num_tokens)
        return self.method.observation_weight(kind)

    def _measure_attention_needs(self, requests: list[RequestKV]) -> None:
        """Tell the controller how many tokens each enforced request's attention needs
        (the method's ``attention_need`` over its tokens' scores, as inside vLLM),
        once its prompt was observed and then every :data:`NEED_EVERY_TOKENS` tokens."""
        for request in requests:
            observed = request.logical_length >= request.control.prompt_tokens  # its prompt's step ran
            measured_lately = (request.need_measured_at >= 0
                               and request.logical_length - request.need_measured_at < NEED_EVERY_TOKENS)
            if request.mode is not Mode.ENFORCE or not observed or measured_lately:
                continue
            request.need_measured_at = request.logical_length
            groups = [self._group_tokens(pages, fmt) for fmt in PageFormat
                      if (pages := [p for p in request.pages if self.store.format[p] is fmt])]
            if not groups:
                continue
            positions = torch.cat([g[0] for g in groups])
            scores = torch.cat([g[1] for g in groups])
            protected = protected_mask(positions, request.logical_length, self.config.sink_tokens,
                                       self.config.recent_window_tokens)
            need = self.method.attention_need(self.method.rank(positions, scores).cpu(), protected.cpu(),
                                              self._attention_coverage)
            self.controller.update_attention_need(request.request_id, need)

    # ---- the step -----------------------------------------------------------------------------
    def plan_step(self, batch: Sequence[tuple[str, int]]) -> StepPlan:
        """Assign slots for each request's new tokens and build the step's layout.

        Args:
            batch: ``(request_id, num_new_tokens)`` per row; ``ensure_slots`` must have said OK.
        """
        write_pages, write_slots, write_positions = [], [], []
        query_positions = []
        weights: list[float] = []
        for request_id, num_tokens in batch:
            request = self.requests[request_id]
            positions = list(range(request.logical_length, request.logical_length + num_tokens))
            for position in positions:
                head = self._head_page(request)
                if head is None:
                    if not request.reserved:
                        raise GrowPageError(f"request {request_id!r} has no free slot: call ensure_slots first")
                    head = request.reserved.pop(0)
                    self.pool.mark_used(head)
                    request.pages.append(head)
                slot = self.store.fill[head]
                self.store.fill[head] = slot + 1
                write_pages.append(head)
                write_slots.append(slot)
                write_positions.append(position)
            request.logical_length += num_tokens
            query_positions.append(positions)
            weights.append(self._score_weight(request, num_tokens))
        self.store.assign_slots(write_pages, write_slots, write_positions)
        layout = attn.build_layout(self.store, [self.requests[r].pages for r, _ in batch], query_positions)
        device = self.store.device
        requests = [self.requests[r] for r, _ in batch]
        return StepPlan(
            request_ids=[r for r, _ in batch], layout=layout,
            write_pages=torch.tensor(write_pages, dtype=torch.long, device=device),
            write_slots=torch.tensor(write_slots, dtype=torch.long, device=device),
            observed_rows=torch.tensor([r.mode is not Mode.OFF for r in requests], device=device),
            summary_rows=torch.tensor([r.summary_row for r in requests], dtype=torch.long, device=device),
            bin_mass=torch.zeros(len(batch), self.config.sts_num_bins, device=device),
            entropy=torch.zeros(len(batch), device=device),
            score_weights=torch.tensor(weights, dtype=torch.float32, device=device))

    def attend(self, layer: int, plan: StepPlan, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, scale: float) -> torch.Tensor:
        """Store this step's K/V for ``layer`` and return attention over each request's pages.

        Args:
            query: ``[batch, max_queries, q_heads, head_dim]`` (padded rows are ignored).
            key, value: ``[num_new_tokens, kv_heads, head_dim]``, in ``plan_step`` batch order.
        """
        self.store.write_tokens(layer, plan.write_pages, plan.write_slots, key, value)
        keys, values = attn.gather_kv(self.store, layer, plan.layout, self.compute_dtype)
        out = attn.paged_attention(query.to(self.compute_dtype), keys, values, plan.layout, scale)
        if layer in self.observed_layers:
            try:
                self._observe(plan, query, keys, scale)
            except Exception:
                self._fault("observer", "observing attention failed; summaries skip this layer")
        return out

    def _observe(self, plan: StepPlan, query: torch.Tensor, keys: torch.Tensor, scale: float) -> None:
        probs = attn.newest_query_probs(query, keys, plan.layout, scale)  # [B, Hq, K]
        probs = probs * plan.observed_rows[:, None, None]
        bin_mass, entropy = summarize_attention(probs, plan.layout.key_positions,
                                                plan.layout.logical_lengths, self.config.sts_num_bins)
        plan.bin_mass += bin_mass
        plan.entropy += entropy
        if plan.layers_observed == 0 and self.method.step_decay < 1.0:  # older attention fades, once a step
            self.store.scores.mul_(self.method.step_decay)
        plan.layers_observed += 1
        token_mass = (probs.mean(dim=1) * plan.score_weights[:, None]).reshape(-1)
        self.store.scores.view(-1).index_add_(0, plan.layout.key_slot_ids, token_mass)

    def finish_step(self, plan: StepPlan) -> None:
        """Fold the step's observations into the summaries (device ops only)."""
        if plan.layers_observed == 0:
            return
        try:
            rows = plan.summary_rows[plan.observed_rows]
            if rows.numel() == 0:
                return
            scale = 1.0 / plan.layers_observed
            self.summaries.observe(rows, plan.bin_mass[plan.observed_rows] * scale,
                                   plan.entropy[plan.observed_rows] * scale)
        except Exception:
            self._fault("summaries", "summary update failed; skipping this step's observation")

    # ---- release ------------------------------------------------------------------------------
    def release(self, request_id: str, reason: str = "finished") -> None:
        """Return every page of a request (finished, aborted or preempted). Idempotent."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if request.mode is not Mode.OFF:
            with self.controller.guard("summaries", "reading summaries at release failed"):
                self._refresh_readings([request])
        for page in request.pages + request.reserved:
            if self.pool.ref_count(page) == 1:
                self.store.clear(page)
            self.pool.release(page)
        self._free_rows.append(request.summary_row)
        self.controller.release(request_id, reason, num_tokens=request.logical_length)

    # ---- faults and stats ---------------------------------------------------------------------
    def _fault(self, component: str, message: str) -> None:
        self.controller.fault(component, message)

    def _refresh_readings(self, requests: list[RequestKV]) -> None:
        """Hand the controller the latest summaries of ``requests`` (one device sync)."""
        tracked = [r for r in requests if r.mode is not Mode.OFF]
        for request, reading in zip(tracked, self.summaries.read([r.summary_row for r in tracked]), strict=True):
            if reading.steps_observed:
                self.controller.update_reading(request.request_id,
                                               Reading(reading.sts_density, reading.lts_entropy))

    def gauges(self) -> PoolGauges:
        """Current pool state (one device sync for the summary readings)."""
        requests = list(self.requests.values())
        self._refresh_readings(requests)
        distinct_pages = {p for r in requests for p in r.pages}
        used_slots = sum(self.store.capacity(p) for p in distinct_pages)
        reserved_slots = sum(len(r.reserved) for r in requests) * self.config.block_size
        return self.controller.pool_gauges(
            num_pages=self.pool.num_pages, pages_free=self.pool.num_free,
            pages_reserved=self.pool.num_reserved, pages_used=self.pool.num_used,
            live_tokens=sum(self.store.fill[p] for p in distinct_pages),
            granted_token_slots=used_slots + reserved_slots, used_token_slots=used_slots,
            logical_bytes=self.store.logical_bytes(sum(r.logical_length for r in requests)),
            stored_bytes=sum(self.store.live_bytes(p) for p in distinct_pages))

    def make_stats(self) -> StatsSnapshot:
        """Get-and-reset snapshot for the telemetry collector (its only consumer)."""
        return self.controller.make_stats(self.gauges())
