"""``gpctl diagnose --prometheus`` against a REAL Prometheus loaded with 35 minutes of recorded series.

Three namespaces at 15 s resolution, written as OpenMetrics and loaded with ``promtool tsdb
create-blocks-from openmetrics``: ``chat`` (two healthy pods, enforce), ``batch`` (over-granting,
monitor) and ``reasoning`` (slow grants with block_size 16 on an H100, high LTS entropy, monitor).
``--at`` pins the evaluation time inside the data so every run sees the same window.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import diagnose_scenarios as scenarios
import pytest

from gpctl.main import app
from growpage import catalog
from growpage.monitoring.alert_rules import alert_rules
from growpage.monitoring.promql import metric_names
from growpage.monitoring.recording_rules import recording_rules
from support.promstack import run_prometheus, run_tool

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="prometheus/promtool not installed (scripts/install-system-deps.sh)")

# Monitored, and monitor's forecast says enforce pays: its spare pages would run waiting requests in a wider
# batch (0.02 s a second) for GrowPage's own 0.002 s a second on each side.
REASONING = scenarios.LATENCY.replace(
    build={**scenarios.LATENCY.build, "mode": "monitor"}, entropy_shares=scenarios.PHASE_TWO_CANDIDATE.entropy_shares,
    compress_input_bytes_per_s=0.0, compress_output_bytes_per_s=0.0, compress_ratio_gauge=0.0,
    forecast_per_s={catalog.FORECAST_PAGES_FREED.name: 1.0, catalog.FORECAST_PREEMPTIONS.name: 0.0,
                    catalog.FORECAST_PREEMPTIONS_AVOIDABLE.name: 0.0,
                    catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE.name: 0.0,
                    catalog.FORECAST_WIDER_BATCH_SECONDS.name: 0.02},
    own_seconds_per_s=0.002)
REASONING_GPU = scenarios.LATENCY.gpu_model
TARGETS = {("chat", "chat-0"): scenarios.HEALTHY, ("chat", "chat-1"): scenarios.HEALTHY,
           ("batch", "batch-0"): scenarios.OVER_GRANTING, ("reasoning", "reasoning-0"): REASONING}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A Prometheus serving the recorded scenario; yields (url, end of data as unix seconds)."""
    work = tmp_path_factory.mktemp("prometheus")
    # An hour ago, on a minute: inside retention, outside the head block.
    end_s = float(int(time.time() // 60) * 60 - 3600)
    start_s = end_s - 35 * 60
    data = work / "recorded.om"
    data.write_text(scenarios.openmetrics_backfill(TARGETS, start_s, end_s, step_s=15.0), encoding="utf-8")
    run_tool("promtool", "tsdb", "create-blocks-from", "openmetrics", str(data), str(work / "tsdb"))
    with run_prometheus(work / "server", [], storage_path=work / "tsdb") as prometheus:
        yield prometheus.url, end_s


def diagnose_json(runner, url: str, at_s: float, *args: str):
    result = runner.invoke(app, ["diagnose", "--prometheus", url, "--at", f"{at_s:.0f}", "--since", "30m",
                                 "--output", "json", *args])
    assert "Traceback" not in result.output
    document = json.loads(result.stdout) if result.stdout.strip() else None
    return result, document


def by_id(document) -> dict:
    return {check["id"]: check for check in document["checks"]}


def test_fleet_with_a_per_namespace_breakdown(runner, recorded):
    url, end_s = recorded
    result, document = diagnose_json(runner, url, end_s)
    assert result.exit_code == 1, result.output
    checks = by_id(document)
    assert document["source"]["window"]["kind"] == "range"
    assert document["source"]["window"]["duration_s"] == 1800
    over = checks["over-granting"]
    assert over["status"] == "warning" and over["breakdown"]["label"] == "namespace"
    scopes = over["breakdown"]["scopes"]
    assert {name: scope["status"] for name, scope in scopes.items()} == {
        "batch": "warning", "chat": "ok", "reasoning": "ok"}
    assert over["summary"].startswith("namespace batch: utilization never above 0.34")
    assert any(step.startswith("namespace batch: Set base_pages to 30 (now 128)") for step in over["remediation"])
    latency = checks["allocation-latency"]
    assert latency["status"] == "warning"
    assert latency["breakdown"]["scopes"]["reasoning"]["status"] == "warning"
    assert latency["breakdown"]["scopes"]["chat"]["status"] == "ok"
    assert "block_size 16 on H100" in latency["breakdown"]["scopes"]["reasoning"]["summary"]
    rollout = checks["rollout"]["breakdown"]["scopes"]
    reasoning = rollout["reasoning"]
    assert reasoning["severity"] == "info" and "monitor's forecast says enforce pays here" in reasoning["summary"]
    # the forecast's increases over the 30-minute window, weighed as gpctl calibrate weighs them
    forecast = reasoning["evidence"]["forecast"]
    assert forecast["wider_batch_seconds"] == pytest.approx(0.02 * 1800, rel=0.05)
    assert forecast["own_seconds"] == pytest.approx(2 * 0.002 * 1800, rel=0.05)
    assert rollout["batch"]["severity"] == "none"


def test_healthy_namespace_breaks_down_by_pod(runner, recorded):
    url, end_s = recorded
    result, document = diagnose_json(runner, url, end_s, "--namespace", "chat")
    assert result.exit_code == 0, result.output
    assert document["status"] == "ok"
    assert document["source"]["selector"] == '{namespace="chat"}'
    for check in document["checks"]:
        assert check["breakdown"]["label"] == "pod"
        assert sorted(check["breakdown"]["scopes"]) == ["chat-0", "chat-1"]
    checks = by_id(document)
    assert checks["slo-utilization"]["evidence"]["value"] == pytest.approx(0.78, abs=0.005)
    assert checks["slo-compress-ratio"]["evidence"]["value"] == pytest.approx(2.6, rel=1e-3)
    assert checks["agent-health"]["evidence"]["targets_total"] == 2
    assert checks["agent-health"]["evidence"]["sample_age_s"] == 0


def test_over_granting_namespace_is_sustained_over_the_window(runner, recorded):
    url, end_s = recorded
    result, document = diagnose_json(runner, url, end_s, "--namespace", "batch")
    assert result.exit_code == 1, result.output
    evidence = by_id(document)["over-granting"]["evidence"]
    assert evidence["value"] == 0.34  # max_over_time: never above 0.34 in 30 minutes
    assert evidence["mean"] == pytest.approx(0.32, abs=0.002)
    assert evidence["request_tokens_p50"] == pytest.approx(320, rel=1e-3)
    assert evidence["suggested_base_pages"] == 30


def test_latency_for_one_pod(runner, recorded):
    url, end_s = recorded
    result, document = diagnose_json(runner, url, end_s, "--namespace", "reasoning", "--pod", "reasoning-0")
    assert result.exit_code == 1, result.output
    checks = by_id(document)
    assert all(check["breakdown"] is None for check in document["checks"])
    assert checks["slo-allocation-latency"]["evidence"]["value"] == pytest.approx(0.85, abs=1e-3)
    assert checks["allocation-latency"]["evidence"]["value"] == pytest.approx(0.075, rel=1e-3)
    assert checks["allocation-latency"]["evidence"]["recommended_block_size"] == 32
    assert checks["rollout"]["severity"] == "info"


def test_stale_scrape_is_an_agent_health_warning(runner, recorded):
    url, end_s = recorded
    result, document = diagnose_json(runner, url, end_s + 240, "--namespace", "chat")
    health = by_id(document)["agent-health"]
    assert health["status"] == "warning" and "newest sample 240s old" in health["summary"]


def test_text_report_at_80_columns(runner, recorded):
    url, end_s = recorded
    result = runner.invoke(app, ["diagnose", "--prometheus", url, "--at", f"{end_s:.0f}"])
    assert result.exit_code == 1
    assert result.stdout.startswith("VERDICT: WARNING (exit 1)")
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "namespace batch: WARNING" in result.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["--namespace", "nosuch"], "GrowPage series exist in namespaces: batch, chat, reasoning"),
    (["--at", "1000000000"], "no growpage_* series"),
])
def test_no_series_for_the_selection(runner, recorded, args, fragment):
    url, end_s = recorded
    result = runner.invoke(app, ["diagnose", "--prometheus", url, *(["--at", f"{end_s:.0f}"] if "--at" not in args
                                                                    else []), *args])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert fragment in result.stderr


