"""``GrowPage / Troubleshooting``: the troubleshooting checklist, in its order; every panel links a runbook."""

from __future__ import annotations

from grafanalib import core as g

from growpage import catalog
from growpage.monitoring import alert_rules as alerts
from growpage.monitoring import recording_rules as rec
from growpage.monitoring.alert_rule import TROUBLESHOOTING_DASHBOARD
from growpage.monitoring.dashboards.common import (
    POD_FILTER,
    RATE,
    RATIO_UNIT,
    SECONDS_UNIT,
    TIMES_UNIT,
    VLLM_FILTER,
    Cell,
    dashboard,
    metric,
    rule,
    runbook_links,
    steps,
    table,
    target,
    targets,
    timeseries,
)
from growpage.monitoring.dashboards.fleet import load_panel
from growpage.monitoring.promql import selector

UID = "growpage-troubleshooting"
PANEL_VLLM_QUEUE_E2E = "vLLM queue time / end-to-end latency p99"
PANEL_OBSERVED_SHARE = alerts.PANEL_OBSERVED_SHARE
PANEL_OWN_SHARE = alerts.PANEL_OWN_SHARE
TITLE = TROUBLESHOOTING_DASHBOARD
_POD_LEGEND = "{{namespace}}/{{pod}}"
_BLOCK_SIZES = ", ".join(f"{gpu} -> {size}" for gpu, size in catalog.RECOMMENDED_BLOCK_SIZE_BY_GPU.items())


def _runbooks_for(panel_title: str, *extra: str) -> str:
    """Runbooks of the alerts that point at this panel, then ``extra`` ones."""
    names = [rule.name for rule in alerts.alert_rules() if rule.dashboard_panel == panel_title]
    return runbook_links(*dict.fromkeys([*names, *extra]))


def _settings_table() -> Cell:
    info = catalog.BUILD_INFO
    expr = f"max by ({rec.POD_LEVEL}, {', '.join(info.exported_labels)}) ({metric(info.name)})"
    organize = [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}]
    return Cell(table(
        "Settings in use (growpage_build_info)",
        "What each pod runs: mode, block_size, base_pages, device and versions. Read the block size here "
        f"instead of assuming it. GrowPage's block-size guidance (not a vLLM rule): {_BLOCK_SIZES}. "
        f"vLLM releases do not contain GrowPage; the plugin needs vLLM >= {catalog.MIN_SUPPORTED_VLLM_VERSION}. "
        + runbook_links("GrowPageKVOverGranting", "GrowPageAllocationLatencyHigh"),
        expr, organize), 24, 6)


def _utilization_row(t: catalog.MixinThresholds) -> list[Cell]:
    low, slo = t.checklist.utilization_sustained_low, t.utilization_objective
    tokens = catalog.REQUEST_TOKENS.name
    quantile = "histogram_quantile({}, sum by (le) (rate({}[{}])))"
    return [
        Cell(timeseries(alerts.PANEL_UTILIZATION,
                        f"Below {low:.0%} for a sustained period. Reference engine (base_pages is an admission "
                        f"grant): base_pages is too large, or requests are mostly short. Inside vLLM (pages "
                        f"granted on demand, granted = used, base_pages a compaction floor, prefix-shared blocks "
                        f"counted once): the empty slots are tail slack and eviction holes, see fragmentation. "
                        + _runbooks_for(alerts.PANEL_UTILIZATION),
                        targets((metric(catalog.UTILIZATION.name), _POD_LEGEND)), RATIO_UNIT,
                        steps("red", (low, "yellow"), (slo, "green"))), 12),
        Cell(timeseries("1. Request length (tokens)",
                        "Prompt + generated tokens per finished request. Reference engine: compare with "
                        "base_pages x block_size from the settings table, a grant far above p95 is wasted "
                        "(inside vLLM base_pages is a floor, not a grant). "
                        + runbook_links("GrowPageKVOverGranting"),
                        targets((quantile.format(0.5, metric(f"{tokens}_bucket"), RATE), "p50"),
                                (quantile.format(0.95, metric(f"{tokens}_bucket"), RATE), "p95")),
                        "short"), 12),
    ]


