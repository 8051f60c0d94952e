"""The generated Alertmanager config: amtool-clean, each alert reaches its receiver, and a real
Alertmanager silences exactly the alerts the inhibit rules say, where they say."""

from __future__ import annotations

import datetime
import json
import urllib.request

import pytest
import yaml
from monitoring_paths import ALERTMANAGER_FILE

from growpage import catalog
from growpage.monitoring.alert_rules import alert_names, alert_rules
from growpage.monitoring.alertmanager import (
    INHIBIT_PAIRS,
    PAGER_RECEIVER,
    PLACEHOLDER_WEBHOOK_URLS,
    RECEIVER_BY_SEVERITY,
    TICKET_RECEIVER,
    inhibit_equal,
)
from support.promstack import Alertmanager, run_alertmanager, run_tool, wait_until

SEVERITY = {rule.name: rule.severity for rule in alert_rules()}
POD = {"namespace": "math-reasoning", "pod": "vllm-reasoning-0", catalog.MODEL_LABEL: "qwen2.5-7b",
       "job": catalog.SCRAPE_JOB}


def test_amtool_check_config_is_clean():
    result = run_tool("amtool", "check-config", str(ALERTMANAGER_FILE))
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule.name)
def test_each_alert_is_routed_to_the_receiver_of_its_severity(rule):
    receiver = RECEIVER_BY_SEVERITY[rule.severity]
    run_tool("amtool", "config", "routes", "test", f"--config.file={ALERTMANAGER_FILE}",
             f"--verify.receivers={receiver}", f"alertname={rule.name}", f"severity={rule.severity}",
             "namespace=math-reasoning", "pod=vllm-reasoning-0")


def test_inhibit_rules_never_let_a_lesser_alert_silence_a_page():
    rank = {catalog.SEVERITY_TICKET: 0, catalog.SEVERITY_PAGE: 1}
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    assert len(config["inhibit_rules"]) == len(INHIBIT_PAIRS)
    for pair, rule in zip(INHIBIT_PAIRS, config["inhibit_rules"], strict=True):
        assert {pair.source, pair.target} <= set(alert_names())
        assert rank[SEVERITY[pair.source]] >= rank[SEVERITY[pair.target]], pair
        assert rule["source_matchers"] == [f'alertname="{pair.source}"']
        assert rule["equal"] == inhibit_equal(pair)


@pytest.mark.parametrize(("labels", "receiver"), [
    ({"alertname": "GrowPageKVPagesStranded", "severity": "critical"}, PAGER_RECEIVER),
    ({"alertname": "GrowPageAgentInactive", "severity": "warning"}, TICKET_RECEIVER),
    ({"alertname": "SomeoneElsesAlert", "severity": "critical"}, TICKET_RECEIVER),  # not ours: the root
])
def test_amtool_routes_by_severity_only_for_growpage_alerts(labels, receiver):
    run_tool("amtool", "config", "routes", "test", f"--config.file={ALERTMANAGER_FILE}",
             f"--verify.receivers={receiver}", *(f"{k}={v}" for k, v in labels.items()))


def _post(alertmanager: Alertmanager, *alerts: dict) -> None:
    now = datetime.datetime.now(datetime.UTC).isoformat()
    body = json.dumps([{"labels": labels, "startsAt": now} for labels in alerts]).encode()
    request = urllib.request.Request(f"{alertmanager.url}/api/v2/alerts", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5):  # noqa: S310 (loopback)
        pass


def _alert(name: str, **labels: str) -> dict:
    return {"alertname": name, "severity": SEVERITY[name], **{k: v for k, v in {**POD, **labels}.items() if v}}


def _inhibited(alertmanager: Alertmanager) -> dict[tuple[str, str], bool]:
    return {(a["labels"]["alertname"], a["labels"].get("namespace", "")): bool(a["status"]["inhibitedBy"])
            for a in alertmanager.alerts()}


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    with run_alertmanager(tmp_path_factory.mktemp("am"), ALERTMANAGER_FILE.read_text()) as server:
        yield server


@pytest.mark.parametrize("pair", INHIBIT_PAIRS, ids=lambda pair: f"{pair.source}-silences-{pair.target}")
def test_alertmanager_inhibits_each_pair_only_where_the_equal_labels_match(alertmanager, pair):
    # Service-level sources carry no pod; the target elsewhere (another namespace) stays loud.
    namespace = f"{pair.source}-{pair.target}".lower()
    other = f"{namespace}-other"
    source_pod = POD["pod"] if "pod" in pair.equal else None
    _post(alertmanager, _alert(pair.source, namespace=namespace, pod=source_pod),
          _alert(pair.target, namespace=namespace), _alert(pair.target, namespace=other))
    if pair.equal == ("job",):  # MetricsAbsent has only a job: every GrowPage job's target matches
        wait_until(lambda: _inhibited(alertmanager).get((pair.target, namespace)), 10,
                   what=f"{pair.target} to be inhibited")
        return
    state = wait_until(lambda: (found := _inhibited(alertmanager)).get((pair.target, namespace)) and found, 10,
                       what=f"{pair.target} to be inhibited by {pair.source}")
    assert state[(pair.target, other)] is False
    assert state[(pair.source, namespace)] is False


def test_one_latency_incident_pages_once(alertmanager):
    namespace = "latency-incident"
    ttft, itl = "GrowPageVLLMTimeToFirstTokenFastBurn", "GrowPageVLLMInterTokenLatencyFastBurn"
    fast, high = "GrowPageAllocationLatencyFastBurn", "GrowPageAllocationLatencyHigh"
    _post(alertmanager, _alert(ttft, namespace=namespace, pod=None), _alert(itl, namespace=namespace, pod=None),
          _alert(fast, namespace=namespace, pod=None), _alert(high, namespace=namespace))
    state = wait_until(lambda: (found := _inhibited(alertmanager)).get((high, namespace))
                       and found.get((itl, namespace)) and found, 10,
                       what="the inter-token page and the p99 ticket to wait behind the first page")
    loud_pages = [name for (name, ns), inhibited in state.items()
                  if ns == namespace and not inhibited and SEVERITY[name] == catalog.SEVERITY_PAGE]
    assert loud_pages == [ttft]


def test_receivers_are_placeholder_webhooks_and_grouping_is_per_pod():
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"]}
    assert urls == PLACEHOLDER_WEBHOOK_URLS and all(".invalid/" in url for url in urls.values())
    assert config["route"]["routes"][0]["group_by"] == ["cluster", "alertname", "namespace", catalog.MODEL_LABEL,
                                                         "pod"]


def test_a_burn_in_one_cluster_never_silences_another_clusters_page(alertmanager):
    # One Alertmanager for two clusters with the same namespaces: the fast burn in cluster a inhibits
    # the slow burn there only.
    fast, slow = "GrowPageVLLMTimeToFirstTokenFastBurn", "GrowPageVLLMTimeToFirstTokenSlowBurn"
    namespace = "two-clusters"
    _post(alertmanager, _alert(fast, namespace=namespace, pod=None, cluster="a"),
          _alert(slow, namespace=namespace, pod=None, cluster="a"),
          _alert(slow, namespace=namespace, pod=None, cluster="b"))

    def by_cluster() -> dict[str, bool] | None:
        found = {a["labels"].get("cluster", ""): bool(a["status"]["inhibitedBy"]) for a in alertmanager.alerts()
                 if a["labels"]["alertname"] == slow and a["labels"].get("namespace") == namespace}
        return found if found.get("a") else None

    state = wait_until(by_cluster, 10, what="the slow burn in cluster a to be inhibited")
    assert state == {"a": True, "b": False}
