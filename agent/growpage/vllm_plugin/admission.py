"""Growth-aware admission in vLLM's scheduler (enforce): hold a waiting request that would make the
running batch outgrow the pool even compressed to its floors (:mod:`growpage.core.admission` says
why and how it projects).

vLLM 0.32's scheduler admits waiting requests while ``len(running)`` is under
``Scheduler.max_num_active_reqs`` (admission into RUNNING, apart from the runner's slots). Before each
step the gate sets that limit to the running requests plus the waiting ones that fit (``auto``,
looking ahead on its prior, one more: :attr:`AdmissionGate.measuring_start`), never above
what the deployment configured; it first puts the configured limit back, so a fault while projecting
leaves vLLM's own admission. A request already running is never touched: the gate only delays a
start, and an empty batch always takes its first request.

:func:`compression_of` says how far GrowPage may compress a request (its floor's parts and its
observed attention need), from the growth controller's state: the gate asks it for enforced
requests, monitor's forecast for monitored ones.

Exported (:class:`AdmissionCollector`): ``growpage_admission_holds_total`` (steps it held a waiting
request vLLM would have considered) and ``growpage_admission_projected_pages`` (the running
requests' projected pages at their ends, against the pool). This module imports no vLLM: it reads
the scheduler duck-typed, and tests drive it with stand-ins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from growpage import catalog
from growpage.config import GrowPageConfig, Mode
from growpage.core.admission import (
    LOOK_AHEAD_PRIOR,
    CompletionHistory,
    Compression,
    KVDemand,
    Shares,
    StepCostFit,
    StepCosts,
    admissible,
    full_peak_tokens,
    lookahead_pays,
    projected_demand,
    standing_need_share,
)
from growpage.core.controller import GrowthController
from growpage.vllm_plugin.settings import MODE_ARG, request_namespace
from growpage.vllm_plugin.vllm_types import KVBlock, Request, Scheduler

LIMIT_ATTRIBUTE = "max_num_active_reqs"  # vLLM 0.32's admission limit (Scheduler.__init__)
# after_preemption: how long admission keeps looking ahead after vLLM preempted (engine steps; at
# tens of steps a second, seconds: long enough to drain a thrashing batch, short enough to give a
# quiet pool back to vLLM's own admission)
PREEMPTION_MEMORY_STEPS = 256
# how the gate decides whether to look ahead in a step: always; within PREEMPTION_MEMORY_STEPS of a
# vLLM preemption; or where the host's measured step costs say a recompute costs more than the
# width holding gives up (core.admission.lookahead_pays; admission: auto)
GATE_POLICIES = ("projected", "after_preemption", "measured")
# measuring starts a measured gate makes until its fit answers: one normally prices a token; a second
# covers a start whose prompt was cached whole (no prefill) or whose step left the fit singular (one
# width, one prefill). Bounded, so a prefix cache that answers every prompt cannot start them all
MEASURING_STARTS_MAX = 2
CompressionOf = Callable[[Request], Compression | None]


def compression_of(controller: GrowthController, request: Request, compressed_in: Mode) -> Compression | None:
    """How far GrowPage may compress ``request`` where it runs in ``compressed_in`` (enforce for the
    gate, monitor for monitor's forecast of it); None where its mode is another. A waiting request's
    mode is the one it will be admitted in; its attention is not observed yet."""
    control = controller.requests.get(request.request_id)
    if control is None:
        extra = getattr(getattr(request, "sampling_params", None), "extra_args", None) or {}
        if controller.mode_for(request_namespace(extra), extra.get(MODE_ARG)) is not compressed_in:
            return None
    elif control.mode is not compressed_in:
        return None
    config: GrowPageConfig = controller.config
    need: float | None = 0.0  # a method that keeps no attention need (a fixed cap) is held at its floor
    if controller.method.attention_coverage(config) > 0:
        tokens = int(request.num_computed_tokens)
        need = (min(1.0, control.attention_tokens / tokens) if control is not None and control.attention_tokens
                and tokens > 0 else None)
    base_pages = control.base_pages if control is not None else config.base_pages
    return Compression(base_pages, config.sink_tokens, config.recent_window_tokens, need)


def need_share_at_end(controller: GrowthController, request: Request) -> float | None:
    """The share of a finishing request's tokens its observed attention needed (None: not observed,
    or a method that keeps no attention need)."""
    control = controller.requests.get(request.request_id)
    if (control is None or not control.attention_tokens
            or controller.method.attention_coverage(controller.config) <= 0):
        return None
    return min(1.0, control.attention_tokens / max(1, int(request.num_tokens)))


@dataclasses.dataclass(frozen=True)
class AdmissionPlan:
    """One step's admission.

    Attributes:
        occupied: requests holding a runner slot (running, or paused streaming input).
        candidates: the waiting requests vLLM would consider this step, in its order.
        admitted: how many of them start.
        projected_pages: the running requests' projected pages at their ends.
    """

    occupied: int
    candidates: tuple[str, ...]
    admitted: int
    projected_pages: int

    @property
    def held(self) -> tuple[str, ...]:
        """The candidates that wait: their start would outgrow the pool (all but a measuring start's)."""
        return self.candidates[self.admitted:]


class AdmissionGate:
    """Growth-aware admission for one vLLM ``Scheduler``.

    Args:
        block_size: vLLM's cache block size.
        total_pages: usable blocks in the pool (the null block excluded).
        policy: when it looks ahead (:data:`GATE_POLICIES`).
        step_costs: the engine's measured step costs (``measured``; the scheduler agent fits them).
        prior_costs: ``measured`` before the fit can tell the costs apart: the host's step costs as
            a prior (:meth:`~growpage.vllm_plugin.settings.PluginSettings.prior_step_costs`; the
            default looks ahead whatever the trace).
    """

    def __init__(self, block_size: int, total_pages: int, *, policy: str = "projected",
                 step_costs: StepCostFit | None = None, prior_costs: StepCosts = LOOK_AHEAD_PRIOR):
        if policy not in GATE_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(GATE_POLICIES)}, got {policy!r}")
        self.block_size = block_size
        self.total_pages = total_pages
        self.policy = policy
        self.step_costs = step_costs if step_costs is not None else StepCostFit()
        self.prior_costs = prior_costs
        # this step's answer (exported): projected always; after_preemption once vLLM preempts; measured
        # once a request waits (nothing to hold before)
        self.lookahead = policy == "projected"
        self.lookahead_steps = 0  # steps it looked ahead in
        self.history = CompletionHistory()
        self.configured_limit: int | None = None  # the deployment's own limit, read at the first step
        self.holds_total = 0
        self.projected_pages = 0
        self.steps = 0
        self._last_preemption_step: int | None = None
        self._measuring_starts = 0  # starts beyond the projection since the fit last answered

    def advance(self, scheduler: Scheduler) -> bool:
        """Count one engine step; whether admission projects in it: always (``projected``), within
        :data:`PREEMPTION_MEMORY_STEPS` steps of a vLLM preemption (``after_preemption``), or where
        the measured costs say holding pays (``measured``: :meth:`holding_pays`)."""
        self.steps += 1
        if self.policy == "after_preemption":
            self.lookahead = (self._last_preemption_step is not None
                              and self.steps - self._last_preemption_step <= PREEMPTION_MEMORY_STEPS)
        elif self.policy == "measured":
            self.lookahead = self.holding_pays(scheduler)
            if self.step_costs.costs() is not None:
                self._measuring_starts = 0
        self.lookahead_steps += int(self.lookahead)
        return self.lookahead

    @property
    def decides_on_evidence(self) -> bool:
        """This step's answer follows the policy's own rule: always for ``projected`` and
        ``after_preemption``; for ``measured`` once the fit can tell the costs apart (before, it is
        the host's prior)."""
        return self.policy != "measured" or self.step_costs.costs() is not None

    @property
    def measuring_start(self) -> bool:
        """``measured``, looking ahead on its prior this step: one waiting request starts beyond the
        projection, so that its prefill prices a token. Without it a prior that holds can hold
        the batch so long that the fit never answers (make run's held batch prefilled again only at
        step 92). Only once a warm step was timed (the engine's cold first one teaches nothing,
        :class:`StepMeter`), while no timed step prefilled or, enough steps timed, the fit still
        cannot part its costs, and at most :data:`MEASURING_STARTS_MAX` times until it answers: the
        cost of a preemption or two where holding was right."""
        fit = self.step_costs
        if self.policy != "measured" or not self.lookahead or len(fit) == 0 or fit.costs() is not None:
            return False
        unpriced = not fit.prices_a_token or not fit.short_of_steps
        return unpriced and self._measuring_starts < MEASURING_STARTS_MAX

    def holding_pays(self, scheduler: Scheduler) -> bool:
        """``measured``: whether holding the oldest waiting request, were the pool short at the
        batch's end, costs less than the preemption starting it would bring
        (:func:`~growpage.core.admission.lookahead_pays` on the engine's fitted step costs; before
        they can be told apart, on :attr:`prior_costs`)."""
        waiting = next(iter(scheduler.waiting), None)
        if waiting is None:
            return self.lookahead  # nothing to hold: the answer stands (and costs nothing to keep)
        fitted = self.step_costs.costs()
        costs = fitted if fitted is not None else self.prior_costs
        shares = self.history.shares()
        output = (shares.output_tokens if shares.output_tokens is not None
                  else _max_tokens(waiting, scheduler) * shares.output_share)
        return lookahead_pays(costs, width=len(scheduler.running), output_tokens=output,
                              recompute_tokens=int(waiting.num_prompt_tokens) + output / 2)

    def on_preempt(self) -> None:
        """vLLM preempted a request: the batch outgrew the pool, so admission looks ahead again."""
        self._last_preemption_step = self.steps
        if self.policy == "after_preemption":
            self.lookahead = True

    def before_schedule(self, scheduler: Scheduler, blocks: Mapping[str, Sequence[KVBlock]],
                        compression: CompressionOf) -> bool:
        """Set this step's admission limit on ``scheduler``. ``blocks``: each running request's blocks
        (vLLM's own lists, read, never copied); ``compression(request)``: how far GrowPage may
        compress it (None: it does not).
        Returns whether the oldest waiting request is held (pressure relief then makes no room for
        it this step)."""
        if not hasattr(scheduler, LIMIT_ATTRIBUTE):
            return False  # not vLLM 0.32's scheduler: its own admission runs
        if self.configured_limit is None:
            self.configured_limit = int(getattr(scheduler, LIMIT_ATTRIBUTE))
        setattr(scheduler, LIMIT_ATTRIBUTE, self.configured_limit)  # vLLM's own, should anything below fail
        if not self.advance(scheduler):
            self.projected_pages = 0
            return False
        plan = self.plan(scheduler, blocks, compression, self.configured_limit)
        self.projected_pages = plan.projected_pages
        if not plan.held:
            return False
        self.holds_total += 1
        setattr(scheduler, LIMIT_ATTRIBUTE, plan.occupied + plan.admitted)
        return plan.admitted == 0

    def plan(self, scheduler: Scheduler, blocks: Mapping[str, Sequence[KVBlock]], compression: CompressionOf,
             limit: int) -> AdmissionPlan:
        """Which of the waiting requests vLLM would consider under ``limit`` start, and which wait
        (reads the scheduler and changes nothing but the gate's count of measuring starts: monitor's
        forecast asks its own gate too)."""
        shares = self.history.shares()
        running = list(scheduler.running)
        compressions = [compression(request) for request in running]
        need = standing_need_share(shares.need_share, compressions)
        demands = [self._demand(scheduler, request, len(blocks.get(request.request_id, ())), need, shares, squeeze)
                   for request, squeeze in zip(running, compressions, strict=True)]
        projected = sum(demand.peak_pages for demand in demands)
        occupied = len(running) + int(getattr(scheduler, "num_waiting_for_streaming_input", 0) or 0)
        candidates = self._waiting(scheduler, limit - occupied)
        waiting = [self._demand(scheduler, request, 0, need, shares, compression(request)) for request in candidates]
        admitted = admissible(demands, waiting, self.total_pages) if waiting else 0
        if admitted < len(candidates) and self.measuring_start:
            admitted += 1
            self._measuring_starts += 1  # counted where planned: the gate enforce runs, or monitor's own
        return AdmissionPlan(occupied, tuple(request.request_id for request in candidates), admitted, projected)

    def on_finish(self, request: Request, need_share: float | None) -> None:
        """A request finished: learn its output share and, where its attention was observed under
        GrowPage, the share of its tokens that attention needed."""
        if _aborted(request):
            return  # a client that went away says nothing about how long answers run
        self.history.record(output_tokens=int(request.num_output_tokens), max_tokens=_max_tokens(request, None),
                            need_share=need_share)

    @property
    def shares(self) -> Shares:
        return self.history.shares()

    def _demand(self, scheduler: Scheduler, request: Request, held: int, need_share: float, shares: Shares,
                compression: Compression | None) -> KVDemand:
        # logical tokens: a preempted (waiting) request comes back with its output so far, recomputed
        tokens = int(request.num_computed_tokens) if held else int(request.num_tokens)
        peak = full_peak_tokens(tokens, int(request.num_output_tokens), _max_tokens(request, scheduler),
                                shares.output_share)
        return projected_demand(request.request_id, pages_now=held, peak_tokens=peak, block_size=self.block_size,
                                compression=compression, learned_need_share=need_share)

    @staticmethod
    def _waiting(scheduler: Scheduler, room: int) -> list[Request]:
        """The waiting requests vLLM would consider this step, in its order (those holding KV first)."""
        if room <= 0:
            return []
        found: list[Request] = []
        for queue in (getattr(scheduler, "kv_holding_waiting", None) or (), scheduler.waiting):
            for request in queue:
                if len(found) >= room:
                    return found
                found.append(request)
        return found


