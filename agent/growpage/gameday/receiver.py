"""A webhook receiver that records what Alertmanager delivers: the game day's pager and ticket queue.

Alertmanager posts one JSON body per notification (webhook payload version 4) to the URL of the
receiver it routes to; each body carries every alert of the group with its ``status``, also those
that did not change (a burn alert's second window pair still firing when the first resolves). The
receiver keeps one :class:`Notification` per change of an alert's status, each alert told apart by
its whole label set, with the time it arrived: a scenario asks what started paging, what made a
ticket and what resolved while it ran, not what Alertmanager repeated.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@dataclasses.dataclass(frozen=True)
class Notification:
    """One alert of one notification, as delivered.

    Attributes:
        received_s: wall-clock time it arrived (unix seconds).
        receiver: the path it was posted to (``pager`` or ``ticket``: the receiver's name suffix).
        status: ``firing`` or ``resolved``.
        alertname: the alert's name.
        labels: every label of the alert.
    """

    received_s: float
    receiver: str
    status: str
    alertname: str
    labels: dict[str, str]


class WebhookReceiver:
    """Records notifications posted to ``{url}/<receiver>``; thread-safe."""

    def __init__(self, server: http.server.ThreadingHTTPServer):
        self._server = server
        self._lock = threading.Lock()
        self._notifications: list[Notification] = []
        self._status: dict[frozenset[tuple[str, str]], str] = {}  # each alert's last delivered status
        host, port = server.server_address[:2]
        self.url = f"http://{host}:{port}"

    def record(self, receiver: str, body: dict) -> None:
        now = time.time()
        with self._lock:
            for alert in body.get("alerts", []):
                labels = dict(alert.get("labels", {}))
                status, key = str(alert.get("status", "")), frozenset(labels.items())
                if self._status.get(key, "resolved") == status:
                    continue  # repeated in a group's notification: no change
                self._status[key] = status
                self._notifications.append(Notification(now, receiver, status, labels.get("alertname", ""), labels))

    def firing(self) -> set[str]:
        """Alertnames with at least one alert whose last delivery said firing."""
        with self._lock:
            return {dict(key)["alertname"] for key, status in self._status.items() if status == "firing"}

    def notifications(self, since_s: float = 0.0) -> list[Notification]:
        with self._lock:
            return [n for n in self._notifications if n.received_s >= since_s]


def _handler(receiver: WebhookReceiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self.send_response(400)
                self.end_headers()
                return
            receiver.record(self.path.strip("/") or "root", body)
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass  # Alertmanager retries on its own; nothing to log per post

    return Handler


@contextmanager
def run_receiver(host: str = "127.0.0.1") -> Iterator[WebhookReceiver]:
    """A receiver on a free loopback port until exit."""
    server = http.server.ThreadingHTTPServer((host, 0), http.server.BaseHTTPRequestHandler)
    receiver = WebhookReceiver(server)
    server.RequestHandlerClass = _handler(receiver)
    thread = threading.Thread(target=server.serve_forever, name="gameday-webhook", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
