"""Alerting rules generated from the catalog: the three SLOs and the seed's troubleshooting checklist.

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
OOM_WINDOW = "10m"  # an OOM or preemption counts for this long after it happened

_WHERE = "{{ $labels.namespace }}/{{ $labels.pod }} ({{ $labels.model }})"
_DIAGNOSE = ("Run: gpctl diagnose --prometheus {{ $externalURL }} --since 30m "
             "--namespace {{ $labels.namespace }} --pod {{ $labels.pod }}")
_PERCENT = "{{ $value | humanizePercentage }}"
_BLOCK_SIZES = ", ".join(f"{gpu} {size}" for gpu, size in catalog.RECOMMENDED_BLOCK_SIZE_BY_GPU.items())
_BASE_PAGES = GrowPageConfig().base_pages


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


def _running(expr: str) -> str:
    # An idle pod has nothing to utilize: only pods with running requests can breach the SLO.
    return f"{expr}\nand on (namespace, pod, model)\n{catalog.REQUESTS_RUNNING.name} > 0"


def _utilization_alerts() -> list[AlertRule]:
    slo, low = catalog.SLO_UTILIZATION.objective, catalog.CHECKLIST.utilization_sustained_low
    return [
        AlertRule(
            "GrowPageKVUtilizationLow", _running(f"{catalog.UTILIZATION.name} < {slo}"),
            catalog.ALERT_FOR.utilization_below_slo, catalog.SEVERITY_TICKET,
            f"KV page utilization below the {_pct(slo)} SLO",
            f"{_WHERE}: live KV tokens fill {_PERCENT} of the granted page slots (SLO >= {_pct(slo)}) "
            f"for {catalog.ALERT_FOR.utilization_below_slo}. Granted pages sit reserved but empty; "
            f"base_pages may be too large for this traffic. {_DIAGNOSE}",
            PANEL_UTILIZATION),
        AlertRule(
            "GrowPageKVUtilizationCritical", _running(f"{catalog.UTILIZATION.name} < {low}"),
            catalog.ALERT_FOR.utilization_sustained_low, catalog.SEVERITY_PAGE,
            f"KV page utilization below {_pct(low)} for {catalog.ALERT_FOR.utilization_sustained_low}",
            f"{_WHERE}: live KV tokens fill only {_PERCENT} of the granted page slots for "
            f"{catalog.ALERT_FOR.utilization_sustained_low}: base_pages is too large (default {_BASE_PAGES}) or "
            f"requests are mostly short, and the pool admits fewer requests than it could. {_DIAGNOSE}",
            PANEL_UTILIZATION),
    ]


def _compress_alert() -> AlertRule:
    target = catalog.SLO_COMPRESS_RATIO.objective
    return AlertRule(
        "GrowPageCompressRatioLow", f"{rec.COMPRESS_RATIO} < {target}",
        catalog.ALERT_FOR.compress_ratio_below_slo, catalog.SEVERITY_TICKET,
        f"Compressions return less than {target:g}x",
        f"{_WHERE}: compressions turn {{{{ $value | humanize }}}} bytes into 1 (SLO >= {target:g}x, scales "
        f"included) for {catalog.ALERT_FOR.compress_ratio_below_slo}. INT8 alone cannot reach {target:g}x "
        f"once per-head scales are stored; use quantization_bits=4 or let eviction run. {_DIAGNOSE}",
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
            f"{_WHERE}: {_PERCENT} of page grants over the long window took longer than {threshold_ms} "
            f"(SLO: {_pct(catalog.SLO_ALLOCATION_LATENCY.objective)} under {threshold_ms}, error budget "
            f"{_pct(SLO_ERROR_BUDGET)}); budget burn over {windows} the sustainable rate. {_DIAGNOSE}",
            PANEL_BURN_RATE))
    return alerts


def _latency_alert() -> AlertRule:
    limit_s = catalog.CHECKLIST.allocation_latency_p99_critical_s
    return AlertRule(
        "GrowPageAllocationLatencyHigh", f"{rec.ALLOCATION_P99} > {limit_s}",
        catalog.ALERT_FOR.allocation_latency_p99_high, catalog.SEVERITY_PAGE,
        f"Page allocation p99 above {limit_s * 1000:g} ms",
        f"{_WHERE}: p99 page allocation latency is {{{{ $value | humanizeDuration }}}} "
        f"(> {limit_s * 1000:g} ms) for {catalog.ALERT_FOR.allocation_latency_p99_high}; decode steps "
        f"wait for pages and tail latency grows. Check the block size in use against the GPU "
        f"(GrowPage's guidance, not a vLLM rule: {_BLOCK_SIZES}). {_DIAGNOSE}",
        PANEL_LATENCY_P99)


def _fragmentation_alert() -> AlertRule:
    high = catalog.CHECKLIST.fragmentation_high
    return AlertRule(
        "GrowPageFragmentationHigh", f"{catalog.FRAGMENTATION.name} > {high}",
        catalog.ALERT_FOR.fragmentation_high, catalog.SEVERITY_TICKET,
        f"Page table fragmentation above {_pct(high)}",
        f"{_WHERE}: {_PERCENT} of the token slots in used pages hold no live token (tail slack and "
        f"eviction holes) for {catalog.ALERT_FOR.fragmentation_high}; the pool runs out of pages "
        f"while the GPU still has memory. {_DIAGNOSE}",
        PANEL_FRAGMENTATION)


def _oom_alert() -> AlertRule:
    level = "namespace, pod, model"
    ooms = f"sum by ({level}) (increase({catalog.OOM_EVENTS.name}[{OOM_WINDOW}])) > 0"
    preempts = (f"sum by ({level}) (increase({selector(catalog.DECISIONS.name, decision='preempt')}"
                f"[{OOM_WINDOW}])) > 0")
    gpu_low = catalog.CHECKLIST.gpu_framebuffer_used_low
    return AlertRule(
        "GrowPageOOMWithFreeGPUMemory",
        f"(\n  {ooms}\nor\n  {preempts}\n)\nand on (namespace, pod)\n{rec.GPU_FRAMEBUFFER_USED} < {gpu_low}",
        catalog.ALERT_FOR.oom_with_free_gpu_memory, catalog.SEVERITY_PAGE,
        f"KV OOM or preemption while GPU memory is below {_pct(gpu_low)} used",
        f"{_WHERE}: {{{{ $value | humanize }}}} page-allocation failures (OOM or preemption) in the "
        f"last {OOM_WINDOW} while DCGM shows the GPU framebuffer under {_pct(gpu_low)} used: pages are "
        f"lost to fragmentation or reserved-but-empty grants, not to a full GPU. {_DIAGNOSE}",
        PANEL_OOM)


def agent_alerts() -> list[AlertRule]:
    """The agent's own health: scraped, exporting, not failing."""
    up = selector("up", job=catalog.SCRAPE_JOB)
    build_info = selector(catalog.BUILD_INFO.name, job=catalog.SCRAPE_JOB)
    errors = f"sum by (namespace, pod, model, component) (increase({catalog.AGENT_ERRORS.name}[5m])) > 0"
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
    """The seed's three SLOs: utilization, compress ratio, allocation latency (burn rates)."""
    utilization_low, _ = _utilization_alerts()
    return [utilization_low, _compress_alert(), *_burn_rate_alerts()]


def checklist_alerts() -> list[AlertRule]:
    """The seed's troubleshooting checklist, plus fragmentation and throttling thresholds."""
    _, utilization_critical = _utilization_alerts()
    return [utilization_critical, _latency_alert(), _fragmentation_alert(), _oom_alert(),
            _throttle_alert()]


def alert_rules() -> list[AlertRule]:
    return [*slo_alerts(), *checklist_alerts(), *agent_alerts()]


def alert_names() -> list[str]:
    """Alertnames in rule order; one rule per name (promtool 2.42 mis-tests shared names)."""
    return [rule.name for rule in alert_rules()]
