"""Runs an ``LLMEngine`` on its own thread and hands results to asyncio callers.

The engine is not thread-safe: one lock guards it. The engine thread holds the lock for a step;
callers take it (off the event loop, via ``asyncio.to_thread``) only to add or abort a request, so
validation errors surface synchronously as HTTP 400s.

A fault in one request (the engine reports it as an output with ``error``) fails that request only;
a fault of the whole step fails the requests in flight. :meth:`AsyncEngine.drain` starts a bounded
shutdown: queued requests are failed at once, running ones may finish until the deadline, then the
rest are failed, each told why (:class:`EngineFailure`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from growpage.engine.engine import LLMEngine, RequestOutput
from growpage.engine.sampling import SamplingParams

logger = logging.getLogger(__name__)


SHUTTING_DOWN = "the server is shutting down; retry on another replica"


@dataclasses.dataclass(frozen=True)
class EngineFailure:
    """Delivered to a request's queue instead of (more) output: the request did not complete.

    Attributes:
        message: what the client is told.
        status: the HTTP status a non-streamed request answers with.
        code: OpenAI's ``error.code``.
    """

    message: str
    status: int = 500
    code: str = "engine_error"


class ShuttingDown(Exception):
    """``submit`` after :meth:`AsyncEngine.drain`: the server answers 503."""


class AsyncEngine:
    """Thread-backed engine with per-request asyncio queues.

    Args:
        engine: the engine to drive.
        on_step: called after every step with the engine (under the lock), e.g. telemetry polling.
        idle_wait_s: how long the thread sleeps when there is nothing to do.
        lock: the lock guarding the engine (share it with whoever else touches the engine, e.g.
            the telemetry agent refreshing stale gauges on a scrape).
    """

    def __init__(self, engine: LLMEngine, on_step: Callable[[LLMEngine], None] | None = None,
                 idle_wait_s: float = 0.05, lock: threading.Lock | None = None):
        self.engine = engine
        self.on_step = on_step
        self.idle_wait_s = idle_wait_s
        self.lock = lock or threading.Lock()
        self._wakeup = threading.Event()
        self._stopped = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread = threading.Thread(target=self._run, name="growpage-engine", daemon=True)
        self._aborts_lock = threading.Lock()
        self._pending_aborts: list[str] = []
        self.last_step_s = time.monotonic()
        self.failed_steps = 0
        self.failed_requests = 0  # failed alone (engine output with an error)
        self.shutdown_failed_requests = 0  # failed by drain: queued, or still running at the deadline
        self._drain_deadline: float | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    def drain(self, timeout_s: float) -> None:
        """Begin a bounded shutdown; safe from a signal handler (it only sets state).

        New submissions are refused, queued requests fail at once, running requests may finish
        within ``timeout_s``; whatever is left then is failed with :data:`SHUTTING_DOWN`.
        """
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + max(0.0, timeout_s)
        self._wakeup.set()

    @property
    def idle(self) -> bool:
        """No request in flight (nothing queued, nothing running, no output undelivered)."""
        return not self._queues

    # ---- requests -----------------------------------------------------------------------------
    async def submit(self, prompt_token_ids: list[int], params: SamplingParams, *,
                     namespace: str | None = None, mode: str | None = None) -> tuple[str, asyncio.Queue]:
        """Queue a request; raises ``InvalidRequest`` at once when the engine refuses it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def add() -> str:
            with self.lock:
                if self.draining:
                    raise ShuttingDown(SHUTTING_DOWN)
                request_id = self.engine.add_request(prompt_token_ids, params, namespace=namespace, mode=mode)
                self._queues[request_id] = (loop, queue)
                return request_id

        request_id = await asyncio.to_thread(add)
        self._wakeup.set()
        return request_id, queue

    def abort(self, request_id: str) -> None:
        """Cancel a request; safe from any thread and from a cancelled task (it never awaits).

        The engine thread applies it before its next step, which frees the request's pages.
        """
        with self._aborts_lock:
            self._pending_aborts.append(request_id)
        self._wakeup.set()

    def _apply_aborts(self) -> None:
        with self._aborts_lock:
            pending, self._pending_aborts = self._pending_aborts, []
        for request_id in pending:
            self.engine.abort(request_id)
            self._queues.pop(request_id, None)

    def _apply_drain(self) -> None:
        """Under the lock: fail queued requests, and everything once the deadline has passed."""
        if self._drain_deadline is None:
            return
        if time.monotonic() >= self._drain_deadline:
            doomed = list(self._queues)
        else:
            doomed = [r for r in self.engine.waiting_request_ids() if r in self._queues]
        for request_id in doomed:
            self._fail(request_id, EngineFailure(SHUTTING_DOWN, status=503, code="shutting_down"))
            self.shutdown_failed_requests += 1
        if doomed:
            logger.warning("shutting down: failed %d request(s) (%s)", len(doomed),
                           "deadline reached" if time.monotonic() >= self._drain_deadline else "still queued")

    def _fail(self, request_id: str, failure: EngineFailure) -> None:
        self.engine.abort(request_id)
        target = self._queues.pop(request_id, None)
        if target is not None:
            loop, queue = target
            _deliver(loop, queue, failure)

    # ---- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            with self.lock:
                self._apply_aborts()
                self._apply_drain()
                busy = self.engine.has_unfinished_requests()
                outputs: list[RequestOutput] = []
                if busy:
                    try:
                        outputs = self.engine.step()
                    except Exception:  # keep serving: fail the in-flight requests, not the server
                        logger.exception("engine step failed; failing the requests in flight")
                        self.failed_steps += 1
                        self._fail_all("the engine failed while generating; see the server log")
                    self.last_step_s = time.monotonic()
                if self.on_step is not None:
                    try:
                        self.on_step(self.engine)
                    except Exception:
                        logger.exception("on_step hook failed")
                deliveries: list = []
                for output in outputs:
                    target = self._queues.get(output.request_id)
                    if target is not None:
                        if output.error is not None:
                            self.failed_requests += 1
                        deliveries.append((target, output if output.error is None
                                           else EngineFailure(output.error)))
                        if output.finished:
                            self._queues.pop(output.request_id, None)
            for (loop, queue), output in deliveries:
                _deliver(loop, queue, output)
            if not busy:
                self._wakeup.wait(self.idle_wait_s)
                self._wakeup.clear()

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._queues):
            self._fail(request_id, EngineFailure(message))


def _deliver(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: object) -> None:
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:  # the server's loop is gone (a forced exit): nobody is waiting any more
        pass
