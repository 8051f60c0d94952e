"""A standalone exporter: ``/metrics/growpage`` on its own port, for homes that cannot add a route
(e.g. vLLM's EngineCore process, which serves no HTTP).

prometheus_client's WSGI app does the negotiation (text / OpenMetrics), gzip and ``name[]``
filtering; we only restrict it to the contract's path (404 elsewhere) and serve it from a threaded
WSGI server in a daemon thread, so a slow scraper never holds up another or the engine.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector

from growpage import catalog


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # an open scrape must not keep the process alive at exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Scrapes every few seconds would flood stderr; Prometheus records failures itself."""


def metrics_wsgi_app(registry: Collector, path: str = catalog.METRICS_PATH) -> Callable:
    """A WSGI app serving ``registry`` at ``path`` only (404 elsewhere)."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == path:
            return metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"GrowPage metrics are served at {path}\n".encode()]

    return app


class MetricsExporter:
    """A running exporter; ``close()`` stops it.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the chosen one when started with port 0).
    """

    def __init__(self, server: WSGIServer, thread: threading.Thread, host: str):
        self._server = server
        self._thread = thread
        self.host = host
        self.port: int = server.server_address[1]

    @property
    def url(self) -> str:
        """The metrics URL, for a loopback client when bound to all interfaces."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}{catalog.METRICS_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_exporter(registry: Collector, port: int = 0, host: str = "0.0.0.0") -> MetricsExporter:
    """Serve ``registry`` at ``/metrics/growpage`` on ``host:port`` in a daemon thread.

    Args:
        registry: what to serve (the agent's registry).
        port: TCP port; 0 picks a free one (read it back from ``MetricsExporter.port``).
        host: listen address; ``0.0.0.0`` so Prometheus can reach the pod, ``::`` for IPv6.

    Raises:
        OSError: the port is taken (choose another with the home's exporter-port setting).
    """
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(_ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, metrics_wsgi_app(registry), Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="growpage-metrics-exporter", daemon=True)
    thread.start()
    return MetricsExporter(server, thread, host)
