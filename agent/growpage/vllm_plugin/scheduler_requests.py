"""The one table of the requests GrowPage's scheduler side knows (:class:`SchedulerRequests`).

An entry lives from the step a request is first scheduled to the step it finishes or is aborted,
across preemptions. It holds what the request is (prompt, namespace, mode, the blocks a first run
is granted), where its current run stands (the blocks it held after the last step; none while it
is preempted), and, under enforce, what enforcement did to it (:class:`EnforcedRequest`). The agent
admits and releases (:mod:`~growpage.vllm_plugin.scheduler_agent`), the enforcer reads and writes
its entries (:mod:`~growpage.vllm_plugin.enforcer`); the growth state (budget, readings,
floors) is the shared controller's, keyed by the same id (:class:`~growpage.core.controller.GrowthController`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from growpage.config import Mode
from growpage.core.controller import GrowthController
from growpage.vllm_plugin.settings import MODE_ARG, request_namespace
from growpage.vllm_plugin.vllm_types import Request


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
    """Every request the scheduler side knows, by id.

    Args:
        controller: the scheduler's growth controller (mode resolution and first grants).
    """

    def __init__(self, controller: GrowthController):
        self.controller = controller
        self._entries: dict[str, SchedulerRequest] = {}

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

    def end_run(self, request_id: str) -> None:
        """The request was preempted: its entry stays (enforcement's record spans its life), its run ends."""
        entry = self._entries.get(request_id)
        if entry is not None:
            entry.pages_held = None

    def release(self, request_id: str) -> SchedulerRequest | None:
        """The request finished or was aborted: forget it."""
        return self._entries.pop(request_id, None)
