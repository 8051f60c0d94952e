"""``GrowPage / Troubleshooting``: the seed's checklist, in its order; every panel links a runbook."""

from __future__ import annotations

from growpage import catalog
from growpage.monitoring import alert_rules as alerts
from growpage.monitoring import recording_rules as rec
from growpage.monitoring.alert_rules import SLO_ERROR_BUDGET
from growpage.monitoring.dashboards.common import (
    POD_FILTER,
    RATE,
    RATIO_UNIT,
    SECONDS_UNIT,
    TIMES_UNIT,
    Cell,
    dashboard,
    metric,
    runbook_links,
    steps,
    table,
    targets,
    timeseries,
)

UID = "growpage-troubleshooting"
TITLE = "GrowPage / Troubleshooting"
_POD_LEGEND = "{{namespace}}/{{pod}}"
_BLOCK_SIZES = ", ".join(f"{gpu} -> {size}" for gpu, size in catalog.RECOMMENDED_BLOCK_SIZE_BY_GPU.items())


def _runbooks_for(panel_title: str, *extra: str) -> str:
    """Runbooks of the alerts that point at this panel, then ``extra`` ones."""
    names = [rule.name for rule in alerts.alert_rules() if rule.dashboard_panel == panel_title]
    return runbook_links(*dict.fromkeys([*names, *extra]))


def _settings_table() -> Cell:
    info = catalog.BUILD_INFO
    expr = f"max by (namespace, pod, model, {', '.join(info.labels)}) ({metric(info.name)})"
    organize = [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}]
    return Cell(table(
        "Settings in use (growpage_build_info)",
        "What each pod runs: mode, block_size, base_pages, device and versions. Read the block size here "
        f"instead of assuming it. GrowPage's block-size guidance (not a vLLM rule): {_BLOCK_SIZES}. "
        f"vLLM releases do not contain GrowPage; the plugin needs vLLM >= {catalog.MIN_SUPPORTED_VLLM_VERSION}. "
        + runbook_links("GrowPageKVUtilizationCritical", "GrowPageAllocationLatencyHigh"),
        expr, organize), 24, 6)


def _utilization_row() -> list[Cell]:
    low, slo = catalog.CHECKLIST.utilization_sustained_low, catalog.SLO_UTILIZATION.objective
    tokens = catalog.REQUEST_TOKENS.name
    quantile = "histogram_quantile({}, sum by (le) (rate({}[{}])))"
    return [
        Cell(timeseries(alerts.PANEL_UTILIZATION,
                        f"Below {low:.0%} for a sustained period: base_pages is too large, or requests are "
                        f"mostly short. " + _runbooks_for(alerts.PANEL_UTILIZATION),
                        targets((metric(catalog.UTILIZATION.name), _POD_LEGEND)), RATIO_UNIT,
                        steps("red", (low, "yellow"), (slo, "green"))), 12),
        Cell(timeseries("1. Request length (tokens)",
                        "Prompt + generated tokens per finished request. Compare with base_pages x block_size "
                        "from the settings table: a grant far above p95 is wasted. "
                        + runbook_links("GrowPageKVUtilizationCritical"),
                        targets((quantile.format(0.5, metric(f"{tokens}_bucket"), RATE), "p50"),
                                (quantile.format(0.95, metric(f"{tokens}_bucket"), RATE), "p95")),
                        "short"), 12),
    ]


def _latency_row() -> list[Cell]:
    limit_s = catalog.CHECKLIST.allocation_latency_p99_critical_s
    p99 = (f"histogram_quantile(0.99, sum by (namespace, pod, le) "
           f"(rate({metric(f'{catalog.ALLOCATION_LATENCY.name}_bucket')}[{RATE}])))")
    burn_targets = []
    for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS:
        for burn in alert.windows:
            burn_targets.append((f"{metric(rec.slo_error_ratio_name(burn.long_window))} / {SLO_ERROR_BUDGET:g}",
                                 f"{burn.long_window} {_POD_LEGEND}"))
    factors = sorted({burn.factor for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS
                      for burn in alert.windows})
    return [
        Cell(timeseries(alerts.PANEL_LATENCY_P99,
                        f"Above {limit_s * 1000:g} ms: check block_size against the GPU in the settings table. "
                        + _runbooks_for(alerts.PANEL_LATENCY_P99),
                        targets((p99, _POD_LEGEND)), SECONDS_UNIT,
                        steps("green", (catalog.ALLOCATION_LATENCY_SLO_THRESHOLD_S, "yellow"), (limit_s, "red"))),
             12),
        Cell(timeseries(alerts.PANEL_BURN_RATE,
                        "How many times faster than sustainable each window spends the latency error budget "
                        f"(1 = the budget lasts exactly {catalog.SLO_COMPLIANCE_WINDOW}). "
                        + _runbooks_for(alerts.PANEL_BURN_RATE),
                        targets(*burn_targets), TIMES_UNIT,
                        steps("green", (factors[0], "yellow"), (factors[-1], "red"))), 12),
    ]