class StepMeter:
    """Times vLLM's steps into a :class:`~growpage.core.admission.StepCostFit`: from the end of
    ``schedule()`` to ``update_from_output`` of the same ``SchedulerOutput`` (the model's run; where
    vLLM schedules the next step while one runs, that overlap too: what a step costs the engine).

    Args:
        clock: monotonic seconds.
    """

    PENDING_MAX = 8  # steps in flight at most (vLLM's batch queue is 1-2 deep); more means lost outputs
    # the engine's first steps, left out of the fit: the first pays one-time start-up (on the AVX-512
    # host, 2.03 s for 4 prompts of 290 tokens, where a warm 74-token prefill took 0.07 s), which priced
    # a token 10x dearer (6.9 ms against 0.6-0.7) for as long as it stayed in the fit's window
    COLD_STEPS = 1

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.fit = StepCostFit()
        self._cold_left = self.COLD_STEPS
        self._pending: dict[int, tuple[float, int, int]] = {}  # id(SchedulerOutput) -> start, requests, tokens

    def scheduled(self, output: Any) -> None:
        """``schedule()`` returned ``output``: what the step runs, and when it started."""
        scheduled = getattr(output, "num_scheduled_tokens", None) or {}
        if not scheduled:
            return
        if len(self._pending) >= self.PENDING_MAX:
            self._pending.clear()
        self._pending[id(output)] = (self.clock(), len(scheduled), int(sum(scheduled.values())))

    def finished(self, output: Any) -> None:
        """``update_from_output`` took ``output``'s results: the step's time goes into the fit."""
        started = self._pending.pop(id(output), None)
        if started is not None and self._cold_left > 0:
            self._cold_left -= 1
        elif started is not None:
            start, requests, tokens = started
            self.fit.record(requests=requests, tokens=tokens, seconds=self.clock() - start)


