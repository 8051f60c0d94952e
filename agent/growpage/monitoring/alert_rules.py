"""Alerting rules generated from the catalog: the three SLOs and the seed's troubleshooting checklist.

SLO alerts are per service (namespace, model_name) across its pods; checklist alerts are per pod.
Every alert carries ``severity`` (critical pages, warning makes a ticket), ``summary``,
``description`` (with the exact ``gpctl diagnose`` command for the alerting pod) and ``runbook_url``.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.config import GrowPageConfig
from growpage.monitoring import recording_rules as rec
from growpage.monitoring.promql import selector

SLO_ERROR_BUDGET = round(1 - catalog.SLO_ALLOCATION_LATENCY.objective, 10)  # 0.01
OOM_WINDOW = catalog.STRANDED_WINDOW  # an OOM or preemption counts for this long after it happened

_MODEL = catalog.MODEL_LABEL
_WHERE = f"{{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} ({{{{ $labels.{_MODEL} }}}})"
_SERVICE = f"{{{{ $labels.namespace }}}} ({{{{ $labels.{_MODEL} }}}}, all pods)"
_DIAGNOSE = ("Run: gpctl diagnose --prometheus {{ $externalURL }} --since 30m "
             "--namespace {{ $labels.namespace }} --pod {{ $labels.pod }}")
_DIAGNOSE_SERVICE = "Run: gpctl diagnose --prometheus {{ $externalURL }} --since 1h --namespace {{ $labels.namespace }}"
_PERCENT = "{{ $value | humanizePercentage }}"
_BLOCK_SIZES = ", ".join(f"{gpu} {size}" for gpu, size in catalog.RECOMMENDED_BLOCK_SIZE_BY_GPU.items())
_BASE_PAGES = GrowPageConfig().base_pages
_POD_ON = "on (namespace, pod)"  # vLLM may name the model differently: join on the pod


def _pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


@dataclasses.dataclass(frozen=True)
class AlertRule:
    """One Prometheus alerting rule plus what the runbook and the tests need to know about it.

    Attributes:
        name: the alertname; also the runbook's file name.
        expr: PromQL; the alert fires for every series it returns for ``for_duration``.
        for_duration: Prometheus ``for:``.
        severity: catalog.SEVERITY_PAGE or catalog.SEVERITY_TICKET.
        summary, description: annotations (Prometheus templates).
        dashboard_panel: title of the Troubleshooting dashboard panel to look at.
    """

    name: str
    expr: str
    for_duration: str
    severity: str
    summary: str
    description: str
    dashboard_panel: str

    @property
    def runbook_url(self) -> str:
        return f"{catalog.RUNBOOK_BASE_URL}/{self.name}.md"

    def to_dict(self, for_override: str | None = None) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": for_override or self.for_duration,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description,
                            "runbook_url": self.runbook_url},
        }


# Titles of Troubleshooting dashboard panels, shared with growpage.monitoring.dashboards.
PANEL_UTILIZATION = "1. KV page utilization per pod"
PANEL_LATENCY_P99 = "2. Page allocation latency p99 per pod"
PANEL_BURN_RATE = "2. Allocation latency SLO burn rate"
PANEL_OOM = "3. OOM and preemption events"
PANEL_FRAGMENTATION = "3. Page table fragmentation"
PANEL_COMPRESS = "Compress ratio (bytes in / bytes out)"
PANEL_THROTTLED = "Growth throttled share"
PANEL_ERRORS = "Agent errors by component"
PANEL_SCRAPE = "Scrape health (up)"
PANEL_ACTIVE = "Agent components active"


def _running(expr: str, level: str = rec.POD_LEVEL) -> str:
    # An idle pod (or service) has nothing to utilize: only running requests can breach the SLO.
    running = f"sum by ({level}) ({catalog.REQUESTS_RUNNING.name}) > 0"
    return f"{expr}\nand on ({level})\n{running}"


def _utilization_alerts() -> list[AlertRule]:
    slo, low = catalog.SLO_UTILIZATION.objective, catalog.CHECKLIST.utilization_sustained_low
    return [
        AlertRule(
            "GrowPageKVUtilizationLow", _running(f"{rec.UTILIZATION_SLO} < {slo}", rec.SLO_LEVEL),
            catalog.ALERT_FOR.utilization_below_slo, catalog.SEVERITY_TICKET,
            f"KV page utilization below the {_pct(slo)} SLO",
            f"{_SERVICE}: live KV tokens fill {_PERCENT} of the granted page slots (SLO >= {_pct(slo)}) "
            f"for {catalog.ALERT_FOR.utilization_below_slo}. Granted pages sit reserved but empty; "
            f"base_pages may be too large for this traffic. {_DIAGNOSE_SERVICE}",
            PANEL_UTILIZATION),
        # A ticket, not a page: over-granting wastes capacity but fails no request by itself. When
        # the waste does strand pages and requests get preempted, GrowPageKVPagesStranded pages.
        AlertRule(
            "GrowPageKVOverGranting", _running(f"{rec.UTILIZATION_POD} < {low}"),
            catalog.ALERT_FOR.utilization_sustained_low, catalog.SEVERITY_TICKET,
            f"KV page utilization below {_pct(low)} for {catalog.ALERT_FOR.utilization_sustained_low}",
            f"{_WHERE}: live KV tokens fill only {_PERCENT} of the granted page slots for "
            f"{catalog.ALERT_FOR.utilization_sustained_low}: base_pages is too large (default {_BASE_PAGES}) or "
            f"requests are mostly short, and the pool admits fewer requests than it could. {_DIAGNOSE}",
            PANEL_UTILIZATION),
    ]


def _compress_alert() -> AlertRule:
    target = catalog.SLO_COMPRESS_RATIO.objective
    window = catalog.COMPRESS_RATIO_RULE_WINDOW
    return AlertRule(
        "GrowPageCompressRatioLow", f"{rec.COMPRESS_RATIO} < {target}",
        catalog.ALERT_FOR.compress_ratio_below_slo, catalog.SEVERITY_TICKET,
        f"Compressions return less than {target:g}x",
        f"{_SERVICE}: compressions of the last {window} turn {{{{ $value | humanize }}}} bytes into 1 (SLO >= "
        f"{target:g}x, scales included), and have for {catalog.ALERT_FOR.compress_ratio_below_slo}. INT8 "
        f"alone cannot reach {target:g}x once per-head scales are stored; use quantization_bits=4 or let "
        f"eviction run. {_DIAGNOSE_SERVICE}",
        PANEL_COMPRESS)


def burn_rate_alert_name(speed: str) -> str:
    return f"GrowPageAllocationLatency{speed.title()}Burn"


def _burn_rate_alerts() -> list[AlertRule]:
    threshold_ms = f"{catalog.ALLOCATION_LATENCY_SLO_THRESHOLD_S * 1000:g} ms"
    alerts = []
    for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS:
        branches = []
        for burn in alert.windows:
            limit = f"({burn.factor:g} * {SLO_ERROR_BUDGET:g})"
            branches.append(f"(\n  {rec.slo_error_ratio_name(burn.long_window)} > {limit}\n"
                            f"and\n  {rec.slo_error_ratio_name(burn.short_window)} > {limit}\n)")
        windows = " or ".join(f"{b.long_window} and {b.short_window} at {b.factor:g}x"
                              for b in alert.windows)
        alerts.append(AlertRule(
            burn_rate_alert_name(alert.speed), "\nor\n".join(branches), alert.for_duration,
            alert.severity,
            f"Page allocation latency burns its error budget too fast ({alert.speed} burn)",
            f"{_SERVICE}: {_PERCENT} of page grants over the long window took longer than {threshold_ms} "
            f"(SLO: {_pct(catalog.SLO_ALLOCATION_LATENCY.objective)} under {threshold_ms}, error budget "
            f"{_pct(SLO_ERROR_BUDGET)}); budget burn over {windows} the sustainable rate. {_DIAGNOSE_SERVICE}",
            PANEL_BURN_RATE))
    return alerts


def _latency_alert() -> AlertRule:
    # A ticket naming the pod and the likely cause; the page for a latency incident is the fast
    # burn, which silences this one (Alertmanager inhibition), so one incident pages once.
    limit_s = catalog.CHECKLIST.allocation_latency_p99_critical_s
    return AlertRule(
        "GrowPageAllocationLatencyHigh", f"{rec.ALLOCATION_P99} > {limit_s}",
        catalog.ALERT_FOR.allocation_latency_p99_high, catalog.SEVERITY_TICKET,
        f"Page allocation p99 above {limit_s * 1000:g} ms",
        f"{_WHERE}: p99 page allocation latency is {{{{ $value | humanizeDuration }}}} "
        f"(> {limit_s * 1000:g} ms) for {catalog.ALERT_FOR.allocation_latency_p99_high}; decode steps "
        f"wait for pages and tail latency grows. Check the block size in use against the GPU "
        f"(GrowPage's guidance, not a vLLM rule: {_BLOCK_SIZES}). {_DIAGNOSE}",
        PANEL_LATENCY_P99)


def _fragmentation_alert() -> AlertRule:
    high, free_max = catalog.CHECKLIST.fragmentation_high, catalog.CHECKLIST.fragmentation_pool_free_max
    return AlertRule(
        "GrowPageFragmentationHigh",
        f"{rec.FRAGMENTATION_POD} > {high}\nand {_POD_ON}\n{rec.POOL_FREE} < {free_max}",
        catalog.ALERT_FOR.fragmentation_high, catalog.SEVERITY_TICKET,
        f"Page table fragmentation above {_pct(high)} while the pool runs short",
        f"{_WHERE}: {_PERCENT} of the token slots in written pages hold no live token (tail slack and "
        f"eviction holes) for {catalog.ALERT_FOR.fragmentation_high}, while fewer than {_pct(free_max)} of "
        f"the pool's pages are free: those slots are capacity new requests are waiting for. {_DIAGNOSE}",
        PANEL_FRAGMENTATION)


def _stranded_alert() -> AlertRule:
    """Requests fail (OOM, preemption) because pages are stranded, not because the GPU is full.

    Read inside the KV pool, where the failure happens: the framebuffer is no signal on vLLM, which
    reserves its KV cache at start-up and so always looks ~90 % full.
    """
    level, checklist = rec.POD_LEVEL, catalog.CHECKLIST
    increase = f"sum by ({level}) (increase({{}}[{OOM_WINDOW}])) > 0"
    failures = [increase.format(catalog.OOM_EVENTS.name),
                increase.format(selector(catalog.DECISIONS.name, decision="preempt")),
                increase.format(catalog.VLLM_PREEMPTIONS)]
    no_free_page = [f"min_over_time({rec.POOL_FREE}[{OOM_WINDOW}]) <= {checklist.pool_free_low}",
                    f"max by ({level}) (max_over_time({catalog.VLLM_KV_CACHE_USAGE}[{OOM_WINDOW}])) "
                    f">= {checklist.vllm_kv_cache_usage_full}"]
    stranded = f"max_over_time({rec.STRANDED_SLOTS}[{OOM_WINDOW}]) >= {checklist.stranded_slots_high}"
    expr = (f"(\n  {(chr(10) + 'or' + chr(10) + '  ').join(failures)}\n)\nand {_POD_ON}\n"
            f"(\n  {(chr(10) + 'or' + chr(10) + '  ').join(no_free_page)}\n)\nand {_POD_ON}\n{stranded}")
    return AlertRule(
        "GrowPageKVPagesStranded", expr, catalog.ALERT_FOR.kv_pages_stranded, catalog.SEVERITY_PAGE,
        "Requests preempted while KV pages sit stranded",
        f"{_WHERE}: {{{{ $value | humanize }}}} OOM events or preemptions in the last {OOM_WINDOW}, while the "
        f"KV pool had no free page (GrowPage's pool at most {_pct(checklist.pool_free_low)} free, or vLLM's "
        f"kv_cache_usage_perc at least {_pct(checklist.vllm_kv_cache_usage_full)}) and at least "
        f"{_pct(checklist.stranded_slots_high)} of the granted token slots held no live token: pages are lost "
        f"to reserved-but-empty grants and slack, not to a full GPU. {_DIAGNOSE}",
        PANEL_OOM)


def agent_alerts() -> list[AlertRule]:
    """The agent's own health: scraped, exporting, not failing, actually running."""
    up = selector("up", job=catalog.SCRAPE_JOB)
    build_info = selector(catalog.BUILD_INFO.name, job=catalog.SCRAPE_JOB)
    errors = (f"sum by ({rec.POD_LEVEL}, component) (increase({catalog.AGENT_ERRORS.name}[5m])) > 0")
    enabled = selector(catalog.BUILD_INFO.name, 'mode!="off"')
    inactive = (f"max by ({rec.POD_LEVEL}, component, reason) ({catalog.AGENT_ACTIVE.name} == 0)\n"
                f"and on (namespace, pod)\n"
                f"max by (namespace, pod) ({enabled})")
    return [
        AlertRule(
            "GrowPageAgentDown", f"{up} == 0", catalog.ALERT_FOR.agent_down, catalog.SEVERITY_PAGE,
            f"Prometheus cannot scrape {catalog.METRICS_PATH}",
            f"{{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}}: the {catalog.SCRAPE_JOB} target "
            f"{{{{ $labels.instance }}}} has failed every scrape for {catalog.ALERT_FOR.agent_down}: the vLLM "
            f"pod is down or its API server does not answer. Run: gpctl diagnose --endpoint "
            f"http://{{{{ $labels.instance }}}}{catalog.METRICS_PATH}",
            PANEL_SCRAPE),
        AlertRule(
            "GrowPageMetricsAbsent", f"absent({build_info})", catalog.ALERT_FOR.metrics_absent,
            catalog.SEVERITY_TICKET, "No GrowPage metrics in Prometheus",
            f"No {catalog.BUILD_INFO.name} series from job {catalog.SCRAPE_JOB} for "
            f"{catalog.ALERT_FOR.metrics_absent}: no target is scraped (ServiceMonitor selector or port), "
            f"the plugin is not loaded (VLLM_PLUGINS), or {catalog.METRICS_PATH} serves vLLM's own metrics.",
            PANEL_SCRAPE),
        AlertRule(
            "GrowPageAgentErrors", errors, catalog.ALERT_FOR.agent_errors, catalog.SEVERITY_TICKET,
            "GrowPage agent keeps catching errors",
            f"{_WHERE}: the {{{{ $labels.component }}}} component caught {{{{ $value | humanize }}}} errors in "
            f"the last 5m, and errors kept coming for {catalog.ALERT_FOR.agent_errors}. GrowPage falls back "
            f"to vLLM's default paging for the affected requests; serving continues. {_DIAGNOSE}",
            PANEL_ERRORS),
        AlertRule(
            "GrowPageAgentInactive", inactive, catalog.ALERT_FOR.agent_inactive, catalog.SEVERITY_TICKET,
            "A GrowPage component does nothing although its mode asks for it",
            f"{_WHERE}: the {{{{ $labels.component }}}} is inactive ({{{{ $labels.reason }}}}) for "
            f"{catalog.ALERT_FOR.agent_inactive} while growpage_build_info says the mode is not off: this pod "
            f"serves with vLLM's default paging and its GrowPage metrics describe nothing. {_DIAGNOSE}",
            PANEL_ACTIVE),
    ]


