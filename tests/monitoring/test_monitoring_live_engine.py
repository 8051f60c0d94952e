"""The generated monitoring against the live reference engine (``build_stack``: the real model serving
real requests over HTTP), with nothing mocked between the agent and the webhook:

(a) every dashboard panel's PromQL runs and returns data on a real Prometheus that scrapes the agent
    with the generated rules loaded;
(b) the agent driven into an SLO violation (short requests in a 32-slot grant: utilization < 0.40)
    -> Prometheus with the generated rules (short ``for:``) -> Alertmanager with the generated routing
    -> the ticket webhook on loopback gets the ticket with its runbook_url.

One engine for the module: GrowPage enforces with ``base_pages=2`` (2 x 16 token slots). Requests of
~60 tokens cross their capacity boundary and compress (data for the compression panels); requests
of ~6 tokens leave most of the grant empty (over-granting for that traffic).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import threading
from collections.abc import Iterator

import pytest
from monitoring_paths import RULES_FILE

from growpage import catalog
from growpage.config import GrowPageConfig
from growpage.monitoring.alertmanager import PAGER_RECEIVER, TICKET_RECEIVER, RouteTiming, alertmanager_config
from growpage.monitoring.dashboards import dashboards
from growpage.monitoring.panel_queries import panel_queries, run_panel_queries
from growpage.monitoring.rules_file import dump_yaml, rule_groups
from support.live_agent import background_load, run_live_agent, scrape_config
from support.promstack import run_alertmanager, run_prometheus, wait_until

pytestmark = pytest.mark.slow

POD = {"namespace": "math-reasoning", "pod": "vllm-reasoning-0"}  # what service discovery would add
FAST = RouteTiming(group_wait="1s", group_interval="1s", page_repeat_interval="1h", ticket_repeat_interval="1h")
SHORT_PROMPTS = ("Hi", "Hello", "Yes", "Thanks")  # 1-2 tokens each: with 4 new tokens, ~6 of 32 slots
PAGE = "GrowPageKVOverGranting"

# Panel queries (dashboard, panel, refId) that cannot have data here, and why. Everything else must
# return at least one series.
_TROUBLESHOOTING = "GrowPage / Troubleshooting"
_FLEET = "GrowPage / Fleet"
_OVERVIEW = "GrowPage / Overview"
NO_DATA_ON_THIS_MACHINE = {
    # Recorded from NVIDIA's DCGM exporter; a CPU-only machine has no GPU and no exporter.
    (_TROUBLESHOOTING, "GPU framebuffer used (DCGM)", "A"),
    (_TROUBLESHOOTING, "GPU utilization (DCGM)", "A"),
    # vLLM's own vllm:* series: the reference engine is not vLLM (the vLLM plugin's tests scrape them).
    (_TROUBLESHOOTING, "3. OOM and preemption events", "C"),
    (_TROUBLESHOOTING, "vLLM KV cache usage vs GrowPage pool", "A"),
    (_TROUBLESHOOTING, "vLLM requests running / waiting", "A"),
    (_TROUBLESHOOTING, "vLLM requests running / waiting", "B"),
    (_TROUBLESHOOTING, "vLLM preemptions per second", "A"),
    (_TROUBLESHOOTING, "vLLM time to first token / inter-token latency p99", "A"),
    (_TROUBLESHOOTING, "vLLM time to first token / inter-token latency p99", "B"),
    # One series per vLLM SLO and long window: 3 SLOs (TTFT, ITL, availability) x 4 windows, refIds A-L.
    *((_TROUBLESHOOTING, "vLLM latency SLO burn rate", ref_id) for ref_id in "ABCDEFGHIJKL"),
    (_TROUBLESHOOTING, "vLLM queue time / end-to-end latency p99", "A"),
    (_TROUBLESHOOTING, "vLLM queue time / end-to-end latency p99", "B"),
    # The budget left of each vLLM SLO, from its recorded rates of vLLM's series.
    *((_OVERVIEW, f"{slo} budget left ({catalog.SLO_BUDGET_PANEL_WINDOW})", "A")
      for slo in (catalog.SLO_VLLM_TTFT.name, catalog.SLO_VLLM_ITL.name, catalog.SLO_VLLM_AVAILABILITY.name)),
    # Monitor's forecast of enforce is the vLLM plugin's scheduler agent's (its tests scrape it).
    (_OVERVIEW, "Pages enforce would free (forecast)", "A"),
    (_OVERVIEW, "Preemptions enforce would avoid (forecast)", "A"),
    (_OVERVIEW, "Preemptions enforce would avoid (forecast)", "B"),
    (_OVERVIEW, "Preemptions enforce would avoid (forecast)", "C"),
    (_OVERVIEW, "Spare pages under enforce (forecast)", "A"),
    # ... and so is its price: the recompute saved beside GrowPage's own seconds (the vLLM home's).
    (_OVERVIEW, "Recompute enforce would save against GrowPage's own time (forecast)", "A"),
    (_OVERVIEW, "Recompute enforce would save against GrowPage's own time (forecast)", "B"),
    # Growth-aware admission is the vLLM plugin's scheduler agent's (test_vllm_enforce scrapes it).
    (_OVERVIEW, "Steps admission held a request", "A"),
    (_OVERVIEW, "Projected pages against the pool", "A"),
    (_OVERVIEW, "Admission looks ahead", "A"),
    # The observer's shares are the vLLM plugin's own series.
    (_TROUBLESHOOTING, "Share of steps and requests observed (vLLM home)", "A"),
    (_TROUBLESHOOTING, "Share of steps and requests observed (vLLM home)", "B"),
    (_TROUBLESHOOTING, "Share of steps and requests observed (vLLM home)", "C"),
    (_TROUBLESHOOTING, "Share of steps and requests observed (vLLM home)", "D"),
    # ... and so is what GrowPage costs vLLM's step (test_vllm_engine scrapes both sides)
    (_TROUBLESHOOTING, "GrowPage's own share of vLLM's step time (vLLM home)", "A"),
    (_TROUBLESHOOTING, "GrowPage's own share of vLLM's step time (vLLM home)", "B"),
    # growpage_agent_active is reported by the vLLM plugin's components, not by the reference engine.
    (_TROUBLESHOOTING, "Agent components active", "A"),
    # The router's load and the KV headroom are exported by the vLLM plugin's scheduler agent (its
    # tests scrape them); the fleet's arrivals and preemptions are vLLM's own series.
    (_TROUBLESHOOTING, "Router load per replica (GET /get_load)", "A"),
    (_FLEET, "KV headroom per replica", "A"),
    (_FLEET, "Reclaimable pages per replica", "A"),
    (_FLEET, "Router load per replica (GET /get_load)", "A"),
    (_FLEET, "New requests per second per replica", "A"),
    (_FLEET, "vLLM preemptions per second per replica", "A"),
    (_FLEET, "vLLM KV cache usage per replica", "A"),
    (_FLEET, "Requests waiting per replica", "A"),
    (_FLEET, "Time to first token p99 per replica", "A"),
    # vLLM's router (vllm-router) is not part of this stack: its panels run on the backfilled router
    # series (test_dashboards) and the fleet test scrapes a real router's exposition.
    (_FLEET, "Router: requests sent to each worker", "A"),
    (_FLEET, "Router: requests sent to each worker", "B"),
    (_FLEET, "Worker health as the router sees it", "A"),
    (_FLEET, "Router: requests in flight per worker (its own count)", "A"),
    (_FLEET, "Router: share of requests failed", "A"),
    (_FLEET, "Router pods answering their scrape (up)", "A"),
}


def _key(query) -> tuple[str, str, str]:
    return query.dashboard, query.panel, query.ref_id


@pytest.fixture(scope="module")
def agent(llama_model, tokenizer, prepared_model_dir):
    config = GrowPageConfig(mode="enforce", base_pages=2, sink_tokens=4, recent_window_tokens=12)
    with run_live_agent(config, model=llama_model, tokenizer=tokenizer, model_dir=prepared_model_dir,
                        num_pages=400) as live:
        yield live


def _finite_values(prometheus, promql: str) -> list[float]:
    """The panel's values as Grafana would plot them: NaN (e.g. a quantile of empty buckets) is no data."""
    values = [float(series["value"][1]) for series in prometheus.query(promql)]
    return [v for v in values if math.isfinite(v)]