def _latency_row(t: catalog.MixinThresholds) -> list[Cell]:
    limit_s = t.checklist.allocation_latency_p99_critical_s
    budget = round(1 - t.allocation_latency_objective, 10)
    p99 = (f"histogram_quantile(0.99, sum by (namespace, pod, le) "
           f"(rate({metric(f'{catalog.ALLOCATION_LATENCY.name}_bucket')}[{RATE}])))")
    burn_targets = []
    for alert in t.burn_rate_alerts:
        for burn in alert.windows:
            burn_targets.append((f"{rule(rec.slo_error_ratio_name(burn.long_window), service=True)} "
                                 f"/ {budget:g}",
                                 f"{burn.long_window} {{{{namespace}}}} ({{{{model_name}}}})"))
    factors = sorted({burn.factor for alert in t.burn_rate_alerts for burn in alert.windows})
    return [
        Cell(timeseries(alerts.PANEL_LATENCY_P99,
                        f"Above {limit_s * 1000:g} ms: check block_size against the GPU in the settings table. "
                        + _runbooks_for(alerts.PANEL_LATENCY_P99),
                        [target(p99, _POD_LEGEND, exemplar=True)], SECONDS_UNIT,
                        steps("green", (t.allocation_latency_s, "yellow"), (limit_s, "red"))),
             12),
        Cell(timeseries(alerts.PANEL_BURN_RATE,
                        "How many times faster than sustainable each window spends the latency error budget "
                        f"(1 = the budget lasts exactly {catalog.SLO_COMPLIANCE_WINDOW}). "
                        + _runbooks_for(alerts.PANEL_BURN_RATE),
                        targets(*burn_targets), TIMES_UNIT,
                        steps("green", (factors[0], "yellow"), (factors[-1], "red"))), 12),
    ]


def _oom_row(t: catalog.MixinThresholds) -> list[Cell]:
    limits = t.checklist
    increase = "sum by (namespace, pod) (increase({}[{}]))"
    preempts = metric(catalog.DECISIONS.name, 'decision="preempt"')
    vllm_preempts = selector(catalog.VLLM_PREEMPTIONS, VLLM_FILTER)
    return [
        Cell(timeseries(alerts.PANEL_OOM,
                        "Allocation failures, GrowPage's and vLLM's own preemptions. With no free page and "
                        "stranded slots (next panels) they mean pages are lost to grants and slack, not to a "
                        "full GPU. " + _runbooks_for(alerts.PANEL_OOM),
                        targets((increase.format(metric(catalog.OOM_EVENTS.name), RATE), f"OOM {_POD_LEGEND}"),
                                (increase.format(preempts, RATE), f"preempt {_POD_LEGEND}"),
                                (increase.format(vllm_preempts, RATE), f"vLLM preempt {_POD_LEGEND}")),
                        "short", bars=True), 8),
        Cell(timeseries("3. Free pages and stranded slots",
                        f"Free share of the pool (alert at or under {limits.pool_free_low:.0%}) and share of "
                        "granted token slots holding no live token (reserved-but-unwritten pages in the reference "
                        "engine; tail slack and eviction holes in both homes; inside vLLM nothing is reserved; "
                        f"alert at or above {limits.stranded_slots_high:.0%}). "
                        + _runbooks_for(alerts.PANEL_OOM),
                        targets((rule(rec.POOL_FREE), f"free {_POD_LEGEND}"),
                                (rule(rec.STRANDED_SLOTS), f"stranded {_POD_LEGEND}")),
                        RATIO_UNIT), 8),
        Cell(timeseries(alerts.PANEL_FRAGMENTATION, catalog.FRAGMENTATION.help + " "
                        + _runbooks_for(alerts.PANEL_FRAGMENTATION),
                        targets((rule(rec.FRAGMENTATION_POD), _POD_LEGEND)), RATIO_UNIT,
                        steps("green", (limits.fragmentation_high, "red"))), 8),
    ]


