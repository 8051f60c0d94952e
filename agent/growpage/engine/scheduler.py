"""Continuous batching over GrowPage's pages: admission by grants, chunked prefill mixed with
decode under a token budget, and preemption by recompute.

One step's order (vLLM v1's, in miniature): running requests first, oldest first (decodes and the
rest of chunked prefills), then waiting requests while their grant fits the pool. Room for new
tokens comes from ``GrowPageManager.ensure_slots``, which is where GrowPage grows or compresses a
request at its page boundary, as the step's controller call (``GrowPageManager.control_step``)
planned. When the manager says PREEMPT, the youngest running request is preempted (its pages
released, its tokens recomputed later) and the slot request retried.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

from growpage.engine.kv.manager import GrowPageManager, SlotStatus
from growpage.engine.request import FinishReason, Request, RequestStatus, block_hashes

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScheduledChunk:
    """``num_tokens`` tokens of ``request`` computed this step, from position ``start``."""

    request: Request
    start: int
    num_tokens: int

    @property
    def completes_known_tokens(self) -> bool:
        """True when the chunk reaches the request's newest token: its logits are sampled."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclasses.dataclass(frozen=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted: list[Request]
    deferred: list[Request]
    evicted_unfittable: list[Request]  # alone in the pool and still no room: finished as TRUNCATED


class Scheduler:
    """Decides, each step, which requests compute how many tokens.

    Args:
        manager: the GrowPage manager owning the page pool.
        max_num_seqs: running requests at most.
        max_num_batched_tokens: tokens computed per step at most (prefill chunks share it).
        enable_prefix_caching: reuse full prompt pages published by earlier requests.
    """

    def __init__(self, manager: GrowPageManager, *, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 512, enable_prefix_caching: bool = True):
        self.manager = manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> Request | None:
        """Remove a request wherever it is and free its pages."""
        for request in list(self.waiting) + self.running:
            if request.request_id == request_id:
                self._retire(request, FinishReason.ABORT, release_reason="aborted")
                return request
        return None

    def finish(self, request: Request, reason: FinishReason) -> None:
        self._retire(request, reason, release_reason="finished")

    def _retire(self, request: Request, reason: FinishReason, release_reason: str) -> None:
        if request in self.running:
            self.running.remove(request)
            self.manager.release(request.request_id, reason=release_reason)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.manager.release(request.request_id, reason="preempted")
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _make_room(self, request: Request, num_tokens: int, output: SchedulerOutput) -> SlotStatus:
        """ensure_slots, preempting younger requests while the manager asks for it."""
        while True:
            status = self.manager.ensure_slots(request.request_id, num_tokens)
            if status is not SlotStatus.PREEMPT:
                return status
            if self.manager.relieve_pressure(1, exclude=request.request_id):
                continue  # others compressed instead: preemption is the last resort
            victim = self.running[-1]
            if victim is request and len(self.running) == 1:
                # Alone and still no page: it can never fit this pool. Finish it rather than
                # livelock (vLLM refuses such requests up front; GrowPage requests can grow), and
                # say so: "length" would tell the client it asked for too few tokens.
                self._retire(request, FinishReason.TRUNCATED, release_reason="finished")
                output.evicted_unfittable.append(request)
                return SlotStatus.PREEMPT
            self._preempt(victim)
            output.preempted.append(victim)
            if victim is request:
                return SlotStatus.PREEMPT

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput(chunks=[], preempted=[], deferred=[], evicted_unfittable=[])
        budget = self.max_num_batched_tokens
        # one controller call for the step: the reserve growth leaves for the others and the next
        # admission, boundaries, and pressure relief before anyone needs a page
        self.manager.control_step(
            [(r.request_id, min(r.num_uncomputed_tokens, budget)) for r in self.running],
            waiting_prompt_tokens=self.waiting[0].num_tokens if self.waiting else None,
            batch_full=len(self.running) >= self.max_num_seqs)
        for request in list(self.running):
            if budget == 0:
                break
            if request not in self.running:  # preempted earlier in this loop
                continue
            num_tokens = min(request.num_uncomputed_tokens, budget)
            status = self._make_room(request, num_tokens, output)
            if status is SlotStatus.DEFER:
                output.deferred.append(request)
            elif status is SlotStatus.OK:
                output.chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_tokens))
                budget -= num_tokens
        # Chunks of requests preempted after being scheduled are dropped.
        scheduled = [c for c in output.chunks if c.request in self.running]
        output.chunks[:] = scheduled

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            hashes = (block_hashes(request.all_token_ids, self.manager.config.block_size)
                      if self.enable_prefix_caching else [])
            if not self.manager.can_admit(request.num_tokens, hashes):
                break
            self.waiting.popleft()
            admission = self.manager.admit(request.request_id, request.num_tokens,
                                           namespace=request.namespace, mode=request.mode,
                                           block_hashes=hashes)
            request.block_hashes = hashes
            request.num_computed_tokens = admission.cached_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            num_tokens = min(request.num_uncomputed_tokens, budget)
            status = self._make_room(request, num_tokens, output)
            if status is SlotStatus.OK:
                output.chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_tokens))
                budget -= num_tokens
        return output
