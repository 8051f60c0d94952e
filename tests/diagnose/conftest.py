"""Fixtures for diagnose tests: a CLI runner, snapshot writers and a loopback metrics server."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import diagnose_scenarios as scenarios
import pytest
from typer.testing import CliRunner


@pytest.fixture
def runner() -> CliRunner:
    # 80 columns, no colour: what a ticket or a narrow terminal shows.
    return CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"})


@pytest.fixture
def write_snapshots(tmp_path: Path) -> Callable[..., list[Path]]:
    def write(scenario: scenarios.Scenario, **options) -> list[Path]:
        directory = tmp_path / f"snapshots-{len(list(tmp_path.iterdir()))}"
        return scenarios.write_snapshots(directory, scenario, **options)
    return write


class MetricsServer:
    """A loopback HTTP server that serves a scenario whose counters grow with wall time.

    Routes: the agent at ``/metrics/growpage``, DCGM and vLLM at ``/metrics``, and misbehaving routes for bad
    input tests (``/html``, ``/vllm``, ``/garbage``, ``/error``, ``/slow``, ``/json-error``, ``/json-empty``).
    """

    def __init__(self, scenario: scenarios.Scenario):
        self.scenario = scenario
        self.started = time.monotonic()
        self.requests: list[str] = []
        self.agent_scrapes_s: list[float] = []  # elapsed_s of each agent scrape: its counters' clock
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                server.requests.append(self.path)
                status, content_type, body = server.respond(self.path.split("?")[0])
                if status == 0:
                    return  # /slow: never answers within the client's timeout
                data = body.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def respond(self, path: str) -> tuple[int, str, str]:
        text = "text/plain; version=0.0.4; charset=utf-8"
        elapsed_s = time.monotonic() - self.started
        index = sum(1 for request in self.requests if request.startswith("/metrics/growpage"))
        if path == "/metrics/growpage":
            self.agent_scrapes_s.append(elapsed_s)
            return 200, text, scenarios.text_exposition(scenarios.samples(self.scenario, elapsed_s, index))
        if path == "/metrics":  # vLLM's own /metrics and DCGM's, on one loopback server
            rows = [*scenarios.dcgm_samples(self.scenario, index), *scenarios.vllm_samples(self.scenario, elapsed_s)]
            return 200, text, scenarios.text_exposition(rows)
        if path == "/html":
            return 200, "text/html", "<!doctype html><html><body>Grafana</body></html>\n"
        if path == "/vllm":
            return 200, text, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
        if path == "/garbage":
            return 200, text, "growpage_kv_page_utilization{model=\"m\" 0.5\n"
        if path == "/error":
            return 503, "text/plain", "upstream unavailable\n"
        if path == "/slow":
            time.sleep(3)
            return 0, "", ""
        if path == "/json-error/api/v1/query":
            return 400, "application/json", ('{"status":"error","errorType":"bad_data",'
                                             '"error":"parse error at char 7: unexpected identifier"}')
        if path == "/json-empty/api/v1/query":
            return 200, "application/json", '{"status":"success","data":{"resultType":"vector","result":[]}}'
        return 404, "text/plain", "404 page not found\n"

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metrics_server() -> Iterator[Callable[[scenarios.Scenario], MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(scenario: scenarios.Scenario = scenarios.HEALTHY) -> MetricsServer:
        server = MetricsServer(scenario).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)
