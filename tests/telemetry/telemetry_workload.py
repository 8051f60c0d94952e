"""Shared by the telemetry tests: a real core driven by a small continuous-batching loop, and
in-memory tracing."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler

from growpage.engine.kv.manager import GrowPageManager, SlotStatus
from support.factories import Driver, FakeClock

MODEL = "tiny-test-model"


class Workload:
    """Admits tiny requests, decodes them a few steps in mixed batches and releases them, handling
    DEFER and PREEMPT as an engine would. Request ids are ``req-<n>``.

    Args:
        manager: the core under test.
        seed: for prompt lengths, decode lengths and the random Q/K/V.
    """

    def __init__(self, manager: GrowPageManager, seed: int = 0):
        self.manager = manager
        self.driver = Driver(manager, seed)
        self.rng = random.Random(seed)
        self.next_id = 0
        self.num_steps = 0

    def run(self, num_requests: int, *, prompt_tokens: tuple[int, int] = (2, 6),
            decode_steps: tuple[int, int] = (2, 30), max_batch: int = 8,
            on_step: Callable[[], None] | None = None, stop: threading.Event | None = None) -> None:
        """Serve ``num_requests`` new requests to completion (or until ``stop`` is set)."""
        pending = self._new_requests(num_requests, prompt_tokens, decode_steps)
        running: dict[str, int] = {}  # request id -> decode steps left
        while (pending or running) and not (stop is not None and stop.is_set()):
            batch = self._admit(pending, running, max_batch)
            admitted = {request_id for request_id, _ in batch}
            batch += self._grow(pending, running, admitted, prompt_tokens)
            if isinstance(self.manager.clock, FakeClock):
                self.manager.clock.now += 0.01  # the growth throttle refills with time
            if batch:
                self._step(batch, admitted, running)
            if on_step is not None:
                on_step()
        for request_id in list(running):  # stopped early: release what is left
            self.manager.release(request_id, "aborted")

    def _new_requests(self, num_requests: int, prompt_tokens: tuple[int, int],
                      decode_steps: tuple[int, int]) -> list[tuple[str, int, int]]:
        """(request id, prompt tokens, decode steps) per request, the first to admit last (a stack)."""
        pending = []
        for _ in range(num_requests):
            pending.append((f"req-{self.next_id}", self.rng.randint(*prompt_tokens),
                            self.rng.randint(*decode_steps)))
            self.next_id += 1
        pending.reverse()
        return pending

    def _admit(self, pending: list[tuple[str, int, int]], running: dict[str, int],
               max_batch: int) -> list[tuple[str, int]]:
        """Admit waiting requests in order while the batch has room and the core can take them."""
        batch = []
        while pending and len(running) < max_batch and self.manager.can_admit(pending[-1][1]):
            request_id, prompt, steps = pending.pop()
            self.driver.admit(request_id, prompt)
            running[request_id] = steps
            batch.append((request_id, prompt))
        return batch

    def _grow(self, pending: list[tuple[str, int, int]], running: dict[str, int], admitted: set[str],
              prompt_tokens: tuple[int, int]) -> list[tuple[str, int]]:
        """A slot for each running request's next token; a preempted one goes back to ``pending``
        with a newly drawn prompt length and the decode steps it had left; a deferred one skips this step."""
        batch = []
        for request_id in list(running):
            if request_id in admitted:
                continue
            status = self.manager.ensure_slots(request_id, 1)
            if status is SlotStatus.PREEMPT:  # recompute later, as vLLM does
                self.manager.release(request_id, "preempted")
                pending.append((request_id, self.rng.randint(*prompt_tokens), running.pop(request_id)))
            elif status is SlotStatus.OK:
                batch.append((request_id, 1))
        return batch

    def _step(self, batch: list[tuple[str, int]], admitted: set[str], running: dict[str, int]) -> None:
        """Run one model step and release the requests that decoded their last token."""
        self.driver.step(batch)
        self.num_steps += 1
        for request_id, _ in batch:
            if request_id in admitted:
                continue
            running[request_id] -= 1
            if running[request_id] <= 0:
                del running[request_id]
                self.manager.release(request_id)


def in_memory_tracing(sampler: Sampler = ALWAYS_ON) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider exporting synchronously into memory (the tests read finished spans at once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter
