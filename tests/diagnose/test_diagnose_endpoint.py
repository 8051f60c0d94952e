"""``gpctl diagnose --endpoint``: two real scrapes of a loopback server whose counters move."""

from __future__ import annotations

import json
import tarfile

import diagnose_scenarios as scenarios
import pytest

from gpctl.main import app


def test_endpoint_scrapes_twice_and_computes_rates(runner, metrics_server):
    server = metrics_server(scenarios.HEALTHY)
    result = runner.invoke(app, ["diagnose", "--endpoint", server.url, "--dcgm", server.url,
                                 "--duration", "1", "--output", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["status"] == "ok"
    # /metrics twice per scrape: vLLM's own (same server as the agent) and DCGM's (--dcgm)
    assert server.requests.count("/metrics/growpage") == 2 and server.requests.count("/metrics") == 4
    window = document["source"]["window"]
    assert window["kind"] == "scrapes" and window["num_samples"] == 2
    assert window["duration_s"] >= 1.0  # --duration apart at least; a loaded machine may add to it
    checks = {check["id"]: check for check in document["checks"]}
    # 50 grants/s: the increase between the scrapes is the rate times the time between them, read
    # on the server's own clock (the one its counters grow by)
    first, second = server.agent_scrapes_s
    grants = checks["slo-allocation-latency"]["evidence"]["grants"]
    assert grants == pytest.approx(50 * (second - first), rel=1e-3)
    assert checks["slo-compress-ratio"]["evidence"]["value"] == pytest.approx(2.6)
    assert checks["allocation-latency"]["evidence"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert checks["agent-health"]["evidence"]["response_time_s"] >= 0.0  # measured and reported
    assert document["source"]["target"] == f"{server.url}/metrics/growpage"  # default path added
    # vLLM's histograms are read (the window's shares), but two scrapes hold no burn-rate history.
    assert checks["vllm-latency"]["evidence"]["within_slo"]
    assert checks["vllm-latency"]["status"] == "unknown" and "--prometheus" in checks["vllm-latency"]["not_checked"][
        "to_check"]
    assert [item["id"] for item in document["not_checked"]] == ["vllm-latency", "slo-allocation-latency"]


def test_endpoint_finds_a_critical_problem_and_bundles_it(runner, metrics_server, tmp_path):
    # Preemptions while pages sit stranded: a page (critical), seen between two scrapes.
    server = metrics_server(scenarios.OOM_FRAGMENTATION)
    bundle = tmp_path / "ticket.tar.gz"
    result = runner.invoke(app, ["diagnose", "--endpoint", f"{server.url}/metrics/growpage", "--duration", "1",
                                 "--bundle", str(bundle)])
    assert result.exit_code == 2, result.output
    assert result.stdout.startswith("VERDICT: CRITICAL (exit 2)")
    with tarfile.open(bundle) as archive:
        agent = archive.extractfile("raw/agent-1.prom").read().decode()
    assert agent.startswith("# growpage-snapshot-time: ")
    # The bundle replays offline with the same verdict.
    replay = runner.invoke(app, ["diagnose", "--snapshot", str(bundle), "--output", "json"])
    assert replay.exit_code == 2 and json.loads(replay.stdout)["status"] == "critical"
