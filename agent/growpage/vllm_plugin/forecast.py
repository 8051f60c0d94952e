"""Monitor's forecast: what enforce would do on this deployment's own traffic, before it enforces.

In ``monitor`` vLLM pages on its own; GrowPage observes. The forecast keeps, for every monitored
running request, a *shadow* of the KV enforce would hold: its pages and the tokens its compactions
would have dropped. Each step, with the tokens vLLM scheduled:

- a shadow that needs a page past its grant is a boundary: the contract runs on the shadow (its
  pages, the request's readings and attention need, the pool as enforce would see it: vLLM's free
  pages plus what the shadows hold less, less what enforce runs that vLLM does not) as a preview
  that changes no request state (:meth:`~growpage.core.controller.GrowthController.plan_boundary`
  with ``commit`` False), under the step's pressure as enforce's ``plan_step`` measures it: a
  request that waits and whose admission fits the floors reserves its prompt's pages, so
  growth is refused and the shadow compresses where enforce would (leaving that reserve out
  forecast a fifth fewer pages freed). An eviction shrinks the shadow to the plan's pages and
  counts the pages it frees against growing;
- a prompt that has just been cached while a request waits that the (shadow) pool cannot admit
  once the step's growth is paid is compressed to its floor, as enforce compresses a fresh prompt
  for admission (GrowPage's methods, ``attention_coverage`` > 0), whether its gate is idle or not;
  so is a request vLLM resumed, whose recompute caches its prompt and output so far;
- growth-aware admission (:mod:`~growpage.vllm_plugin.admission`), as the deployment configures it,
  or as ``projected`` where enforce would admit as vLLM does:
  before each step with requests waiting, the same projection runs on vLLM's running and waiting
  requests (read only; monitored requests projected to their floors), and a request vLLM starts
  that growth-aware admission would have held is marked;
- a preemption vLLM makes of a marked request is *avoidable by admission*: admission would not
  have started it yet (vLLM preempts the newest running request first, which is the one started
  over the projection). It is counted apart whatever the setting (what turning admission on would
  buy), and among the avoidable preemptions only where enforce runs that admission;
- enforce's own admission under ``auto`` decides on the costs it measured: a start counts as one
  it would have held only in a step where this forecast's fit says so too. Before the fit can tell
  the costs apart (vLLM alone starts a whole batch at once, and its second prefill may come only
  with the first finish) enforce would decide on the host's prior, but only until its own
  fit is ready (a measuring start prefills for it: 8-10 steps on the AVX-512 host; the start enforce
  would make beyond the projection is marked as held by no one here); counting the prior's
  holds forecast 50-100 % more avoided preemptions than enforce avoided, when the prior lasted
  25-30 steps;
- any other preemption is *avoidable* when enforce would have had a page for it: the pages the
  shadows hold fewer than vLLM's requests do, less what enforce runs that vLLM does not, else
  what pressure relief frees, pages off the shadows with the lowest long-term entropy above their
  floors (as enforce's relief chooses; compactions the forecast counts). Each avoidable
  preemption spends one page of the step;
- what enforce runs that vLLM does not (:class:`KeptRequest`): a request whose preemption it
  avoids keeps running on its shadow's pages, a page more at each boundary (where compression
  pays, one evicted instead, down to its floor), until vLLM runs it again or it would have ended
  (vLLM hands those pages to others meanwhile); and the waiting requests enforce admits, in vLLM's
  order, into the pages its compactions spare, until vLLM admits them too (enforce admits as vLLM
  does, into free pages; not those its growth-aware admission holds). Their pages are owed out of
  the shadows' room in every step: where they outgrow it, relief compresses the shadows in that
  step, and where the floors cannot give enough, enforce preempts the newest of them after all (an
  avoided preemption counts only once its request settles, so the counter never goes back);
- what each avoided preemption would have cost vLLM: its request's tokens at the preemption (its
  prompt and its output so far, all recomputed when it runs again) at the engine's measured cost of
  a prefilled token (the scheduler's step-cost fit, the one measured admission reads), counted with
  it. This is what enforce buys in time, for ``gpctl calibrate`` to weigh against what GrowPage's
  own work costs (``growpage_vllm_own_seconds_total``). An upper bound where vLLM's prefix cache
  still holds some of the request's blocks when it resumes; nothing is counted before the fit
  prices a token (the first prefills of a run);
- what enforce's wider batch would save: each token a request enforce runs where vLLM does not
  (one it kept from a preemption, one it admitted into spared pages) decodes inside a step enforce
  runs anyway, where vLLM decodes it later for a share of a step's fixed cost (``fixed_s / width``
  of the same fit), counted when the request settles. With the recompute, what enforce would buy in
  time.

Measured (``gpctl bench vllm --part forecast``, AVX-512, seeds 14-19 and 24-27): counting one
page per avoided preemption and giving every spared page to admission while requests waited
forecast 61 avoided preemptions where enforce avoided 39, and pages freed within 25 % on five
traces of ten; with what enforce runs owed and the admission reserve, 48 against 39 and pages
within 25 % on nine.

Exported beside the contract (:class:`ForecastCollector`): pages enforce would have freed,
compactions it would have made, preemptions it would have avoided (and every preemption, the
denominator), and the pages it would have free now beyond vLLM's. Prometheus adds ``namespace``
and ``pod`` at the scrape, so a rollout reads them per namespace.

What the shadow does not model: enforce's compactions change what vLLM schedules next (fewer
preemptions recompute less, a wider batch decodes more per step), and its floors follow attention
needs measured on compacted caches. ``gpctl bench vllm --part forecast`` measures the forecast
against what enforce then does on the same trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from growpage import catalog
from growpage.config import Mode
from growpage.core.admission import StepCosts
from growpage.core.compression_gate import CompressionGate, StepGate, wider_batch_pays
from growpage.core.controller import GrowthController, ceil_div
from growpage.core.policy import Action
from growpage.core.step_control import (
    PoolPressure,
    ReclaimCandidate,
    RequestView,
    admission_blocked,
    compression_pays,
    floor_pages,
    growth_reserve,
    measure_pressure,
    plan_reclaim,
    protected_tokens,
)
from growpage.vllm_plugin.admission import AdmissionGate, compression_of, need_share_at_end
from growpage.vllm_plugin.blocks import blocks_by_request
from growpage.vllm_plugin.vllm_types import Request, Scheduler


@dataclasses.dataclass
class ShadowKV:
    """The KV enforce would hold for one running request.

    Attributes:
        pages: pages it would hold after this step.
        dropped: tokens its compactions would have dropped.
        prompt_settled: its first decode step has been seen (a prompt is compressed for admission once).
        over_projection: vLLM started it where growth-aware admission would have held it.
        enforce_would_hold: ... and enforce's admission would have (``auto``: it looked ahead in
            that step, the measured costs saying holding pays).
    """

    pages: int
    dropped: int = 0
    prompt_settled: bool = False
    over_projection: bool = False  # vLLM started it where growth-aware admission would have held it
    enforce_would_hold: bool = False


@dataclasses.dataclass
class KeptRequest:
    """A request enforce would run that vLLM does not: one whose preemption it avoids, or a waiting
    one it admits into the pages its compactions spare. It decodes on in enforce's pool, on pages
    vLLM holds for others, until vLLM runs it too or it would have ended.

    Attributes:
        pages: pages it would hold now.
        physical_tokens: tokens its KV would hold (less what its compactions dropped).
        steps_left: decode steps until it would end (its ``max_tokens``; None: unknown, it ends
            only when vLLM runs it again).
        at_boundary: its last page was full: it took a page this step.
        recompute_s: what vLLM's recompute of it costs, counted with the avoided preemption.
        width_s: what its tokens decoded in enforce's batch would save vLLM so far (each one's
            share of a step's fixed cost at vLLM's batch width), counted when it settles.
    """

    pages: int
    physical_tokens: int
    steps_left: int | None
    avoided: bool = True  # False: enforce admitted it where vLLM has not yet
    recompute_s: float = 0.0
    width_s: float = 0.0
    at_boundary: bool = False  # it took a page this step (its last one was full)


@dataclasses.dataclass(frozen=True)
class WaitingRequest:
    """A request waiting in vLLM's queue, as the forecast reads it.

    Attributes:
        request_id: the request.
        prompt_tokens: its prompt (what enforce's step pressure reads of the oldest waiting request).
        tokens: tokens its admission computes (its prompt, and its output so far after a preemption).
        steps_left: decode steps to its end (its ``max_tokens``; None: unknown).
    """

    request_id: str
    prompt_tokens: int
    tokens: int
    steps_left: int | None = None


@dataclasses.dataclass(frozen=True)
class StepRequest:
    """One running request as the forecast reads a step (plain values: tests need no vLLM).

    Attributes:
        request_id: the request.
        pages_held: blocks vLLM gave it, this step's included.
        tokens: tokens its KV holds once this step runs (computed + scheduled).
        new_tokens: tokens this step computes for it.
        prompt_tokens: its prompt's length.
    """

    request_id: str
    pages_held: int
    tokens: int
    new_tokens: int
    prompt_tokens: int

    @property
    def decoding(self) -> bool:
        return self.tokens > self.prompt_tokens


@dataclasses.dataclass(frozen=True)
class ForecastTotals:
    """The forecast's counters and gauge, as the exporter serves them."""

    pages_freed: int = 0
    compactions: int = 0
    preemptions: int = 0
    preemptions_avoidable: int = 0
    spare_pages: int = 0
    preemptions_avoidable_by_admission: int = 0
    recompute_seconds_avoidable: float = 0.0
    wider_batch_seconds: float = 0.0


class EnforceForecast:
    """The shadow of enforce over monitor's steps (see the module docstring).

    Args:
        controller: the scheduler's growth controller (readings, attention needs, the contract).
        admission: a gate of its own, read only (never setting vLLM's limit): what growth-aware
            admission would have held (None: admission is not forecast).
        enforce_admits_so: enforce runs that admission (``admission`` other than ``vllm``), so the
            preemptions it would avoid count among those enforce avoids; either way they are counted
            apart (``preemptions_avoidable_by_admission``), so an operator sees what turning it on buys.
        compression_gate: enforce leaves decode-time compression idle while it buys nothing
            (:mod:`~growpage.core.compression_gate`), so the shadows run the same gate on their own
            pages and vLLM's preemptions: while it is idle their boundaries grow, no relief makes
            room and no preemption is avoidable; a prompt is still compressed for admission.
    """

    def __init__(self, controller: GrowthController, admission: AdmissionGate | None = None, *,
                 enforce_admits_so: bool = False, compression_gate: bool = False):
        self.controller = controller
        self.block_size = controller.config.block_size
        self.admission = admission
        self.enforce_admits_so = enforce_admits_so
        self.preemptions_avoidable_by_admission_total = 0
        self._would_hold: frozenset[str] = frozenset()  # waiting requests admission holds this step
        self._enforce_looks_ahead = False  # enforce's admission looks ahead this step, on its measured costs
        self.shadows: dict[str, ShadowKV] = {}
        self.pages_freed_total = 0
        self.compactions_total = 0
        self.preemptions_total = 0
        self.preemptions_avoidable_total = 0
        # what vLLM's recomputes of those preemptions cost (seconds, at the engine's measured cost a token)
        self.recompute_seconds_avoidable_total = 0.0
        # what the tokens enforce decodes beside vLLM's batch would save (seconds; see _decode_kept)
        self.wider_batch_seconds_total = 0.0
        self.spare_pages = 0  # pages enforce would have free now beyond vLLM's
        # what enforce would run that vLLM does not (see :meth:`on_preempt` and :meth:`_admit`)
        self._kept: dict[str, KeptRequest] = {}
        # the spare pages this step's preemptions may still spend: computed at the first preemption
        # after a step (most steps preempt nothing)
        self._step_room: int | None = 0
        self._step_monitored: Sequence[StepRequest] = ()
        # enforce's gate on the shadows: its verdict for their step (and the preemptions of the next)
        self.gate = StepGate(CompressionGate() if compression_gate and controller.method.idles_unpaid else None)

    def before_schedule(self, scheduler: Scheduler, limit: int | None) -> None:
        """Before vLLM schedules: which waiting requests growth-aware admission would hold under
        vLLM's admission ``limit`` (None: this vLLM has none). Nothing is read while none waits."""
        self._would_hold = frozenset()
        if self.admission is None or limit is None:
            return
        # auto (measured) looks ahead only in some steps; what projected would hold is counted in every one
        looks_ahead = self.admission.advance(scheduler)
        self._enforce_looks_ahead = self.enforce_admits_so and looks_ahead and self.admission.decides_on_evidence
        if not (looks_ahead or self.admission.policy == "measured") or not scheduler.waiting:
            return
        plan = self.admission.plan(scheduler, blocks_by_request(scheduler.kv_cache_manager),
                                   lambda request: compression_of(self.controller, request, Mode.MONITOR), limit)
        self._would_hold = frozenset(plan.held)

    def on_step(self, requests: Sequence[StepRequest], *, free_pages: int,
                waiting: Sequence[WaitingRequest] = (), total_pages: int | None = None,
                room_for_all: bool = False) -> None:
        """Advance every monitored request's shadow by one step (requests GrowPage does not monitor
        are left out: enforce would leave them to vLLM too). ``total_pages``: the pool's size (None:
        a waiting request's admission is taken to fit the floors). ``room_for_all``: vLLM's pool
        holds every request at its full length (enforce's, which frees pages, then does too), so
        enforce's boundaries would grow."""
        monitored = [r for r in requests if self._monitored(r.request_id)]
        live = {r.request_id for r in requests}
        for request_id in [rid for rid in self.shadows if rid not in live]:
            del self.shadows[request_id]  # finished or preempted without a callback seen
        self._decode_kept(live, len(requests))
        shadows = [self.shadows[r.request_id] for r in monitored if r.request_id in self.shadows]
        idle = self.gate.step(dropped_tokens=sum(shadow.dropped for shadow in shadows),
                              pages_held=[shadow.pages for shadow in shadows], block_size=self.block_size,
                              costs=self._step_costs)
        free = max(0, free_pages + self._spare(monitored) - self.kept_pages)
        pressure = self._pressure(monitored, free, self._oldest_waiting_prompt(waiting), total_pages)
        # once for the step, as enforce's plan_step decides it
        blocked = admission_blocked(pressure, compression_idle=idle,
                                    wider_batch_pays=not idle or wider_batch_pays(self._step_costs(), len(requests)))
        for request in monitored:
            shadow = self.shadows.get(request.request_id)
            if shadow is None or not request.decoding:
                # admitted or still in its prompt: enforce holds what vLLM holds
                if shadow is not None:
                    over, enforced = shadow.over_projection, shadow.enforce_would_hold
                else:
                    over = request.request_id in self._would_hold
                    enforced = over and self._enforce_looks_ahead
                self.shadows[request.request_id] = ShadowKV(pages=request.pages_held, over_projection=over,
                                                            enforce_would_hold=enforced)
                continue
            if not shadow.prompt_settled:
                shadow.prompt_settled = True
                if blocked:
                    free += self._compress_for_admission(request, shadow)
            free += self._advance(request, shadow, free, pressure, room_for_all, idle)
        if not idle and (compression_pays(pressure) or free < 1):
            self._compress_kept()
        self._fit_kept(monitored, free_pages)
        self.spare_pages = self._spare(monitored)  # after relief, which the admissions leave as it is
        self._admit(waiting, free_pages + self.spare_pages - self.kept_pages)
        self._step_room = None
        self._step_monitored = monitored

    def on_preempt(self, request_id: str, steps_left: int | None = None, tokens: int = 0) -> None:
        """vLLM preempted a monitored request with ``steps_left`` decode steps to its end (None:
        unknown) and ``tokens`` to recompute when it runs again (its prompt and its output so far):
        avoidable when enforce would have had a page."""
        if not self._monitored(request_id):
            return
        self.preemptions_total += 1
        self.gate.note_preemption(tokens)
        if self.admission is not None:
            self.admission.on_preempt()
        recompute_s = self._recompute_seconds(tokens)
        shadow = self.shadows.get(request_id)
        if shadow is not None and shadow.over_projection:
            self.preemptions_avoidable_by_admission_total += 1  # admission would not have started it yet
            if shadow.enforce_would_hold:
                self._count_avoided(recompute_s)
                del self.shadows[request_id]
                return
        shadow = self.shadows.pop(request_id, None)
        if self.gate.idle:
            return  # enforce's gate is idle: vLLM preempts it as it would alone
        if self._step_room is None:
            self._step_room = self.spare_pages
        room = self._step_room - self.kept_pages
        if room < 1:
            gained = self._relieve(self._step_monitored, 1 - room)
            self._step_room += gained
            room += gained
        if room >= 1:
            self._step_room -= 1  # the page the request vLLM preempted for would have grown into
            if not self._keep(request_id, shadow, steps_left, recompute_s):
                self._count_avoided(recompute_s)  # nothing of it to hold: avoided outright

    def on_finish(self, request: Request) -> None:
        """A monitored request finished: admission learns its output and its attention need."""
        kept = self._kept.pop(request.request_id, None)
        if kept is not None:
            self._settle(kept)  # enforce kept it running to its end
        if self.admission is not None and self._monitored(request.request_id):
            self.admission.on_finish(request, need_share_at_end(self.controller, request))

    def _step_costs(self) -> StepCosts | None:
        """This engine's measured step costs (:class:`~growpage.core.admission.StepCostFit`, the
        scheduler's step meter): None until a fit prices a token (the first prefills of a run) or
        where no admission is forecast."""
        return self.admission.step_costs.costs() if self.admission is not None else None

    def _recompute_seconds(self, tokens: int) -> float:
        """What recomputing ``tokens`` costs this engine, at its measured cost of a prefilled token."""
        costs = self._step_costs()
        return tokens * costs.per_token_s if costs is not None else 0.0

    def _settle(self, kept: KeptRequest) -> None:
        """A request enforce ran beside vLLM's batch settled (vLLM runs it too, or it would have
        ended): its avoided preemption, and the width its tokens would have bought, count now."""
        if kept.avoided:
            self._count_avoided(kept.recompute_s)
        self.wider_batch_seconds_total += kept.width_s

    def _count_avoided(self, recompute_s: float) -> None:
        """One preemption enforce would have avoided, settled, and the recompute it would have saved."""
        self.preemptions_avoidable_total += 1
        self.recompute_seconds_avoidable_total += recompute_s

    def forget(self, request_id: str) -> None:
        """The request's run ended: its shadow goes (pages enforce would keep for it stay owed)."""
        self.shadows.pop(request_id, None)

    def totals(self) -> ForecastTotals:
        return ForecastTotals(self.pages_freed_total, self.compactions_total, self.preemptions_total,
                              self.preemptions_avoidable_total, self.spare_pages,
                              self.preemptions_avoidable_by_admission_total,
                              round(self.recompute_seconds_avoidable_total, 6),
                              round(self.wider_batch_seconds_total, 6))

    # ---- requests enforce keeps running where vLLM preempted them --------------------------------------
    def _keep(self, request_id: str, shadow: ShadowKV | None, steps_left: int | None, recompute_s: float = 0.0) -> bool:
        """Enforce keeps ``request_id`` running on its shadow's pages. vLLM frees them and hands
        them to others until it runs the request again, so they are owed out of the shadows' room
        from now on, not in this step only (counting one page per avoided preemption spent the
        same spare pages again every step: 4-8 avoided forecast where enforce avoided 1-6).

        The avoided preemption is counted once it settles (vLLM runs the request again, or it
        would have ended), never while enforce may still preempt it: the counter only increases.
        False: the request was not seen running since its last start (nothing of it to hold)."""
        step = next((r for r in self._step_monitored if r.request_id == request_id), None)
        if step is None:
            return False
        pages = shadow.pages if shadow is not None else step.pages_held
        dropped = shadow.dropped if shadow is not None else 0
        self._kept[request_id] = KeptRequest(pages, step.tokens - dropped, steps_left, recompute_s=recompute_s)
        return True

    def _decode_kept(self, live: set[str], width: int) -> None:
        """One step of the requests enforce keeps running: each decodes a token, growing by a page
        at its boundary (where enforce may compress it instead, :meth:`_compress_kept`), and goes
        when vLLM runs it again (both pools hold it then) or when it would have ended.

        Each such token is decoded inside a step enforce runs anyway, where vLLM decodes it later,
        in a step of about this one's ``width`` (the requests vLLM runs now): it saves that step's
        fixed cost shared ``width`` ways, the arithmetic of measured admission's width cost
        (:func:`~growpage.core.admission.lookahead_pays`). Counted when the request settles, never
        for one enforce preempts after all."""
        if not self._kept:
            return  # most steps: nothing runs beside vLLM's batch, and the fit is not solved for nothing
        costs = self._step_costs()
        token_s = costs.fixed_s / max(1, width) if costs is not None else 0.0
        for request_id, kept in list(self._kept.items()):
            if request_id in live or (kept.steps_left is not None and kept.steps_left <= 0):
                del self._kept[request_id]
                self._settle(kept)  # enforce never had to preempt it
                continue
            kept.width_s += token_s
            kept.physical_tokens += 1
            needed = ceil_div(kept.physical_tokens, self.block_size)
            kept.at_boundary = needed > kept.pages
            kept.pages = max(kept.pages, needed)
            if kept.steps_left is not None:
                kept.steps_left -= 1

    def _compress_kept(self) -> None:
        """A request enforce runs beside vLLM's batch reaches a boundary in a step where compression
        pays (the gate open): enforce evicts a page of it instead of growing, down to its floor,
        as it does at any request's boundary. Without one, the forecast missed a third of the pages
        gated enforce freed on two held-out traces: those of the requests it admitted early.
        Their floor is the configured one; a request monitor has not started has no readings (and
        no attention need) yet, so this is the floor's least, as for a low-entropy request. Enforce's
        floor for it follows its prompt end's need, which on decode-heavy prompts is the prompt,
        about that least (sink and recent window); planning it instead at the need finished
        requests showed over whole answers, as growth-aware admission plans an unobserved request,
        forecast fewer pages than enforce freed on five traces of six, and none within 25 %."""
        for request_id, kept in self._kept.items():
            if not kept.at_boundary:
                continue
            held = kept.pages - 1  # before the page it took
            # the tokens cached before this step's; the controller's floor (no attention need where unobserved)
            if self.controller.floor_of(self._view(request_id, held, kept.physical_tokens - 1)) > held:
                continue
            kept.pages = held
            kept.physical_tokens = (held - 1) * self.block_size + 1  # the page's tokens gone, this step's kept
            kept.at_boundary = False
            self.pages_freed_total += 1
            self.compactions_total += 1

    def _fit_kept(self, monitored: Sequence[StepRequest], free_pages: int) -> None:
        """Enforce's pool holds what it keeps running. Where the kept requests' pages outgrow vLLM's
        free pages and the shadows' spare, enforce's pressure relief compresses the shadows for
        them, in this step as in every step it runs short (not only in the steps vLLM preempts in:
        a preemption frees a whole request's pages, relief one boundary's). Where the floors cannot
        give enough, enforce preempts the newest kept request after all (not counted as avoided)."""
        deficit = self.kept_pages - free_pages - self._spare(monitored)
        if deficit <= 0:
            return
        if not self.gate.idle:
            deficit -= self._relieve(monitored, deficit)
        while deficit > 0 and self._kept:
            deficit -= self._kept.pop(next(reversed(self._kept))).pages  # never counted as avoided

    def _admit(self, waiting: Sequence[WaitingRequest], free: int) -> None:
        """Enforce admits waiting requests, in vLLM's order, into the pages its pool has free
        beyond vLLM's (its compactions'), where vLLM cannot yet: each then runs in enforce's pool
        only, until vLLM admits it too."""
        for request in waiting:
            if request.request_id in self._kept:
                continue  # already running in enforce's pool
            if self._enforce_looks_ahead and request.request_id in self._would_hold:
                break  # enforce's admission holds it, and those after it
            pages = ceil_div(request.tokens, self.block_size)
            if pages > free:
                break
            self._kept[request.request_id] = KeptRequest(pages, request.tokens, request.steps_left, avoided=False)
            free -= pages

    @property
    def kept_pages(self) -> int:
        """Pages enforce would hold for what it runs that vLLM does not."""
        return sum(kept.pages for kept in self._kept.values())

    # ---- one request ---------------------------------------------------------------------------------
    def _pressure(self, monitored: Sequence[StepRequest], free: int, waiting: int | None,
                  total_pages: int | None) -> PoolPressure:
        """The pressure enforce's step would start under on the shadows' pool (``waiting``: the oldest
        waiting request's prompt tokens), measured as its
        :meth:`~growpage.core.controller.GrowthController.plan_step` measures it: a request that
        waits and whose admission fits the floors makes compression pay at every boundary, not only
        where the pool is out of pages (leaving that out forecast a third fewer compactions)."""
        growth = floors = 0
        for request in monitored:
            shadow = self.shadows.get(request.request_id)
            if shadow is None or not request.decoding or not shadow.prompt_settled:
                continue
            cached = request.tokens - shadow.dropped - request.new_tokens
            growth += ceil_div(cached + request.new_tokens, self.block_size) > shadow.pages
            floors += self.controller.floor_of(self._view(request.request_id, shadow.pages, cached))
        return measure_pressure(
            free_pages=free, total_pages=total_pages if total_pages is not None else 1 << 30,
            growth_pages=growth, running_floor_pages=floors,
            waiting_prompt_pages=self.controller.grant_pages(waiting) if waiting is not None else None,
            waiting_floor_pages=self.controller.config.base_pages if waiting is not None else 0, batch_full=False)

    def _advance(self, request: StepRequest, shadow: ShadowKV, free: int, pressure: PoolPressure,
                 room_for_all: bool = False, idle: bool = False) -> int:
        """One decode step of ``shadow`` under the step's ``pressure``; the change in the shadow
        pool's free pages."""
        physical = request.tokens - shadow.dropped
        needed = ceil_div(physical, self.block_size)
        if needed <= shadow.pages:
            return 0
        grant = self.controller.grant_pages(request.prompt_tokens)
        if shadow.pages < grant:
            grown, shadow.pages = needed - shadow.pages, needed
            return -grown
        before = physical - request.new_tokens  # the tokens cached before this step
        view = self._view(request.request_id, shadow.pages, before)
        plan = self.controller.plan_boundary(view, free_pages=free, reserve_pages=growth_reserve(pressure),
                                             compression_pays=compression_pays(pressure) or free < 1,
                                             room_for_all=room_for_all, compression_idle=idle, commit=False)
        if plan.call.decision.action is Action.EVICT and plan.pages_after <= shadow.pages:
            keep = (plan.pages_after - 1) * self.block_size
            shadow.dropped += before - keep
            freed = shadow.pages + 1 - plan.pages_after  # against growing by the page it needed
            self.pages_freed_total += freed
            self.compactions_total += 1
            change = shadow.pages - plan.pages_after
            shadow.pages = plan.pages_after
            return change
        grown, shadow.pages = needed - shadow.pages, needed  # grows (or vLLM preempts someone)
        return -grown

    def _oldest_waiting_prompt(self, waiting: Sequence[WaitingRequest]) -> int | None:
        """The prompt tokens of the oldest waiting request as enforce's step reads them (None: none
        waits, or enforce's admission holds it this step, so its step sees none waiting)."""
        if not waiting or (self._enforce_looks_ahead and waiting[0].request_id in self._would_hold):
            return None
        return waiting[0].prompt_tokens

    def _compress_for_admission(self, request: StepRequest, shadow: ShadowKV) -> int:
        """In a step whose admission is blocked (a request waits that the pool cannot take once
        this step's growth is paid, :func:`~growpage.core.step_control.admission_blocked`), enforce
        compresses a just-cached prompt to its floor where the floor follows attention; the pages
        that frees. A request vLLM resumed counts: its recompute's end caches its prompt and its
        output so far, and enforce compresses that whole context (with its gate idle, only where the
        wider batch pays). Judging by the waiting prompt against the free pages alone, without this
        step's growth, left those compressions out: on two held-out traces the shadows compressed 1-2
        prompts where enforce compressed 5 resumed requests, whose pages then opened its gate on width."""
        controller = self.controller
        if controller.config.attention_coverage <= 0 or not controller.method.compress_prompt_for_admission:
            return 0
        before = request.tokens - shadow.dropped - request.new_tokens
        floor = controller.floor_of(self._view(request.request_id, shadow.pages, before))
        gained = shadow.pages - floor
        if gained <= 0:
            return 0
        shadow.dropped += before - (floor - 1) * self.block_size
        shadow.pages = floor
        self.pages_freed_total += gained
        self.compactions_total += 1
        return gained

    def _view(self, request_id: str, pages: int, cached_tokens: int) -> RequestView:
        """A request enforce would hold in ``pages``, at a boundary, as the controller sees it."""
        config = self.controller.config
        return RequestView(
            request_id, pages_held=pages, allowance_pages=pages, needs_page=True,
            protected_tokens=protected_tokens(cached_tokens, 0, config.sink_tokens, config.recent_window_tokens),
            compressible=True, can_evict=True)

    # ---- the pool as enforce would see it -----------------------------------------------------------
    def _spare(self, monitored: Sequence[StepRequest]) -> int:
        return sum(max(0, r.pages_held - self.shadows[r.request_id].pages)
                   for r in monitored if r.request_id in self.shadows)

    def _relieve(self, monitored: Sequence[StepRequest], deficit: int) -> int:
        """Pressure relief on the shadows: ``deficit`` pages off the shadows enforce's relief would
        compress first (:func:`~growpage.core.step_control.plan_reclaim`: lowest long-term entropy,
        above its floor); the pages it frees (0: every shadow is at its floor)."""
        config = self.controller.config
        candidates = []
        for request in monitored:
            shadow = self.shadows.get(request.request_id)
            control = self.controller.requests.get(request.request_id)
            if shadow is None or control is None or not shadow.prompt_settled:
                continue
            cached = request.tokens - shadow.dropped
            floor = floor_pages(control.base_pages, protected_tokens(cached, 0, config.sink_tokens,
                                                                      config.recent_window_tokens),
                                self.block_size, control.attention_tokens)
            if shadow.pages > floor:
                candidates.append(ReclaimCandidate(request.request_id, shadow.pages, floor, control.lts_entropy,
                                                   needs_page=False))
        gained = 0
        for reclaim in plan_reclaim(deficit, candidates):
            shadow = self.shadows[reclaim.request_id]
            # whole pages off a shadow above its floor (>= base_pages): its tokens fill more than those
            shadow.dropped += (shadow.pages - reclaim.pages_after) * self.block_size
            shadow.pages = reclaim.pages_after
            self.pages_freed_total += reclaim.pages_gained
            self.compactions_total += 1
            gained += reclaim.pages_gained
        return gained

    def _monitored(self, request_id: str) -> bool:
        control = self.controller.requests.get(request_id)
        return control is not None and control.mode is Mode.MONITOR


def step_requests(scheduler: Scheduler, output: Any, req_to_blocks: dict[str, list]) -> list[StepRequest]:
    """The running requests of vLLM's ``scheduler`` as :class:`StepRequest` records, after it
    scheduled ``output`` (a ``SchedulerOutput``: ``num_scheduled_tokens`` per request)."""
    scheduled = getattr(output, "num_scheduled_tokens", None) or {}
    requests = []
    for request in scheduler.running:
        new_tokens = int(scheduled.get(request.request_id, 0))
        requests.append(StepRequest(request.request_id, len(req_to_blocks.get(request.request_id, ())),
                                    int(request.num_computed_tokens) + new_tokens, new_tokens,
                                    int(request.num_prompt_tokens)))
    return requests


class ForecastCollector:
    """Serves the forecast (:data:`~growpage.catalog.FORECAST_METRICS`) from the agent's last totals."""

    def __init__(self, source: Any, model: str):
        self.source, self.model = source, model

    def collect(self) -> Iterator[Any]:
        # deferred: prometheus_client (and its exposition server) load with the exporter, not with this module
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        forecast = getattr(self.source, "forecast", None)
        if forecast is None:
            return
        label = [catalog.MODEL_LABEL]
        try:
            totals = forecast.totals()
            families: list[Any] = []
            for spec, value in ((catalog.FORECAST_PAGES_FREED, totals.pages_freed),
                                (catalog.FORECAST_COMPACTIONS, totals.compactions),
                                (catalog.FORECAST_PREEMPTIONS, totals.preemptions),
                                (catalog.FORECAST_PREEMPTIONS_AVOIDABLE, totals.preemptions_avoidable),
                                (catalog.FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION,
                                 totals.preemptions_avoidable_by_admission),
                                (catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE, totals.recompute_seconds_avoidable),
                                (catalog.FORECAST_WIDER_BATCH_SECONDS, totals.wider_batch_seconds)):
                counter = CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=label)
                counter.add_metric([self.model], float(value))
                families.append(counter)
            gauge = GaugeMetricFamily(catalog.FORECAST_SPARE_PAGES.name, catalog.FORECAST_SPARE_PAGES.help,
                                      labels=label)
            gauge.add_metric([self.model], float(totals.spare_pages))
            families.append(gauge)
        except Exception:  # a scrape never raises
            self.source.stats.record_error("plugin")
            return
        yield from families