def _users_row(t: catalog.MixinThresholds) -> list[Cell]:
    """What vLLM's users feel, as the pages read it: each SLO's error budget burn per long window,
    next to GrowPage's view of the same pods (compression headroom, denied growth)."""
    burn_targets = []
    objectives = [(slo.name, slo.objective) for slo in t.vllm_latency_slos]
    objectives.append((t.vllm_availability_slo.name, t.vllm_availability_slo.objective))
    for name, objective in objectives:
        budget = round(1 - objective, 10)
        for alert in t.burn_rate_alerts:
            for burn in alert.windows:
                ratio = rule(rec.vllm_error_ratio_name(name, burn.long_window), service=True)
                burn_targets.append((f"{ratio} / {budget:g}",
                                     f"{name} {burn.long_window} {{{{namespace}}}} ({{{{model_name}}}})"))
    factors = sorted({burn.factor for alert in t.burn_rate_alerts for burn in alert.windows})

    def p99(histogram: str) -> str:
        return (f"histogram_quantile(0.99, sum by (namespace, pod, le) "
                f"(rate({selector(f'{histogram}_bucket', VLLM_FILTER)}[{RATE}])))")

    return [
        Cell(timeseries(alerts.PANEL_VLLM_BURN_RATE,
                        "vLLM's time to first token, inter-token latency and availability (finished requests "
                        "neither aborted nor failed): how many times faster than sustainable each long window "
                        f"spends the error budget (1 = the budget lasts {catalog.SLO_COMPLIANCE_WINDOW}). Every "
                        "vLLM pod counts, whatever GrowPage's mode or health. "
                        + _runbooks_for(alerts.PANEL_VLLM_BURN_RATE),
                        targets(*burn_targets), TIMES_UNIT,
                        steps("green", (factors[0], "yellow"), (factors[-1], "red"))), 12),
        Cell(timeseries(PANEL_VLLM_QUEUE_E2E,
                        f"Time requests wait before vLLM first schedules them ({catalog.VLLM_QUEUE_TIME}: "
                        "waiting for KV blocks or a batch slot) and from arrival to their last token "
                        f"({catalog.VLLM_E2E_LATENCY}), p99 per pod. Queue time is the share of TTFT that "
                        "KV capacity decides. " + runbook_links("GrowPageVLLMTimeToFirstTokenFastBurn"),
                        targets((p99(catalog.VLLM_QUEUE_TIME), f"queue {_POD_LEGEND}"),
                                (p99(catalog.VLLM_E2E_LATENCY), f"end-to-end {_POD_LEGEND}")), SECONDS_UNIT), 12),
        Cell(timeseries("GrowPage's view: compression headroom and denied growth",
                        "Page boundaries resolved by compressing instead of growing (in mode monitor: that "
                        "enforce would resolve so) and growth denied for want of pages, per second. Headroom "
                        "with users burning budget: enforce can help; denied growth: the KV cache is full. "
                        + runbook_links("GrowPageKVPagesStranded"),
                        targets((rule(rec.COMPRESS_DECISIONS_RATE), f"compress {_POD_LEGEND}"),
                                (rule(rec.DENIED_RATE), f"denied {_POD_LEGEND}")), "ops"), 12),
    ]


