"""``gpctl diagnose`` against the live reference engine (``build_stack``: the real model serving real
requests over HTTP), through typer's CliRunner and once through the installed console script.

One engine for the module: GrowPage enforces with ``base_pages=2`` (a 32-token grant). Traffic decides
whether that grant fits:

- fitting: prompts of 17-20 tokens and 12 new tokens fill most of the grant (utilization ~0.6-0.9);
- over-granting: 1-token prompts and 3-6 new tokens leave ~80 % of it empty (utilization < 0.2), so
  diagnose suggests ``base_pages = max(1, floor(p50 / (0.65 x 16))) = 1``.

Tests run in file order: the fitting traffic first, then the over-granting traffic with a fresh
Prometheus scraping it (so ``--prometheus --since 2m`` sees that traffic only, nothing backfilled).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from gpctl.main import app
from growpage import catalog
from growpage.config import GrowPageConfig
from growpage.diagnose.schema import REPORT_SCHEMA
from support.live_agent import BackgroundLoad, background_load, run_live_agent, scrape_config
from support.promstack import Prometheus, run_prometheus, wait_until

pytestmark = pytest.mark.slow

BASE_PAGES, BLOCK_SIZE = 2, 16
POD = {"namespace": "chat", "pod": "vllm-chat-0"}  # what service discovery would add
FITTING_PROMPTS = (
    "Explain in two short sentences why the sky is blue during the day and red at sunset.",
    "List three everyday uses of a paperclip, and say which one you think is the most surprising.",
    "Write a short poem about autumn leaves falling slowly in a quiet park near the river.",
    "Describe how a bicycle works, from the pedals and the chain to the wheels and the brakes.",
)
SHORT_PROMPTS = ("Hi", "Hello", "Yes", "Thanks")
SHORT_ANSWER_TOKENS = (3, 4, 5, 6)  # unequal: the four clients stay out of step, the engine never idles
SUGGESTED_BASE_PAGES = 1  # floor(~6 tokens / (0.65 x 16)) = 0, at least 1
EXIT_CODES = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}
# The agent polls the core at most once a second (poll_interval_s) and a CPU step holds the engine
# lock for ~0.25 s, so two scrapes 1 s apart can read the same poll (no increase at all). Over 2 s at
# least one poll lies between them: the over-granting report then always has finished requests.
WINDOW = "2s"
# The short traffic must outlast every test that reads it: at ~10-20 short requests a second, 1,000
# requests or 150 s ran out before the last diagnose on a CI machine (two scrapes of an idle engine:
# utilization 0). The fixture stops it when the module's tests are done; these only bound a hang.
OVER_GRANTING_REQUESTS, OVER_GRANTING_LIMIT_S = 50_000, 900


@dataclass(frozen=True)
class OverGranting:
    prometheus: Prometheus
    load: BackgroundLoad

    def assert_still_loaded(self) -> None:
        assert not self.load.done, f"the short traffic ended before the test: {self.load.result()}"


@pytest.fixture(scope="module")
def agent(llama_model, tokenizer, prepared_model_dir):
    config = GrowPageConfig(mode="enforce", base_pages=BASE_PAGES, block_size=BLOCK_SIZE, sink_tokens=4,
                            recent_window_tokens=12)
    with run_live_agent(config, model=llama_model, tokenizer=tokenizer, model_dir=prepared_model_dir,
                        num_pages=400) as live:
        yield live


def diagnose_json(runner, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["diagnose", "--output", "json", *args])
    assert "Traceback" not in result.output, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, REPORT_SCHEMA)
    assert document["exit_code"] == result.exit_code == EXIT_CODES[document["status"]], result.output
    return result.exit_code, document


def by_id(document: dict) -> dict[str, dict]:
    return {check["id"]: check for check in document["checks"]}


def assert_over_granting(document: dict) -> dict:
    """The over-granting finding with its suggestion; returns its evidence."""
    check = by_id(document)["over-granting"]
    evidence = check["evidence"]
    # The GrowPageKVOverGranting condition: a ticket in the severity table, so a warning.
    assert check["status"] == "warning" and check["severity"] == "warning", check
    assert check["alerts"] == ["GrowPageKVOverGranting"]
    assert evidence["metric"] == catalog.UTILIZATION.name
    assert 0 < evidence["value"] < catalog.CHECKLIST.utilization_sustained_low, evidence
    assert (evidence["base_pages"], evidence["block_size"], evidence["grant_tokens"]) == (BASE_PAGES, BLOCK_SIZE, 32)
    assert evidence["requests_finished"] > 0 and evidence["request_tokens_p50"] < 16, evidence
    assert evidence["suggested_base_pages"] == SUGGESTED_BASE_PAGES, evidence
    suggestion = f"Set base_pages to {SUGGESTED_BASE_PAGES} (now {BASE_PAGES})"
    assert any(suggestion in step for step in check["remediation"]), check
    assert check["runbook_url"].startswith(catalog.RUNBOOK_BASE_URL)
    return evidence


def test_fitting_traffic_is_not_over_granting(runner, agent):
    with background_load(agent.url, agent.model, num_requests=100, concurrency=4, max_tokens=12,
                         prompts=FITTING_PROMPTS, time_limit_s=40) as load:
        # What the scrapes will read, not the pool: the exported gauges lag the engine by a poll.
        wait_until(lambda: agent.exported(catalog.REQUESTS_RUNNING.name) > 0, 20, interval_s=0.1,
                   what="running requests on the metrics endpoint")
        exit_code, document = diagnose_json(runner, "--endpoint", agent.metrics_url, "--duration", "1")
        load.stop()
    assert document["source"]["kind"] == "endpoint" and document["source"]["target"] == agent.metrics_url
    assert document["source"]["window"]["kind"] == "scrapes" and document["source"]["window"]["num_samples"] == 2
    checks = by_id(document)
    over = checks["over-granting"]
    assert over["status"] == "ok" and over["evidence"]["value"] >= catalog.CHECKLIST.utilization_sustained_low, over
    assert checks["agent-health"]["status"] == "ok" and checks["oom-fragmentation"]["status"] == "ok", checks
    # Healthy-ish: nothing is critical. A 1 s window on this CPU engine (a few requests a second) may
    # see no page grant (idle: ok) or catch requests just admitted (mean utilization under the SLO:
    # exit 1); the verdict and exit code still agree with the rows. Two scrapes hold no burn history.
    assert exit_code in (0, 1) and document["counts"]["critical"] == 0, document["counts"]
    assert {k for k, c in checks.items() if c["status"] == "unknown"} <= {"slo-allocation-latency"}, \
        {k: c["summary"] for k, c in checks.items() if c["status"] == "unknown"}
    assert load.result().num_ok > 0 and not load.result().errors, load.result()


def assert_idle_pod_is_ok(document: dict, exit_code: int) -> None:
    """An idle healthy pod: ok (exit 0), and only what two scrapes cannot hold is not checked."""
    checks = by_id(document)
    assert (document["status"], exit_code) == ("ok", 0), {k: (c["status"], c["summary"]) for k, c in checks.items()}
    assert {item["id"] for item in document["not_checked"]} <= {"vllm-latency", "slo-allocation-latency"}, \
        document["not_checked"]
    assert all(item["to_check"] for item in document["not_checked"])
    assert checks["agent-health"]["status"] == "ok"


def test_an_idle_pod_in_mode_enforce_diagnoses_ok(runner, agent):
    agent.wait_idle()  # the fitting traffic has finished: nothing runs between the two scrapes
    exit_code, document = diagnose_json(runner, "--endpoint", agent.metrics_url, "--duration", "1")
    assert_idle_pod_is_ok(document, exit_code)
    assert by_id(document)["rollout"]["evidence"]["mode"] == "enforce"


def test_an_idle_pod_in_mode_off_diagnoses_ok(runner, llama_model, tokenizer, prepared_model_dir):
    # What `gpctl serve --mode off` runs, idle: GrowPage observes nothing, and nothing it exports is
    # a finding; an idle pod is no reason to exit 3 (that is for an endpoint that cannot be read).
    with run_live_agent(GrowPageConfig(mode="off"), model=llama_model, tokenizer=tokenizer,
                        model_dir=prepared_model_dir, num_pages=64) as off:
        exit_code, document = diagnose_json(runner, "--endpoint", off.metrics_url, "--duration", "1")
    assert_idle_pod_is_ok(document, exit_code)
    assert by_id(document)["rollout"]["evidence"]["mode"] == "off"


@pytest.fixture(scope="module")
def over_granting(agent, tmp_path_factory):
    """The agent serving short requests, scraped every second by a fresh Prometheus."""
    agent.wait_idle()  # nothing left of the fitting traffic
    work = tmp_path_factory.mktemp("prometheus")
    with run_prometheus(work, [scrape_config(agent, labels=POD)]) as prometheus, \
            background_load(agent.url, agent.model, num_requests=OVER_GRANTING_REQUESTS, concurrency=4,
                            max_tokens=SHORT_ANSWER_TOKENS, prompts=SHORT_PROMPTS,
                            time_limit_s=OVER_GRANTING_LIMIT_S) as load:
        wait_until(prometheus.targets_up, 20, what="the live agent's target to be up")
        wait_until(lambda: prometheus.query_value(f"{catalog.REQUEST_TOKENS.name}_count"), 30,
                   what="finished short requests")
        yield OverGranting(prometheus, load)
        load.stop()
    result = load.result()
    assert result.num_ok > 0 and not result.errors, result


def test_over_granting_text_report_through_the_cli_runner(runner, agent, over_granting):
    over_granting.assert_still_loaded()
    result = runner.invoke(app, ["diagnose", "--endpoint", agent.metrics_url, "--duration", WINDOW])
    assert result.exit_code == 1, result.output  # over-granting is a ticket: a warning (docs/DIAGNOSE.md)
    text = " ".join(result.output.split())  # the report wraps at 80 columns
    assert text.startswith("VERDICT: WARNING (exit 1)")
    assert "WARNING Grants fit the traffic" in text and "[over-granting]" in text
    assert f"vs a 32-token grant ({BASE_PAGES} x {BLOCK_SIZE})" in text
    assert f"Set base_pages to {SUGGESTED_BASE_PAGES} (now {BASE_PAGES})" in text


def test_console_script_json_and_bundle_replayed_as_a_snapshot(runner, agent, over_granting, tmp_path):
    over_granting.assert_still_loaded()
    gpctl = Path(sys.executable).with_name("gpctl")
    if not gpctl.exists():
        pytest.skip(f"{gpctl} is not installed (pip install -e .)")
    bundle = tmp_path / "ticket.tar.gz"
    environment = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    completed = subprocess.run(
        [str(gpctl), "diagnose", "--endpoint", agent.metrics_url, "--duration", WINDOW, "--output", "json",
         "--bundle", str(bundle)], capture_output=True, text=True, timeout=60, env=environment)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert completed.stderr == ""  # not a terminal: no progress line
    live = json.loads(completed.stdout)  # stdout is the JSON document and nothing else
    jsonschema.validate(live, REPORT_SCHEMA)
    assert (live["status"], live["exit_code"]) == ("warning", 1)
    assert [check["id"] for check in live["checks"]] == list(by_id(live))  # checklist order, each once
    assert len(live["checks"]) == 9 and sum(live["counts"].values()) == 9
    evidence = assert_over_granting(live)
    assert by_id(live)["slo-utilization"]["status"] == "warning"

    with tarfile.open(bundle) as archive:
        names = set(archive.getnames())
        assert {"report.json", "report.txt", "build_info.json", "manifest.json"} <= names
        raw = sorted(name for name in names if name.startswith("raw/") and name.endswith(".prom"))
        assert len(raw) == 2, names
        assert json.load(archive.extractfile("report.json")) == live

    exit_code, replayed = diagnose_json(runner, "--snapshot", str(bundle))
    assert replayed["source"]["kind"] == "snapshot"
    assert (replayed["status"], exit_code) == (live["status"], live["exit_code"])
    assert {k: c["status"] for k, c in by_id(replayed).items()} == {k: c["status"] for k, c in by_id(live).items()}
    replayed_evidence = assert_over_granting(replayed)
    for key in ("value", "mean", "requests_finished", "request_tokens_p50", "suggested_base_pages"):
        assert replayed_evidence[key] == evidence[key], key


def test_prometheus_that_scraped_the_live_agent(runner, over_granting):
    over_granting.assert_still_loaded()
    prometheus = over_granting.prometheus
    wait_until(lambda: (prometheus.query_value(f"count_over_time({catalog.UTILIZATION.name}[2m])") or 0) >= 10, 30,
               what="10 scrapes of the over-granting traffic")
    exit_code, document = diagnose_json(runner, "--prometheus", prometheus.url, "--since", "2m")
    assert (document["status"], exit_code) == ("warning", 1), by_id(document)
    assert document["source"]["kind"] == "prometheus" and document["source"]["since_s"] == 120
    evidence = assert_over_granting(document)
    assert evidence["requests_finished"] >= 5  # Prometheus' increase() over the whole window
    over = by_id(document)["over-granting"]
    assert over["breakdown"]["label"] == "namespace"
    assert over["breakdown"]["scopes"][POD["namespace"]]["status"] == "warning"
    assert by_id(document)["agent-health"]["status"] == "ok"  # scraped, up, no faults