def test_bundle_records_queries(runner, recorded, tmp_path: Path):
    import tarfile
    url, end_s = recorded
    bundle = tmp_path / "b.tar.gz"
    result = runner.invoke(app, ["diagnose", "--prometheus", url, "--at", f"{end_s:.0f}", "--namespace", "chat",
                                 "--bundle", str(bundle)])
    assert result.exit_code == 0
    with tarfile.open(bundle) as archive:
        queries = json.loads(archive.extractfile("raw/prometheus-queries.json").read())
    assert all(entry["time"] == end_s for entry in queries)
    assert any("growpage_kv_page_utilization" in entry["query"] for entry in queries)
    # diagnose reads every vLLM series its alerts read (the rules file is the reference).
    # A histogram counts as read through its buckets (diagnose takes the total from le="+Inf").
    read_by_alerts = {name.removesuffix("_count").removesuffix("_sum")
                      for rule in [*alert_rules(), *recording_rules()] for name in metric_names(rule.expr)
                      if name.startswith("vllm:")}
    assert read_by_alerts and all(any(name in entry["query"] for entry in queries) for name in read_by_alerts)


def test_dcgm_joins_through_exported_labels_for_a_namespace_and_pod(runner, recorded):
    # The runbooks' own command: --namespace NS --pod POD. dcgm-exporter's series carry the GPU's user
    # in exported_namespace/exported_pod; joining on namespace would find the exporter's namespace.
    url, end_s = recorded
    result, document = diagnose_json(runner, url, end_s, "--namespace", "reasoning", "--pod", "reasoning-0")
    assert result.exit_code in (1, 2), result.output
    checks = by_id(document)
    assert checks["allocation-latency"]["evidence"]["gpu"] == REASONING_GPU
    assert checks["oom-fragmentation"]["evidence"]["gpu_framebuffer_used_max"] is not None


def test_the_selection_and_its_breakdown_agree_on_the_framebuffer(runner, recorded):
    url, end_s = recorded
    _, document = diagnose_json(runner, url, end_s, "--namespace", "chat")
    oom = by_id(document)["oom-fragmentation"]
    per_pod = [scope["evidence"]["gpu_framebuffer_used_max"] for scope in oom["breakdown"]["scopes"].values()]
    assert oom["evidence"]["gpu_framebuffer_used_max"] is not None and None not in per_pod
    assert oom["evidence"]["gpu_framebuffer_used_max"] == max(per_pod)


def test_a_relabeled_dcgm_is_joined_through_dcgm_label(runner, recorded):
    url, end_s = recorded
    _, document = diagnose_json(runner, url, end_s, "--namespace", "chat", "--dcgm-label", "pod=no_such_label",
                                "--dcgm-label", "namespace=no_such_label")
    # Nothing maps the GPU's user any more: the framebuffer is unknown, never another pod's.
    assert by_id(document)["oom-fragmentation"]["evidence"]["gpu_framebuffer_used_max"] is None