def _vllm_row(t: catalog.MixinThresholds) -> list[Cell]:
    """GrowPage next to vLLM's own metrics and the GPU, joined on the pod (and model_name)."""
    def vllm(name: str) -> str:
        return selector(name, VLLM_FILTER)

    def quantile(histogram: str, q: float) -> str:
        return f"histogram_quantile({q}, sum by (namespace, pod, le) (rate({vllm(f'{histogram}_bucket')}[{RATE}])))"

    granted = metric(catalog.POOL_PAGES.name, 'state=~"reserved|used"')
    pool_used = f"sum by (namespace, pod) ({granted})\n/\nsum by (namespace, pod) ({metric(catalog.POOL_PAGES.name)})"
    dcgm = "DCGM exporter series, joined on the pod that uses the GPU (exported_namespace/exported_pod)."
    runbook = runbook_links("GrowPageKVPagesStranded")
    return [
        Cell(timeseries("vLLM KV cache usage vs GrowPage pool",
                        f"vLLM's {catalog.VLLM_KV_CACHE_USAGE} next to the share of GrowPage's pool that is "
                        f"granted (reserved + used). {runbook}",
                        targets((f"max by (namespace, pod) ({vllm(catalog.VLLM_KV_CACHE_USAGE)})",
                                 f"vLLM {_POD_LEGEND}"), (pool_used, f"GrowPage {_POD_LEGEND}")),
                        RATIO_UNIT, steps("green", (t.checklist.vllm_kv_cache_usage_full, "red"))), 8),
        Cell(timeseries("vLLM requests running / waiting",
                        f"{catalog.VLLM_REQUESTS_RUNNING} and {catalog.VLLM_REQUESTS_WAITING}: a queue while "
                        f"pages are stranded is capacity GrowPage holds back. {runbook}",
                        targets((f"sum by (namespace, pod) ({vllm(catalog.VLLM_REQUESTS_RUNNING)})",
                                 f"running {_POD_LEGEND}"),
                                (f"sum by (namespace, pod) ({vllm(catalog.VLLM_REQUESTS_WAITING)})",
                                 f"waiting {_POD_LEGEND}")), "short"), 8),
        Cell(timeseries(alerts.PANEL_VLLM_PREEMPTIONS,
                        f"rate({catalog.VLLM_PREEMPTIONS}): vLLM evicting running requests for want of KV "
                        f"blocks. " + _runbooks_for(alerts.PANEL_VLLM_PREEMPTIONS, "GrowPageKVPagesStranded"),
                        targets((f"sum by (namespace, pod) (rate({vllm(catalog.VLLM_PREEMPTIONS)}[{RATE}]))",
                                 _POD_LEGEND)), "ops"), 8),
        Cell(timeseries(alerts.PANEL_VLLM_LATENCY,
                        "What users feel: GrowPage's grant latency adds to both. "
                        + _runbooks_for(alerts.PANEL_VLLM_LATENCY, "GrowPageVLLMTimeToFirstTokenFastBurn",
                                       "GrowPageAllocationLatencyHigh"),
                        targets((quantile(catalog.VLLM_TTFT, 0.99), f"TTFT {_POD_LEGEND}"),
                                (quantile(catalog.VLLM_ITL, 0.99), f"ITL {_POD_LEGEND}")), SECONDS_UNIT), 8),
        Cell(timeseries("GPU utilization (DCGM)", f"{catalog.DCGM_GPU_UTIL} / 100. {dcgm} {runbook}",
                        targets((rule(rec.GPU_UTILIZATION), _POD_LEGEND)), RATIO_UNIT), 8),
        Cell(timeseries("GPU framebuffer used (DCGM)",
                        f"{catalog.DCGM_FB_USED} / (used + free). vLLM reserves its KV cache at start-up "
                        "(gpu_memory_utilization), so this sits near that setting whatever the pool does: "
                        f"context, not an OOM signal. {dcgm} {runbook}",
                        targets((rule(rec.GPU_FRAMEBUFFER_USED), _POD_LEGEND)),
                        RATIO_UNIT), 8),
    ]


def _share_of_steps(counter: str, legend: str) -> tuple[str, str]:
    """A target: the vLLM home's ``counter`` of engine steps over its steps with a tracked request."""
    return (f"sum by (namespace, pod) (rate({metric(counter)}[{RATE}]))"
            f"\n/\nsum by (namespace, pod) (rate({metric(catalog.VLLM_STEPS.name)}[{RATE}]))",
            f"{legend} {_POD_LEGEND}")


def _observed_share_panel() -> g.TimeSeries:
    return timeseries(PANEL_OBSERVED_SHARE,
                      "Inside vLLM: engine steps whose attention GrowPage observed over steps with a tracked "
                      "request, and finished requests observed at least once over those tracked. Below 1 "
                      "by design: 1 / observe_every_steps (monitor observes one step in 4 by default), "
                      "whatever the CUDA graphs; at 0 while the observer reports active, its decisions rank "
                      "by recency alone. And the steps whose pool held every request at its full length: "
                      "there enforce grows instead of compressing and observes only prompt ends "
                      "(grow_with_room_for_all), so fewer steps observed and no compactions mean nothing "
                      "to win, not a fault; likewise the steps its compression gate left decode-time "
                      "compression idle, because compactions had bought neither a wider batch nor a dear "
                      "recompute (compression_gate). " + _runbooks_for(PANEL_OBSERVED_SHARE, "GrowPageAgentInactive"),
                      targets(_share_of_steps(catalog.VLLM_OBSERVED_STEPS.name, "steps"),
                              (f"sum by (namespace, pod) (rate({metric(catalog.VLLM_OBSERVED_REQUESTS.name)}"
                               f"[{RATE}]))\n/\nsum by (namespace, pod) "
                               f"(rate({metric(catalog.VLLM_TRACKED_REQUESTS.name)}[{RATE}]))",
                               f"requests {_POD_LEGEND}"),
                              _share_of_steps(catalog.VLLM_ROOM_STEPS.name, "room for all"),
                              _share_of_steps(catalog.VLLM_IDLE_STEPS.name, "compression idle")), RATIO_UNIT)


