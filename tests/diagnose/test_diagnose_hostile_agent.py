"""diagnose survives the agent it diagnoses: an endless body and a trickling server end in one line,
exit 3, within the deadline and without growing memory."""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
from collections.abc import Callable, Iterator

from gpctl.main import app

SERVED_LIMIT_BYTES = 256 * 1024 * 1024  # the test server gives up here, whatever the client does


@contextlib.contextmanager
def raw_server(respond: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A loopback HTTP server that hands each connection to ``respond``; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_handle, args=(connection,), daemon=True).start()

    def _handle(connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            connection.recv(65536)  # the request; its content does not matter here
            respond(connection, stop)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _headers(connection: socket.socket) -> None:
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n")


def endless(connection: socket.socket, stop: threading.Event) -> None:
    _headers(connection)
    line = b'growpage_kv_page_utilization{model_name="m"} 0.5\n' * 1000
    sent = 0
    while not stop.is_set() and sent < SERVED_LIMIT_BYTES:
        connection.sendall(line)
        sent += len(line)


def trickle(connection: socket.socket, stop: threading.Event) -> None:
    """A byte every half second: each read is quick, only an overall deadline can end the body.

    It gives up after a minute, so a client without a deadline fails the test instead of hanging.
    """
    _headers(connection)
    for byte in b"growpage_kv_page_utilization 0.5\n" * 4:
        if stop.wait(0.5):
            return
        connection.sendall(bytes([byte]))


def test_an_endless_body_is_cut_at_the_cap_without_growing_memory(runner):
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with raw_server(endless) as url:
        result = runner.invoke(app, ["diagnose", "--endpoint", url, "--duration", "1", "--timeout", "20s"])
    assert result.exit_code == 3, result.output
    assert "sent more than 16 MiB" in result.output and "Traceback" not in result.output
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) / 1024
    assert grown_mib < 120, f"diagnose grew by {grown_mib:.0f} MiB reading an endless body"


def test_a_trickling_server_is_cut_at_the_overall_deadline(runner):
    with raw_server(trickle) as url:
        result = runner.invoke(app, ["diagnose", "--endpoint", url, "--duration", "1", "--timeout", "2s"])
    assert result.exit_code == 3, result.output
    # no read waits 2s (a byte comes every 0.5s): only the overall deadline says this
    assert "did not answer within 2s" in result.output