def _oom_row() -> list[Cell]:
    gpu_low = catalog.CHECKLIST.gpu_framebuffer_used_low
    increase = "sum by (namespace, pod) (increase({}[{}]))"
    preempts = metric(catalog.DECISIONS.name, 'decision="preempt"')
    dcgm_labels = ", ".join(f"{source} -> {target}" for target, source in catalog.DCGM_EXPORTED_LABELS.items())
    return [
        Cell(timeseries(alerts.PANEL_OOM,
                        f"Allocation failures. Together with GPU memory below {gpu_low:.0%} they point at "
                        "fragmentation, not a full GPU. " + _runbooks_for(alerts.PANEL_OOM),
                        targets((increase.format(metric(catalog.OOM_EVENTS.name), RATE), f"OOM {_POD_LEGEND}"),
                                (increase.format(preempts, RATE), f"preempt {_POD_LEGEND}")),
                        "short", bars=True), 8),
        Cell(timeseries("3. GPU framebuffer used (DCGM)",
                        f"{catalog.DCGM_FB_USED} / (used + free) from NVIDIA's DCGM exporter, "
                        f"joined on namespace/pod ({dcgm_labels} when the exporter is scraped without "
                        "honorLabels). Empty without the DCGM exporter. " + _runbooks_for(alerts.PANEL_OOM),
                        targets((f"{rec.GPU_FRAMEBUFFER_USED}{{{POD_FILTER}}}", _POD_LEGEND)), RATIO_UNIT,
                        steps("green", (gpu_low, "red"))), 8),
        Cell(timeseries(alerts.PANEL_FRAGMENTATION, catalog.FRAGMENTATION.help + " "
                        + _runbooks_for(alerts.PANEL_FRAGMENTATION),
                        targets((metric(catalog.FRAGMENTATION.name), _POD_LEGEND)), RATIO_UNIT,
                        steps("green", (catalog.CHECKLIST.fragmentation_high, "red"))), 8),
    ]


def _more_checks_row() -> list[Cell]:
    errors = f"sum by (namespace, pod, component) (increase({metric(catalog.AGENT_ERRORS.name)}[{RATE}]))"
    up = f'up{{job="{catalog.SCRAPE_JOB}", {POD_FILTER}}}'
    return [
        Cell(timeseries(alerts.PANEL_COMPRESS, _runbooks_for(alerts.PANEL_COMPRESS),
                        targets((metric(rec.COMPRESS_RATIO), _POD_LEGEND)), TIMES_UNIT,
                        steps("red", (catalog.SLO_COMPRESS_RATIO.objective, "green"))), 6),
        Cell(timeseries(alerts.PANEL_THROTTLED, "Share of growth attempts refused by max_growth_rate. "
                        + _runbooks_for(alerts.PANEL_THROTTLED),
                        targets((metric(rec.THROTTLED_SHARE), _POD_LEGEND)), RATIO_UNIT,
                        steps("green", (catalog.CHECKLIST.throttle_saturation, "red"))), 6),
        Cell(timeseries(alerts.PANEL_ERRORS, catalog.AGENT_ERRORS.help + " " + _runbooks_for(alerts.PANEL_ERRORS),
                        targets((errors, "{{component}} " + _POD_LEGEND)), "short", bars=True), 6),
        Cell(timeseries(alerts.PANEL_SCRAPE, f"1 when Prometheus scrapes {catalog.METRICS_PATH}, 0 when it fails. "
                        + _runbooks_for(alerts.PANEL_SCRAPE),
                        targets((up, _POD_LEGEND)), "short", steps("red", (1.0, "green"))), 6),
    ]


def troubleshooting_dashboard() -> dict:
    return dashboard(TITLE, UID, "The seed's troubleshooting checklist, in order; each panel links its runbook.", [
        ("Settings in use", [_settings_table()]),
        (f"1. Utilization below {catalog.CHECKLIST.utilization_sustained_low:.0%} for long: "
         "base_pages too large, or requests mostly short", _utilization_row()),
        (f"2. Allocation latency above {catalog.CHECKLIST.allocation_latency_p99_critical_s * 1000:g} ms: "
         "block size vs GPU", _latency_row()),
        (f"3. OOM while GPU memory is below {catalog.CHECKLIST.gpu_framebuffer_used_low:.0%} used: "
         "fragmentation", _oom_row()),
        ("More checks: compression, throttling, the agent itself", _more_checks_row()),
    ])