def _more_checks_row(t: catalog.MixinThresholds) -> list[Cell]:
    errors = f"sum by (namespace, pod, component) (increase({metric(catalog.AGENT_ERRORS.name)}[{RATE}]))"
    up = f'up{{job="{catalog.SCRAPE_JOB}", {POD_FILTER}}}'
    return [
        Cell(timeseries(alerts.PANEL_COMPRESS, _runbooks_for(alerts.PANEL_COMPRESS),
                        targets((rule(rec.COMPRESS_RATIO, service=True), "{{namespace}} ({{model_name}})")), TIMES_UNIT,
                        steps("red", (t.compress_ratio_objective, "green"))), 6),
        Cell(timeseries(alerts.PANEL_THROTTLED, "Share of growth attempts refused by max_growth_rate. "
                        + _runbooks_for(alerts.PANEL_THROTTLED),
                        targets((rule(rec.THROTTLED_SHARE), _POD_LEGEND)), RATIO_UNIT,
                        steps("green", (t.checklist.throttle_saturation, "red"))), 6),
        Cell(timeseries(alerts.PANEL_ERRORS, catalog.AGENT_ERRORS.help + " " + _runbooks_for(alerts.PANEL_ERRORS),
                        targets((errors, "{{component}} " + _POD_LEGEND)), "short", bars=True), 6),
        Cell(timeseries(alerts.PANEL_SCRAPE, f"1 when Prometheus scrapes {catalog.METRICS_PATH}, 0 when it fails. "
                        + _runbooks_for(alerts.PANEL_SCRAPE),
                        targets((up, _POD_LEGEND)), "short", steps("red", (1.0, "green"))), 6),
        Cell(timeseries(alerts.PANEL_ACTIVE, catalog.AGENT_ACTIVE.help + " "
                        + _runbooks_for(alerts.PANEL_ACTIVE),
                        targets((f"max by (namespace, pod, component, reason) ({metric(catalog.AGENT_ACTIVE.name)})",
                                 "{{component}} {{reason}} " + _POD_LEGEND)), "short",
                        steps("red", (1.0, "green"))), 12),
        Cell(_observed_share_panel(), 12),
        Cell(timeseries(PANEL_OWN_SHARE,
                        "Inside vLLM: seconds of GrowPage's own code (observation, compaction, decisions, "
                        "forecast) over the seconds of the vLLM calls it hooks, per side and in all: what "
                        "GrowPage costs each step, to weigh against the preemptions it avoids. A few percent at "
                        "the shipped sampling; above the line `gpctl diagnose` warns (observe less). Host "
                        "time: on a GPU its kernels run asynchronously and are not in it. "
                        + _runbooks_for(PANEL_OWN_SHARE, "GrowPageAgentErrors"),
                        targets((f"sum by (namespace, pod, side) (rate({metric(catalog.VLLM_OWN_SECONDS.name)}"
                                 f"[{RATE}]))\n/\nsum by (namespace, pod, side) "
                                 f"(rate({metric(catalog.VLLM_STEP_SECONDS.name)}[{RATE}]))",
                                 "{{side}} " + _POD_LEGEND),
                                (f"sum by (namespace, pod) (rate({metric(catalog.VLLM_OWN_SECONDS.name)}[{RATE}]))"
                                 f"\n/\nsum by (namespace, pod) (rate({metric(catalog.VLLM_STEP_SECONDS.name)}"
                                 f"[{RATE}]))", f"all {_POD_LEGEND}")), RATIO_UNIT,
                        steps("green", (t.checklist.own_share_high, "orange"))), 12),
        Cell(load_panel(t), 12),  # a fleet behind vLLM's router: GrowPage / Fleet has the rest
    ]


def troubleshooting_dashboard(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict:
    """The dashboard with the thresholds ``t`` (row titles, descriptions and threshold lines)."""
    return dashboard(TITLE, UID, "The troubleshooting checklist, in order; each panel links its runbook.", [
        ("Settings in use", [_settings_table()]),
        ("What users feel: vLLM's latency SLOs, and GrowPage's view", _users_row(t)),
        (f"1. Utilization below {t.checklist.utilization_sustained_low:.0%} for long: "
         "base_pages too large, or requests mostly short", _utilization_row(t)),
        (f"2. Allocation latency above {t.checklist.allocation_latency_p99_critical_s * 1000:g} ms: "
         "block size vs GPU", _latency_row(t)),
        ("3. OOM or preemption while pages are stranded: no free page, most granted slots empty",
         _oom_row(t)),
        ("vLLM and the GPU, next to GrowPage", _vllm_row(t)),
        ("More checks: compression, throttling, the agent itself", _more_checks_row(t)),
    ])