def _max_tokens(request: Request, scheduler: Scheduler | None) -> int:
    """The request's ``max_tokens``; unset, what the model's length leaves after its prompt."""
    value = getattr(request, "max_tokens", None)
    if value is not None:
        return int(value)
    model_len = getattr(scheduler, "max_model_len", None) if scheduler is not None else None
    return max(0, int(model_len or 0) - int(request.num_prompt_tokens))


def _aborted(request: Request) -> bool:
    status = getattr(request, "status", None)
    return "ABORTED" in str(getattr(status, "name", status or ""))


class AdmissionCollector:
    """Serves the gate's series (``catalog.ADMISSION_METRICS``); a scrape never raises."""

    def __init__(self, source: Any, model: str):
        self.source, self.model = source, model

    def collect(self) -> Iterator[Any]:
        # deferred: prometheus_client (and its exposition server) load with the exporter, not with this module
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gate = getattr(self.source, "admission", None)
        if gate is None:
            return
        label = [catalog.MODEL_LABEL]
        try:
            lookahead = GaugeMetricFamily(catalog.ADMISSION_LOOKAHEAD.name, catalog.ADMISSION_LOOKAHEAD.help,
                                          labels=label)
            lookahead.add_metric([self.model], float(gate.lookahead))
            holds = CounterMetricFamily(catalog.ADMISSION_HOLDS.name.removesuffix("_total"),
                                        catalog.ADMISSION_HOLDS.help, labels=label)
            holds.add_metric([self.model], float(gate.holds_total))
            projected = GaugeMetricFamily(catalog.ADMISSION_PROJECTED_PAGES.name,
                                          catalog.ADMISSION_PROJECTED_PAGES.help, labels=label)
            projected.add_metric([self.model], float(gate.projected_pages))
        except Exception:  # a scrape never raises
            self.source.stats.record_error("plugin")
            return
        yield from (holds, projected, lookahead)
