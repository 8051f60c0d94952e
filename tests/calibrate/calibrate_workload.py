"""The calibrate tests' workload: the real core in monitor mode, serving requests of varied lengths
through a small continuous-batching loop as an engine would, with the real telemetry agent polling
it. A listener on the core's stats keeps every raw value the histograms bucket, so tests can check
what a threshold does to the requests that really ran.
"""

from __future__ import annotations

import dataclasses
import random
import threading

from growpage.engine.kv.manager import GrowPageManager, SlotStatus
from growpage.telemetry import TelemetryAgent
from support.factories import Driver

MODEL = "calibrate-test-model"
BLOCK_SIZE = 16


@dataclasses.dataclass
class Recorded:
    """The raw values behind the three histograms (a StatsListener on the core)."""

    lts_at_finish: list[float] = dataclasses.field(default_factory=list)
    tokens_at_finish: list[int] = dataclasses.field(default_factory=list)
    density_at_decision: list[float] = dataclasses.field(default_factory=list)

    def on_admit(self, event) -> None:
        pass

    def on_decision(self, event) -> None:
        self.density_at_decision.append(event.sts_density)

    def on_finish(self, event) -> None:
        if event.lts_entropy is not None:
            self.lts_at_finish.append(event.lts_entropy)
        if event.reason != "preempted":  # as the core counts request sizes
            self.tokens_at_finish.append(event.num_tokens)


def serve_requests(manager: GrowPageManager, num_requests: int, rng: random.Random, driver: Driver,
                   on_step=None, stop: threading.Event | None = None, first_id: int = 0) -> None:
    """Admit, decode and release ``num_requests`` requests of 8-150 prompt and 2-40 new tokens."""
    pending = [(f"req-{first_id + i}", rng.randint(8, 150), rng.randint(2, 40)) for i in range(num_requests)]
    pending.reverse()
    running: dict[str, int] = {}
    while (pending or running) and not (stop is not None and stop.is_set()):
        batch = []
        while pending and len(running) < 8 and manager.can_admit(pending[-1][1]):
            request_id, prompt, steps = pending.pop()
            driver.admit(request_id, prompt)
            running[request_id] = steps
            batch.append((request_id, prompt))
        admitted = {request_id for request_id, _ in batch}
        for request_id in [r for r in running if r not in admitted]:
            if manager.ensure_slots(request_id, 1) is SlotStatus.OK:
                batch.append((request_id, 1))
        if batch:
            driver.step(batch)
        for request_id, _ in batch:
            if request_id not in admitted:
                running[request_id] -= 1
                if running[request_id] <= 0:
                    del running[request_id]
                    manager.release(request_id)
        if on_step is not None:
            on_step()
    for request_id in running:
        manager.release(request_id, "aborted")


@dataclasses.dataclass
class MonitoredCore:
    """A monitor-mode core, its telemetry agent and exporter, and the raw values it recorded."""

    manager: GrowPageManager
    agent: TelemetryAgent
    url: str  # the exporter's base URL
    recorded: Recorded
    driver: Driver
    rng: random.Random
    served: int = 0

    def serve(self, num_requests: int, stop: threading.Event | None = None) -> None:
        """Serve requests on this thread (the engine's), then hand the agent a fresh poll."""
        serve_requests(self.manager, num_requests, self.rng, self.driver, on_step=self.agent.on_step, stop=stop,
                       first_id=self.served)
        self.served += num_requests
        self.agent.poll()
