"""Binding the exporter again until its port frees: a clash heals itself once the other holder goes.

A port the exporter cannot bind at start-up is usually held for a while only: the previous process
of a restarted pod still closing its sockets, a sidecar's probe, a debugging session. vLLM serves
meanwhile (GrowPage never takes it down), Prometheus sees ``/metrics/growpage`` fail while
``/metrics`` answers (``GrowPageAgentDown``), and this thread tries the port every
:data:`RETRY_INTERVAL_S` until it binds, so the alert resolves by itself once the port is free.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from growpage.telemetry.exporter import MetricsExporter

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

RETRY_INTERVAL_S = 2.0


class ExporterRetry:
    """Calls ``bind()`` every ``interval_s`` until it returns an exporter (then ``bound(exporter)``) or
    :meth:`stop`. ``bind`` raising OSError means the port is still taken; anything else is logged
    once and ends the retries (a bug must not spin)."""

    def __init__(self, bind: Callable[[], MetricsExporter], bound: Callable[[MetricsExporter], None], port: int,
                 interval_s: float | None = None):
        self._bind, self._bound, self.port = bind, bound, port
        self._interval_s = RETRY_INTERVAL_S if interval_s is None else interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="growpage-exporter-retry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                exporter = self._bind()
            except OSError:
                continue
            except Exception:  # never let a bug spin or escape into vLLM's process
                logger.warning("growpage: retrying the exporter on port %d failed; it stays down", self.port,
                               exc_info=True)
                return
            if self._stopped.is_set():  # stopped while binding: give the port back
                exporter.close()
                return
            self._bound(exporter)
            return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