def test_every_dashboard_panel_returns_data_from_the_live_agent(agent, tmp_path):
    boards = list(dashboards().values())
    all_panels = {_key(q) for board in boards for q in panel_queries(board)}
    assert NO_DATA_ON_THIS_MACHINE <= all_panels, "an exemption names a panel that no longer exists"
    scrape = scrape_config(agent, labels=POD)
    with run_prometheus(tmp_path, [scrape], rule_files=[RULES_FILE]) as prometheus, \
            background_load(agent.url, agent.model, num_requests=24, concurrency=4, max_tokens=48,
                            time_limit_s=600) as load:
        wait_until(prometheus.targets_up, 20, what="the live agent's target to be up")

        def without_data() -> list[str]:
            return [f"{r}: {prometheus.query(r.promql)}" for r in run_panel_queries(prometheus.url, boards)
                    if _key(r.query) not in NO_DATA_ON_THIS_MACHINE
                    and not (r.has_data and _finite_values(prometheus, r.promql))]

        # While requests run (the utilization stat counts pods with running requests) and after some
        # finished (request lengths, entropy) and compressed (compress ratio).
        try:
            # returns as soon as every panel has data; the limit only bounds a loaded machine's wait
            wait_until(lambda: not without_data(), 120, interval_s=1.0, what="every panel to return data")
        except TimeoutError:
            pass  # reported below, with the panels and Prometheus' answers
        results = run_panel_queries(prometheus.url, boards)
        missing = without_data()
        stale_exemptions = [str(r) for r in results if _key(r.query) in NO_DATA_ON_THIS_MACHINE
                            and r.has_data and _finite_values(prometheus, r.promql)]
        load.stop()
    errors = [str(r) for r in results if not r.ok]
    assert not errors, "\n".join(errors)  # no exemption for a query Prometheus rejects
    assert not missing, "\n".join(missing)
    assert not stale_exemptions, f"exempt panels have data now, drop the exemption: {stale_exemptions}"
    assert len(results) == sum(len(panel_queries(board)) for board in boards)
    result = load.result()
    assert result.num_ok > 0 and not result.errors, result


