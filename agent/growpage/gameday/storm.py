"""A KV-pressure storm: more long requests at once than the pod's KV cache holds, bounded in count and time.

Closed loop: ``concurrency`` clients each send a completion, wait for it, and send the next, until
:meth:`Storm.stop`, ``max_requests`` or ``time_limit_s``. Loopback only. A refused connection (the
pod being replaced) is counted and retried after a pause, as a client behind a Service would retry.

How many clients: enough that a queued request waits past the TTFT objective's threshold on the
host at hand. The storm starts at its floor, the runner measures how many requests a second the
pod completes under it (it is saturated: the KV cache holds fewer than the floor), and
:meth:`Storm.grow` adds clients to :func:`concurrency_for`'s count. A fixed count pages on a slow
host and not on one that decodes a batch for little more than one request (an AVX-512 CPU did not).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import httpx

# About 150 tokens of the packaged model's tokenizer: with 48 new tokens a request needs 7 of the
# pod's 32-token blocks, so two running requests overflow a 12-block cache and vLLM preempts.
PROMPT = ("Write a long, careful answer. " + " ".join(
    f"Note {i}: the shipment from warehouse {i * 7 % 13} left on day {i % 28 + 1} and carried {i * 37 % 500} units."
    for i in range(8)) + " Summarise every note in order:")
# a queued client waits this many TTFT thresholds on average: well past the threshold for most
# requests, so the fast burn (14.4x the budget: 15 % of requests over it) is not a coin toss
WAIT_THRESHOLDS = 2.0
PILOT_S = 20.0  # the storm at its floor before it is sized: long enough for tens of completions


@dataclasses.dataclass
class StormCounts:
    sent: int = 0
    completed: int = 0
    failed: int = 0


def concurrency_for(completed_per_s: float, *, ttft_threshold_s: float, floor: int, ceiling: int = 48) -> int:
    """Clients a closed-loop storm needs so a request waits at least :data:`WAIT_THRESHOLDS` TTFT
    thresholds longer than under ``floor`` clients, on a pod that completes ``completed_per_s``
    requests a second under them, saturated (Little's law: each client added to a saturated pod
    adds ``1 / completed_per_s`` to every round trip, and the wait is where it goes). Never above
    ``ceiling``."""
    added = math.ceil(WAIT_THRESHOLDS * ttft_threshold_s * max(completed_per_s, 0.0))
    return max(floor, min(ceiling, floor + added))


class Storm:
    """The clients of one storm; a context manager that always stops them."""

    def __init__(self, url: str, model: str, *, concurrency: int = 6, max_tokens: int = 48,
                 max_requests: int = 2000, time_limit_s: float = 900.0):
        self.url, self.model = url, model
        self.max_tokens, self.max_requests = max_tokens, max_requests
        self.counts = StormCounts()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + time_limit_s
        self._threads: list[threading.Thread] = []
        self._concurrency = concurrency

    @property
    def clients(self) -> int:
        return len(self._threads)

    def grow(self, clients: int) -> None:
        """Run ``clients`` clients from now on (never fewer than run already)."""
        while len(self._threads) < clients and not self._stop.is_set():
            thread = threading.Thread(target=self._client, name=f"gameday-storm-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def retarget(self, url: str) -> None:
        """Send the next requests to ``url`` (the replacement pod)."""
        self.url = url

    def __enter__(self) -> Storm:
        self.grow(self._concurrency)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _take(self) -> bool:
        with self._lock:
            if self._stop.is_set() or self.counts.sent >= self.max_requests or time.monotonic() > self._deadline:
                return False
            self.counts.sent += 1
            return True

    def _client(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(300.0, connect=2.0)) as client:
            while self._take():
                body = {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_tokens, "temperature": 0}
                try:
                    response = client.post(f"{self.url}/v1/completions", json=body)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                with self._lock:
                    if ok:
                        self.counts.completed += 1
                    else:
                        self.counts.failed += 1
                if not ok:
                    self._stop.wait(0.5)
