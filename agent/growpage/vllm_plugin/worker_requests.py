"""The one table of the requests a vLLM worker observes (:class:`WorkerRequests`).

It owns each observed request's worker-side life: its summary row, the rows preempted requests give
back (and take again when vLLM resumes them), and what is queued for the scheduler's next report
(summary readings, attention needs, and the copies still on their way to the host). The observer
drives it from vLLM's step (:mod:`~growpage.vllm_plugin.observer`); the compactor keeps the KV a
request physically holds (:mod:`~growpage.vllm_plugin.compactor`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from growpage.config import Mode
from growpage.core.devices import HostCopy


@dataclasses.dataclass
class TrackedRequest:
    """What the worker keeps per request it observes (its summaries live in the bank's ``row``)."""

    request_id: str
    row: int
    namespace: str | None
    mode: Mode
    prompt_tokens: int


class WorkerRequests:
    """Observed requests by id, their summary rows, and what the next report carries for them.

    Args:
        max_requests: summary rows (vLLM's ``max_num_seqs``).
    """

    def __init__(self, max_requests: int):
        self.tracked: dict[str, TrackedRequest] = {}
        self.preempted: dict[str, TrackedRequest] = {}  # preempted, waiting to resume
        self.free_rows = list(range(max_requests - 1, -1, -1))
        self.read_once: set[str] = set()  # requests whose summaries reached the scheduler at least once
        self.readings: dict[str, tuple[float, float]] = {}  # (STS density, LTS entropy) for the next report
        self.attention_tokens: dict[str, int] = {}  # attention needs for the next report
        self.reading_copies: list[tuple[list[str], HostCopy]] = []  # readings on their way to the host

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.tracked

    def __getitem__(self, request_id: str) -> TrackedRequest:
        return self.tracked[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tracked)

    def __len__(self) -> int:
        return len(self.tracked)

    def get(self, request_id: str) -> TrackedRequest | None:
        return self.tracked.get(request_id)

    def admit(self, request_id: str, namespace: str | None, mode: Mode, prompt_tokens: int) -> TrackedRequest | None:
        """Track a new request in a free row (the caller resets the row's summaries); None when it is
        not observed (mode off) or no row is free."""
        self.preempted.pop(request_id, None)
        if mode is Mode.OFF or not self.free_rows:
            return None
        tracked = TrackedRequest(request_id, self.free_rows.pop(), namespace, mode, prompt_tokens)
        self.tracked[request_id] = tracked
        return tracked

    def resume(self, request_id: str) -> TrackedRequest | None:
        """Track again a request vLLM resumed after a preemption, in a fresh row (its KV is
        recomputed, so its summaries start over); None when it was not preempted here or no row is free."""
        tracked = self.preempted.pop(request_id, None)
        if tracked is None or request_id in self.tracked or not self.free_rows:
            return None
        resumed = self.tracked[request_id] = dataclasses.replace(tracked, row=self.free_rows.pop())
        return resumed

    def release(self, request_id: str, preempted: bool = False) -> TrackedRequest | None:
        """Forget a request (finished, or ``preempted``: kept aside to resume); its row goes back."""
        self.readings.pop(request_id, None)
        self.attention_tokens.pop(request_id, None)
        self.read_once.discard(request_id)
        if not preempted:
            self.preempted.pop(request_id, None)
        tracked = self.tracked.pop(request_id, None)
        if tracked is not None:
            self.free_rows.append(tracked.row)
            if preempted:
                self.preempted[request_id] = tracked
        return tracked

    def take_pending(self) -> tuple[dict[str, tuple[float, float]], dict[str, int]]:
        """The readings and attention needs queued since the last report (and none queued after)."""
        readings, self.readings = self.readings, {}
        needs, self.attention_tokens = self.attention_tokens, {}
        return readings, needs
