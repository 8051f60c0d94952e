"""The one owner of the requests GrowPage's scheduler side knows (:class:`SchedulerRequests`).

An entry lives from the step a request is first scheduled to the step it finishes or is aborted,
across preemptions. It holds what the request is (prompt, namespace, mode, the blocks a first run
is granted), where its current run stands (the blocks it held after the last step; none while it
is preempted), under enforce what enforcement did to it (:class:`EnforcedRequest`), and the
compaction planned for it this step until the plan rides to the workers.

Everything that happens to a request as a whole happens here, once: its admission to the growth
controller (:meth:`SchedulerRequests.admit`), its preemption (:meth:`~SchedulerRequests.preempted`:
physical length back to logical, its run ended, its prompt to be compressed again, growth-aware
admission told) and its end (:meth:`~SchedulerRequests.finished`: the same, its admission's
history taught its attention need, its enforcement record logged). The agent
(:mod:`~growpage.vllm_plugin.scheduler_agent`) calls these from vLLM's hooks; the enforcer
(:mod:`~growpage.vllm_plugin.enforcer`) only plans a step over the entries. The growth state
(budget, readings, floors) is the shared controller's, keyed by the same id
(:class:`~growpage.core.controller.GrowthController`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from growpage.config import Mode
from growpage.core.controller import GrowthController
from growpage.vllm_plugin.admission import AdmissionGate, compression_of, need_share_at_end
from growpage.vllm_plugin.blocks import blocks_by_request
from growpage.vllm_plugin.settings import MODE_ARG, request_namespace
from growpage.vllm_plugin.vllm_types import Request, Scheduler
from growpage.vllm_plugin.wire import DROPPED_ATTRIBUTE, CompactionPlan, append_enforce_log


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