@contextlib.contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[dict]]]:
    """Alertmanager's webhook target on loopback; yields its URL and the notifications (path + body)."""
    received: list[dict] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, **body})
            self.send_response(200)
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def test_an_over_granting_agent_makes_one_ticket_through_alertmanager_with_its_runbook(agent, tmp_path):
    agent.wait_idle()  # nothing left from the long requests of the other test
    rules = tmp_path / "rules.yaml"
    rules.write_text(dump_yaml({"groups": rule_groups(for_override="3s")}))  # test variant: short for:
    with webhook_receiver() as (receiver_url, received):
        config = alertmanager_config({PAGER_RECEIVER: f"{receiver_url}/pager",
                                      TICKET_RECEIVER: f"{receiver_url}/ticket"}, FAST)
        with run_alertmanager(tmp_path / "am", config) as alertmanager, \
                run_prometheus(tmp_path / "prom", [scrape_config(agent, labels=POD)], rule_files=[rules],
                               alertmanager_url=alertmanager.url) as prometheus, \
                background_load(agent.url, agent.model, num_requests=400, concurrency=4, max_tokens=4,
                                prompts=SHORT_PROMPTS, time_limit_s=90) as load:
            wait_until(prometheus.targets_up, 20, what="the live agent's target to be up")

            def ticket() -> tuple[dict, dict] | None:
                return next(((n, a) for n in received if n["path"] == "/ticket" for a in n["alerts"]
                             if a["labels"]["alertname"] == PAGE and a["status"] == "firing"), None)

            notification, alert = wait_until(ticket, 50, interval_s=0.5, what="the ticket at the ticket webhook")
            # The SLO sibling fires too, and Alertmanager silences it behind its cause.
            wait_until(lambda: any(a["labels"]["alertname"] == "GrowPageKVUtilizationLow"
                                   and a["status"]["inhibitedBy"] for a in alertmanager.alerts()),
                       20, what="GrowPageKVUtilizationLow to be inhibited by over-granting")
            utilization = prometheus.query_value(f"max_over_time({catalog.UTILIZATION.name}[1m])")
            load.stop()
    # Over-granting wastes capacity but fails no request: a ticket, never a page.
    assert notification["receiver"] == TICKET_RECEIVER and notification["status"] == "firing"
    assert alert["labels"]["severity"] == catalog.SEVERITY_TICKET
    assert {k: alert["labels"][k] for k in POD} == POD and alert["labels"]["model_name"] == agent.model
    assert alert["annotations"]["runbook_url"] == f"{catalog.RUNBOOK_BASE_URL}/{PAGE}.md"
    assert alert["annotations"]["summary"] and "base_pages" in alert["annotations"]["description"]
    assert 0 < utilization < catalog.CHECKLIST.utilization_sustained_low  # really over-granting, all along
    assert not [n for n in received if n["path"] == "/pager"], "over-granting reached the pager"
    result = load.result()
    assert result.num_ok > 0 and not result.errors, result
