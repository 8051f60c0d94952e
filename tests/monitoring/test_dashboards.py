"""The generated dashboards: valid Grafana JSON, catalog metrics only, PromQL that runs and returns data."""

from __future__ import annotations

import json
import re

import pytest
from monitoring_paths import REPO_ROOT

from growpage import catalog
from growpage.monitoring import alert_rules, router_rules
from growpage.monitoring.dashboards import dashboards
from growpage.monitoring.dashboards.common import DATASOURCE, GRID_COLUMNS
from growpage.monitoring.panel_queries import panel_queries, run_panel_queries, substitute_variables
from growpage.monitoring.promql import metric_names
from growpage.monitoring.recording_rules import recording_rule_names

COMMITTED = {path.name: json.loads(path.read_text()) for path in (REPO_ROOT / "dashboards").glob("*.json")}
ALLOWED_METRICS = ({name for spec in (*catalog.METRICS, *catalog.ROUTER_METRICS, *catalog.VLLM_HOME_METRICS)
                    for name in spec.series_names}
                   | recording_rule_names() | {rule.record for rule in router_rules.recording_rules()}
                   | set(catalog.ROUTER_METRICS_SERIES)
                   | {"up", catalog.DCGM_FB_USED, catalog.DCGM_FB_FREE, catalog.DCGM_GPU_UTIL, *catalog.VLLM_METRICS})
VARIABLES = ("datasource", "cluster", "job", "namespace", "pod", catalog.MODEL_LABEL)


