"""The one fault guard: GrowPage must never take its engine down.

A fault inside GrowPage is caught, counted where ``growpage_agent_errors_total`` reads it, and
logged with its traceback the first time per key only (a persistent fault in the decode loop or at
every scrape must not flood the logs); the caller then falls back to the engine's default
behaviour. Every component uses this class: the controller (both homes), the vLLM worker's
observer, and telemetry's collector and agent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

_Result = TypeVar("_Result")
_Params = ParamSpec("_Params")


class FaultGuard:
    """Catch, count, log once.

    Args:
        count: called with the component of every caught fault (e.g. ``StatsRecorder.record_error``).
        logger: where the first fault per key is logged with its traceback (later ones at debug).
        suffix: appended to the first log line (what happens next, where further faults are counted).
    """

    def __init__(self, count: Callable[[str], None], logger: logging.Logger,
                 suffix: str = "further faults are counted in growpage_agent_errors_total, not logged"):
        self._count = count
        self._logger = logger
        self._suffix = suffix
        self._logged: set[str] = set()
        self._lock = threading.Lock()  # telemetry faults arrive from scrape threads

    def fault(self, component: str, message: str, *, log_key: str | None = None) -> None:
        """Count a caught fault; log it with its traceback if ``log_key`` (default: the component)
        has not been logged yet. Call from an ``except`` block."""
        key = component if log_key is None else log_key
        with self._lock:
            first = key not in self._logged
            self._logged.add(key)
        self._count(component)
        if first:
            self._logger.exception("growpage %s: %s (%s)", component, message, self._suffix)
        else:
            self._logger.debug("growpage %s: %s", component, message, exc_info=True)

    @contextlib.contextmanager
    def guard(self, component: str, message: str, *, log_key: str | None = None) -> Iterator[None]:
        """``with guard("observer", "..."):`` runs the body; a fault is counted, not raised."""
        try:
            yield
        except Exception:  # GrowPage must never take the engine down
            self.fault(component, message, log_key=log_key)

    def call(self, component: str, message: str, function: Callable[_Params, _Result], *args: _Params.args,
             **kwargs: _Params.kwargs) -> _Result | None:
        """``function(*args, **kwargs)``, or None when it faults (counted, logged once)."""
        with self.guard(component, message):
            return function(*args, **kwargs)
        return None
