"""End to end: a scrape target breaching an SLO -> real Prometheus with the generated rules -> real
Alertmanager with the generated routing -> the ticket webhook gets the alert with its runbook_url.

The target is a loopback HTTP server serving a catalog-generated exposition (utilization 0.3: below
both the 0.65 SLO and the 0.40 checklist line). ``target_url`` is the seam where the live agent goes.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from synthetic_growpage import exposition

from growpage import catalog
from growpage.monitoring.alertmanager import PAGER_RECEIVER, TICKET_RECEIVER, RouteTiming, alertmanager_config
from growpage.monitoring.rules_file import dump_yaml, rule_groups
from support.promstack import run_alertmanager, run_prometheus, wait_until

POD = {"namespace": "math-reasoning", "pod": "vllm-reasoning-0"}  # what service discovery would add
FAST = RouteTiming(group_wait="1s", group_interval="1s", page_repeat_interval="1h", ticket_repeat_interval="1h")


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass


@contextlib.contextmanager
def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def breaching_target(body: str) -> Iterator[str]:
    """A GrowPage scrape target on loopback; yields host:port."""
    class Target(_Handler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            payload = body.encode()
            self.send_response(200 if self.path == catalog.METRICS_PATH else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(payload)

    with _serve(Target) as address:
        yield address


@contextlib.contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[dict]]]:
    """Alertmanager's webhook target; yields its base URL and the notifications received (path, body)."""
    received: list[dict] = []

    class Receiver(_Handler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, **body})
            self.send_response(200)
            self.end_headers()

    with _serve(Receiver) as address:
        yield f"http://{address}", received


@pytest.mark.slow
def test_over_granting_makes_one_ticket_with_runbook_and_inhibits_the_slo_ticket(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(dump_yaml({"groups": rule_groups(for_override="2s")}))  # test variant: short for:
    body = exposition({catalog.UTILIZATION.name: 0.3, catalog.LIVE_TOKENS.name: 12_000.0,
                       catalog.GRANTED_TOKEN_SLOTS.name: 40_000.0}, home="reference")
    with breaching_target(body) as target, webhook_receiver() as (receiver_url, received):
        config = alertmanager_config({PAGER_RECEIVER: f"{receiver_url}/pager",
                                      TICKET_RECEIVER: f"{receiver_url}/ticket"}, FAST)
        scrape = {"job_name": catalog.SCRAPE_JOB, "metrics_path": catalog.METRICS_PATH,
                  "static_configs": [{"targets": [target], "labels": POD}]}
        with run_alertmanager(tmp_path / "am", config) as alertmanager, \
                run_prometheus(tmp_path / "prom", [scrape], rule_files=[rules],
                               alertmanager_url=alertmanager.url) as prometheus:
            wait_until(prometheus.targets_up, timeout_s=15, what="the scrape target to be up")

            def ticket() -> dict | None:
                return next((a for n in received if n["path"] == "/ticket" for a in n["alerts"]
                             if a["labels"]["alertname"] == "GrowPageKVOverGranting"), None)

            alert = wait_until(ticket, timeout_s=40, what="the ticket at the ticket webhook")
            assert alert["status"] == "firing"
            assert alert["labels"]["severity"] == catalog.SEVERITY_TICKET
            assert alert["labels"]["namespace"] == POD["namespace"] and alert["labels"]["pod"] == POD["pod"]
            assert alert["annotations"]["runbook_url"] == f"{catalog.RUNBOOK_BASE_URL}/GrowPageKVOverGranting.md"
            assert "30%" in alert["annotations"]["description"]

            def warning_inhibited() -> bool:
                return any(a["labels"]["alertname"] == "GrowPageKVUtilizationLow" and a["status"]["inhibitedBy"]
                           for a in alertmanager.alerts())

            wait_until(warning_inhibited, timeout_s=15, what="GrowPageKVUtilizationLow to be inhibited")
            # Over-granting wastes capacity but fails no request: nothing reached the pager.
            assert not [n for n in received if n["path"] == "/pager"]