def _panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_committed_dashboards_are_the_generated_ones():
    assert COMMITTED == dashboards()


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_panel_ids_are_unique_and_grid_positions_fit_without_overlap(name):
    board = COMMITTED[name]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    occupied: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["y"] >= 0
        assert pos["x"] + pos["w"] <= GRID_COLUMNS, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in occupied, f"{panel['title']} overlaps {occupied[(x, y)]}"
                occupied[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_query_uses_the_templated_datasource_and_variables_exist(name):
    board = COMMITTED[name]
    assert [v["name"] for v in board["templating"]["list"]] == list(VARIABLES)
    assert board["templating"]["list"][0]["type"] == "datasource"
    for panel in _panels(board):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for variable in board["templating"]["list"][1:]:
        assert variable["datasource"] == DATASOURCE
    assert board["uid"] and board["title"].startswith("GrowPage / ")


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_units_are_set_where_they_matter(name):
    units = {p["fieldConfig"]["defaults"].get("unit") for p in _panels(COMMITTED[name])}
    if name == "growpage-fleet.json":  # pages, the load in percent, requests and preemptions per second
        assert {"short", "percent", "reqps", "ops"} <= units
        return
    assert {"percentunit", "s"} <= units
    if name == "growpage-overview.json":
        assert {"bytes", "Bps", "ops"} <= units


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_queried_metric_is_in_the_catalog_or_a_generated_rule(name):
    for query in panel_queries(COMMITTED[name]):
        unknown = metric_names(substitute_variables(query.expr)) - ALLOWED_METRICS
        assert not unknown, f"{query.panel}: {sorted(unknown)}"


def test_troubleshooting_follows_the_checklist_and_every_panel_links_an_existing_runbook():
    board = COMMITTED["growpage-troubleshooting.json"]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    numbered = [title for title in rows if re.match(r"\d\.", title)]
    assert [title[0] for title in numbered] == ["1", "2", "3"]
    assert "40%" in numbered[0] and "20 ms" in numbered[1] and "stranded" in numbered[2]
    for panel in _panels(board):
        links = re.findall(re.escape(catalog.RUNBOOK_BASE_URL) + r"/(\w+)\.md", panel["description"])
        assert links, f"{panel['title']} links no runbook"
        for alert in links:
            assert (REPO_ROOT / "runbooks" / f"{alert}.md").is_file(), alert
    titles = {board["title"]: {p["title"] for p in _panels(board)} for board in COMMITTED.values()}
    for rule in alert_rules.alert_rules():
        assert rule.dashboard_panel in titles[rule.dashboard], f"{rule.name} points at a missing panel"


def test_overview_has_the_slo_stats_and_the_rollout_view():
    board = COMMITTED["growpage-overview.json"]
    stats = [p for p in _panels(board) if p["type"] == "stat"]
    thresholds = {p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
                  for p in stats}
    assert [None, catalog.SLO_UTILIZATION.objective] in thresholds.values()
    assert [None, catalog.SLO_COMPRESS_RATIO.objective] in thresholds.values()
    assert [None, catalog.SLO_ALLOCATION_LATENCY.objective] in thresholds.values()
    assert any("budget left" in title for title in thresholds)
    types = {p["type"] for p in _panels(board)}
    assert {"heatmap", "table", "timeseries", "stat"} <= types
    exprs = " ".join(q.expr for q in panel_queries(board))
    assert "count by (namespace, mode)" in exprs and catalog.LTS_ENTROPY.name in exprs


def test_every_panel_query_runs_and_returns_data_on_prometheus(backfilled_prometheus):
    results = run_panel_queries(backfilled_prometheus.url, COMMITTED.values(), at=backfilled_prometheus.at)
    assert len(results) == sum(len(panel_queries(board)) for board in COMMITTED.values())
    failures = [str(r) for r in results if not r.has_data]
    assert not failures, "\n".join(failures)


def test_a_broken_query_is_reported_not_raised(backfilled_prometheus):
    board = {"title": "t", "panels": [{"id": 1, "title": "bad", "targets": [{"refId": "A", "expr": "sum(("}]}]}
    [result] = run_panel_queries(backfilled_prometheus.url, [board])
    assert not result.ok and "parse" in result.error


def test_troubleshooting_reads_growpage_next_to_vllm_and_dcgm():
    board = COMMITTED["growpage-troubleshooting.json"]
    exprs = " ".join(q.expr for q in panel_queries(board))
    for name in (catalog.VLLM_KV_CACHE_USAGE, catalog.VLLM_REQUESTS_WAITING, catalog.VLLM_PREEMPTIONS,
                 f"{catalog.VLLM_TTFT}_bucket", f"{catalog.VLLM_ITL}_bucket"):
        assert name in exprs, name
    assert "namespace_pod_model_name:gpu_utilization:ratio" in exprs
    # vLLM's series are another job: they are filtered by the pod and model_name, never by $job.
    for query in panel_queries(board):
        if "vllm:" in query.expr:
            assert "$job" not in query.expr and f'{catalog.MODEL_LABEL}=~"${catalog.MODEL_LABEL}"' in query.expr


def test_ratios_across_pods_are_sums_of_numerators_never_averages():
    for board in COMMITTED.values():
        for query in panel_queries(board):
            for ratio in (catalog.UTILIZATION.name, catalog.FRAGMENTATION.name, catalog.COMPRESSION_RATIO.name):
                assert f"avg({ratio}" not in query.expr.replace(" ", ""), query.panel


def test_grant_latency_panels_draw_exemplars_that_link_to_request_traces():
    """The latency panels ask Grafana for exemplars (each carries a request's trace_id), and the
    monitoring component provisions the datasource link from trace_id to the tracing backend."""
    import yaml

    for name in ("growpage-overview.json", "growpage-troubleshooting.json"):
        dashboard = json.loads((REPO_ROOT / "dashboards" / name).read_text())
        panels = [p for row in [dashboard.get("panels", [])] for p in row]
        panels += [nested for p in panels for nested in p.get("panels", [])]
        flagged = [p["title"] for p in panels for t in p.get("targets", []) if t.get("exemplar")]
        assert flagged and all("latency" in title.lower() for title in flagged), (name, flagged)
    datasource = yaml.safe_load((REPO_ROOT / "deploy" / "components" / "monitoring" / "grafana-datasource.yaml")
                                .read_text())
    provisioned = yaml.safe_load(datasource["data"]["growpage-prometheus.yaml"])["datasources"][0]
    assert provisioned["jsonData"]["exemplarTraceIdDestinations"][0]["name"] == "trace_id"