def _throttle_alert() -> AlertRule:
    share = catalog.CHECKLIST.throttle_saturation
    return AlertRule(
        "GrowPageGrowthThrottled", f"{rec.THROTTLED_SHARE} > {share}",
        catalog.ALERT_FOR.growth_throttled, catalog.SEVERITY_TICKET,
        f"More than {_pct(share)} of page-growth attempts are throttled",
        f"{_WHERE}: max_growth_rate refused {_PERCENT} of growth attempts for "
        f"{catalog.ALERT_FOR.growth_throttled}; requests fall back to compression or wait. Raise "
        f"max_growth_rate if the pool has free pages, or add capacity. {_DIAGNOSE}",
        PANEL_THROTTLED)


def slo_alerts() -> list[AlertRule]:
    """The seed's three SLOs, per service: utilization, compress ratio, allocation latency (burn rates)."""
    utilization_low, _ = _utilization_alerts()
    return [utilization_low, _compress_alert(), *_burn_rate_alerts()]


def checklist_alerts() -> list[AlertRule]:
    """The seed's troubleshooting checklist per pod, plus fragmentation and throttling thresholds."""
    _, over_granting = _utilization_alerts()
    return [over_granting, _latency_alert(), _fragmentation_alert(), _stranded_alert(), _throttle_alert()]


def alert_rules() -> list[AlertRule]:
    return [*slo_alerts(), *checklist_alerts(), *agent_alerts()]


def alert_names() -> list[str]:
    """Alertnames in rule order; one rule per name (promtool 2.42 mis-tests shared names)."""
    return [rule.name for rule in alert_rules()]
