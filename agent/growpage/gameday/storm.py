"""A KV-pressure storm: more long requests at once than the pod's KV cache holds, bounded in count and time.

Closed loop: ``concurrency`` clients each send a completion, wait for it, and send the next, until
:meth:`Storm.stop`, ``max_requests`` or ``time_limit_s``. Loopback only. A refused connection (the
pod being replaced) is counted and retried after a pause, as a client behind a Service would retry.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx

# About 150 tokens of the packaged model's tokenizer: with 48 new tokens a request needs 7 of the
# pod's 32-token blocks, so two running requests overflow a 12-block cache and vLLM preempts.
PROMPT = ("Write a long, careful answer. " + " ".join(
    f"Note {i}: the shipment from warehouse {i * 7 % 13} left on day {i % 28 + 1} and carried {i * 37 % 500} units."
    for i in range(8)) + " Summarise every note in order:")


@dataclasses.dataclass
class StormCounts:
    sent: int = 0
    completed: int = 0
    failed: int = 0


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
        self._threads = [threading.Thread(target=self._client, name=f"gameday-storm-{i}", daemon=True)
                         for i in range(concurrency)]

    def retarget(self, url: str) -> None:
        """Send the next requests to ``url`` (the replacement pod)."""
        self.url = url

    def __enter__(self) -> Storm:
        for thread in self._threads:
            thread.start()
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
