"""Alerting rules generated from the catalog: what vLLM users feel, GrowPage's SLOs and its checklist.

Pages are few and about users: vLLM's own time to first token and inter-token latency burning
their error budgets, requests preempted while KV pages sit stranded, and a pod whose process is
gone. Everything else is a ticket. GrowPage's own alerts hold only in the modes where they mean
something (``growpage_build_info{mode}``): nothing in mode off, compression and growth only in
enforce; and capacity alerts read each home's semantics (``growpage_build_info{home}``).
Severities come from ``catalog.SEVERITY_TABLE``, which ``gpctl diagnose`` and the runbooks read too.

SLO alerts are per service (namespace, model_name) across its pods; the others are per pod. Every
alert carries ``severity``, ``summary``, ``description`` (with the exact ``gpctl diagnose`` command)
and ``runbook_url``.
"""

from __future__ import annotations

import dataclasses
import functools

from growpage import catalog
from growpage.monitoring import recording_rules as rec
from growpage.monitoring import router_rules
from growpage.monitoring.alert_rule import DIAGNOSE_SERVICE as _DIAGNOSE_SERVICE
from growpage.monitoring.alert_rule import PERCENT as _PERCENT
from growpage.monitoring.alert_rule import SERVICE as _SERVICE
from growpage.monitoring.alert_rule import AlertRule, burn_rules
from growpage.monitoring.alert_rule import pct as _pct
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.promql import selector

OOM_WINDOW = catalog.STRANDED_WINDOW  # an OOM or preemption counts for this long after it happened

_MODEL = catalog.MODEL_LABEL
_WHERE = f"{{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} ({{{{ $labels.{_MODEL} }}}})"
_DIAGNOSE = ("Run: gpctl diagnose --prometheus {{ $externalURL }} --since 30m "
             "--namespace {{ $labels.namespace }} --pod {{ $labels.pod }}")
_BLOCK_SIZES = ", ".join(f"{gpu} {size}" for gpu, size in catalog.RECOMMENDED_BLOCK_SIZE_BY_GPU.items())


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
PANEL_VLLM_LATENCY = "vLLM time to first token / inter-token latency p99"
PANEL_VLLM_PREEMPTIONS = "vLLM preemptions per second"
PANEL_VLLM_BURN_RATE = "vLLM latency SLO burn rate"
PANEL_FLEET_LOAD = "Router load per replica (GET /get_load)"  # on GrowPage / Fleet
PANEL_OBSERVED_SHARE = "Share of steps and requests observed (vLLM home)"
PANEL_OWN_SHARE = "GrowPage's own share of vLLM's step time (vLLM home)"


def in_modes(expr: str, modes: tuple[str, ...], on: str, homes: tuple[str, ...] = ()) -> str:
    """``expr`` kept only where GrowPage runs in one of ``modes`` (and, given ``homes``, in one of them).

    The join reads ``growpage_build_info``, which the agent serves from start-up in every mode: a pod
    in mode off keeps exporting it and is left out here, never paged for.
    """
    matchers = [f'mode=~"{"|".join(modes)}"']
    if homes:
        matchers.append(f'home=~"{"|".join(homes)}"')
    build_info = selector(catalog.BUILD_INFO.name, ", ".join(matchers))
    return f"{expr}\nand on ({on})\nmax by ({on}) ({build_info})"


def _observing(expr: str, on: str) -> str:
    return in_modes(expr, catalog.MODES_OBSERVING, on)


def _running(expr: str, level: str) -> str:
    # An idle pod (or service) has nothing to utilize: only running requests can breach the SLO.
    running = f"sum by ({level}) ({catalog.REQUESTS_RUNNING.name}) > 0"
    return f"{expr}\nand on ({level})\n{running}"


def _view(level: str) -> str:
    """GrowPage's side of a page about vLLM's users: the series that say whether GrowPage can help.

    Compression headroom (page boundaries GrowPage resolved, or in monitor would resolve, by
    compressing instead of growing), growth GrowPage denied for want of pages, and the share of
    granted token slots that hold no live token (stranded).
    """
    where = ('{namespace="{{ $labels.namespace }}", pod="{{ $labels.pod }}"}' if level == "pod"
             else '{namespace="{{ $labels.namespace }}"}')
    return (f"GrowPage's view (Troubleshooting dashboard; in mode monitor, what enforce would do): "
            f"compression headroom {rec.COMPRESS_DECISIONS_RATE}{where}, denied growth "
            f"{rec.DENIED_RATE}{where}, stranded token slots {rec.STRANDED_SLOTS}{where}.")


def _utilization_alerts(lv: rec.Levels) -> list[AlertRule]:
    slo, low = lv.thresholds.utilization_objective, lv.thresholds.checklist.utilization_sustained_low
    homes = ", ".join(catalog.HOMES_GRANTING_BASE_PAGES)
    return [
        AlertRule(
            "GrowPageKVUtilizationLow",
            _observing(_running(f"{rec.UTILIZATION_SLO} < {slo}", lv.slo), lv.slo),
            catalog.ALERT_FOR.utilization_below_slo,
            f"KV page utilization below the {_pct(slo)} SLO",
            f"{_SERVICE}: live KV tokens fill {_PERCENT} of the granted page slots (SLO >= {_pct(slo)}) "
            f"for {catalog.ALERT_FOR.utilization_below_slo}. In the reference engine granted pages sit "
            f"reserved but empty (base_pages may be too large); inside vLLM pages are granted on demand, "
            f"so the empty slots are tail slack and eviction holes. {_DIAGNOSE_SERVICE}",
            PANEL_UTILIZATION),
        # A ticket, not a page: over-granting wastes capacity but fails no request by itself. When
        # the waste does strand pages and requests get preempted, GrowPageKVPagesStranded pages.
        # Only where base_pages is an admission grant: inside vLLM it is a compaction floor.
        AlertRule(
            "GrowPageKVOverGranting",
            in_modes(_running(f"{rec.UTILIZATION_POD} < {low}", lv.pod), catalog.MODES_OBSERVING, lv.join,
                     homes=catalog.HOMES_GRANTING_BASE_PAGES),
            catalog.ALERT_FOR.utilization_sustained_low,
            f"KV page utilization below {_pct(low)} for {catalog.ALERT_FOR.utilization_sustained_low}",
            f"{_WHERE}: live KV tokens fill only {_PERCENT} of the granted page slots for "
            f"{catalog.ALERT_FOR.utilization_sustained_low}: base_pages is too large for this traffic or "
            f"requests are mostly short, and the pool admits fewer requests than it could (homes where "
            f"base_pages is an admission grant: {homes}). {_DIAGNOSE}",
            PANEL_UTILIZATION),
    ]


# What a compress ratio under its objective means, and the fix that exists, in each home.
_COMPRESS_RATIO_FIXES = {
    "reference": ("INT8 alone cannot reach {target}x once per-head scales are stored; use quantization_bits=4 "
                  "or let eviction run."),
    "vllm": ("Inside vLLM compression is eviction and compaction only (per-request quantization does not exist "
             "there): each compaction keeps most of the tokens it touches, so it frees little. Lower "
             "attention_coverage or base_pages in the plugin's settings, or let enforce compress only under "
             "pressure."),
}


def _compress_alerts(lv: rec.Levels) -> list[AlertRule]:
    target = lv.thresholds.compress_ratio_objective
    window = catalog.COMPRESS_RATIO_RULE_WINDOW
    return [AlertRule(
        "GrowPageCompressRatioLow",
        in_modes(f"{rec.COMPRESS_RATIO} < {target}", catalog.MODES_ENFORCING, lv.slo, homes=(home,)),
        catalog.ALERT_FOR.compress_ratio_below_slo,
        f"Compressions return less than {target:g}x",
        f"{_SERVICE}: compressions of the last {window} turn {{{{ $value | humanize }}}} bytes into 1 (SLO >= "
        f"{target:g}x, scales included), and have for {catalog.ALERT_FOR.compress_ratio_below_slo}. "
        f"{fix.format(target=f'{target:g}')} {_DIAGNOSE_SERVICE}",
        PANEL_COMPRESS, {"home": home}) for home, fix in _COMPRESS_RATIO_FIXES.items()]


# vLLM SLO -> the alertname stem of its burn-rate alerts.
VLLM_SLO_ALERT_STEMS = {catalog.SLO_VLLM_TTFT.name: "VLLMTimeToFirstToken",
                        catalog.SLO_VLLM_ITL.name: "VLLMInterTokenLatency",
                        catalog.SLO_VLLM_AVAILABILITY.name: "VLLMAvailability"}


def _allocation_burn_alerts(lv: rec.Levels) -> list[AlertRule]:
    t = lv.thresholds
    threshold_ms = f"{t.allocation_latency_s * 1000:g} ms"
    return burn_rules(
        "AllocationLatency", rec.slo_error_ratio_name, t.allocation_latency_objective,
        "Page allocation latency burns its error budget too fast",
        f"page grants over the long window took longer than {threshold_ms} "
        f"(SLO: {_pct(t.allocation_latency_objective)} under {threshold_ms}). Grant latency "
        "is a cause: the user-facing pages are vLLM's time to first token and inter-token latency",
        PANEL_BURN_RATE, scope=lambda expr: _observing(expr, lv.slo), burn_alerts=t.burn_rate_alerts)


def vllm_latency_alerts(thresholds: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> list[AlertRule]:
    """What vLLM's users feel: TTFT and inter-token latency burns, on every vLLM pod the selector matches.

    The error ratios count every pod whatever GrowPage's mode or health (mode off after a rollback,
    its exporter gone): users' latency does not depend on GrowPage reporting it. The long windows
    sum recorded per-service rates, so a pod replaced mid-burn keeps its errors in the budget.
    """
    rules = []
    for slo in thresholds.vllm_latency_slos:
        what = "time to first token" if slo.name == catalog.SLO_VLLM_TTFT.name else "inter-token latency"
        rules += burn_rules(
            VLLM_SLO_ALERT_STEMS[slo.name], functools.partial(rec.vllm_error_ratio_name, slo.name),
            slo.objective, f"vLLM {what} burns its error budget too fast",
            f"requests over the long window had a {what} above {slo.threshold_s:g} s (vLLM's "
            f"{slo.histogram}; SLO: {_pct(slo.objective)} within {slo.threshold_s:g} s)",
            PANEL_VLLM_BURN_RATE, _view("service"), burn_alerts=thresholds.burn_rate_alerts)
    availability = thresholds.vllm_availability_slo
    rules += burn_rules(
        VLLM_SLO_ALERT_STEMS[availability.name], functools.partial(rec.vllm_error_ratio_name, availability.name),
        availability.objective, "vLLM requests fail or are aborted too often",
        f"requests finished over the long window were aborted or failed ({catalog.VLLM_REQUESTS_FINISHED}"
        f"{{{catalog.VLLM_FINISHED_REASON_LABEL}=~\"{'|'.join(availability.failed_reasons)}\"}}; SLO: "
        f"{_pct(availability.objective)} of finished requests neither)",
        PANEL_VLLM_BURN_RATE, _view("service"), burn_alerts=thresholds.burn_rate_alerts)
    return rules


def _latency_alert(lv: rec.Levels) -> AlertRule:
    # A ticket naming the pod and the likely cause.
    limit_s = lv.thresholds.checklist.allocation_latency_p99_critical_s
    return AlertRule(
        "GrowPageAllocationLatencyHigh", _observing(f"{rec.ALLOCATION_P99} > {limit_s}", lv.join),
        catalog.ALERT_FOR.allocation_latency_p99_high,
        f"Page allocation p99 above {limit_s * 1000:g} ms",
        f"{_WHERE}: p99 page allocation latency is {{{{ $value | humanizeDuration }}}} "
        f"(> {limit_s * 1000:g} ms) for {catalog.ALERT_FOR.allocation_latency_p99_high}; decode steps "
        f"wait for pages and tail latency grows. Check the block size in use against the GPU "
        f"(GrowPage's guidance, not a vLLM rule: {_BLOCK_SIZES}). {_DIAGNOSE}",
        PANEL_LATENCY_P99)


def _fragmentation_alert(lv: rec.Levels) -> AlertRule:
    high, free_max = lv.thresholds.checklist.fragmentation_high, lv.thresholds.checklist.fragmentation_pool_free_max
    return AlertRule(
        "GrowPageFragmentationHigh",
        _observing(f"{rec.FRAGMENTATION_POD} > {high}\nand on ({lv.join})\n{rec.POOL_FREE} < {free_max}", lv.join),
        catalog.ALERT_FOR.fragmentation_high,
        f"Page table fragmentation above {_pct(high)} while the pool runs short",
        f"{_WHERE}: {_PERCENT} of the token slots in written pages hold no live token (tail slack and "
        f"eviction holes) for {catalog.ALERT_FOR.fragmentation_high}, while fewer than {_pct(free_max)} of "
        f"the pool's pages are free: those slots are capacity new requests are waiting for. {_DIAGNOSE}",
        PANEL_FRAGMENTATION)


def _stranded_alert(lv: rec.Levels) -> AlertRule:
    """Requests fail (OOM, preemption) because pages are stranded, not because the KV is full.

    Read inside the KV pool, where the failure happens: the framebuffer is no signal on vLLM, which
    reserves its KV cache at start-up and so always looks ~90 % full. vLLM's own symptom (its KV
    cache usage at 98 % or more while its queue grows) counts only together with stranded slots:
    without them the KV is genuinely full, which is capacity, not GrowPage.
    """
    level, join, checklist = lv.pod, lv.join, lv.thresholds.checklist
    increase = f"sum by ({level}) (increase({{}}[{OOM_WINDOW}])) > 0"
    failures = [increase.format(catalog.OOM_EVENTS.name),
                increase.format(selector(catalog.DECISIONS.name, decision="preempt")),
                increase.format(catalog.VLLM_PREEMPTIONS)]
    queue = catalog.VLLM_QUEUE_GROWTH_WINDOW
    vllm_full = (f"(\n    max by ({join}) (max_over_time({catalog.VLLM_KV_CACHE_USAGE}[{OOM_WINDOW}])) "
                 f">= {checklist.vllm_kv_cache_usage_full}\n  and on ({join})\n"
                 f"    sum by ({join}) (delta({catalog.VLLM_REQUESTS_WAITING}[{queue}])) > 0\n  )")
    no_free_page = [f"min_over_time({rec.POOL_FREE}[{OOM_WINDOW}]) <= {checklist.pool_free_low}", vllm_full]
    stranded = f"max_over_time({rec.STRANDED_SLOTS}[{OOM_WINDOW}]) >= {checklist.stranded_slots_high}"
    expr = (f"(\n  {(chr(10) + 'or' + chr(10) + '  ').join(failures)}\n)\nand on ({join})\n"
            f"(\n  {(chr(10) + 'or' + chr(10) + '  ').join(no_free_page)}\n)\nand on ({join})\n{stranded}")
    return AlertRule(
        "GrowPageKVPagesStranded", _observing(expr, join), catalog.ALERT_FOR.kv_pages_stranded,
        "Requests preempted while KV pages sit stranded",
        f"{_WHERE}: {{{{ $value | humanize }}}} OOM events or preemptions in the last {OOM_WINDOW}, while the "
        f"KV pool had no free page (GrowPage's pool at most {_pct(checklist.pool_free_low)} free, or vLLM's "
        f"kv_cache_usage_perc at least {_pct(checklist.vllm_kv_cache_usage_full)} with its queue growing "
        f"over {queue}) and at least {_pct(checklist.stranded_slots_high)} of the granted token slots held "
        f"no live token: pages are lost to slack and empty grants, not to a full KV cache. {_DIAGNOSE}",
        PANEL_OOM, growpage_view=_view("pod"))


def _preemption_alert(lv: rec.Levels) -> AlertRule:
    per_s = lv.thresholds.vllm_preemptions_per_s_high
    window = catalog.RATE_WINDOW
    return AlertRule(
        "GrowPageVLLMPreemptions",
        _observing(f"sum by ({lv.pod}) (rate({catalog.VLLM_PREEMPTIONS}[{window}])) > {per_s:g}", lv.join),
        catalog.ALERT_FOR.vllm_preemptions,
        f"vLLM preempts more than {per_s:g} requests per second",
        f"{_WHERE}: vLLM preempts {{{{ $value | humanize }}}} running requests per second (over {window}) "
        f"for want of KV blocks; each one recomputes its prompt and its user waits. Preemptions with "
        f"stranded pages page as GrowPageKVPagesStranded; without them the KV cache is genuinely full: "
        f"add replicas or KV memory, or let GrowPage enforce (compression before preemption). {_DIAGNOSE}",
        PANEL_VLLM_PREEMPTIONS, growpage_view=_view("pod"))


def fleet_routing_alert(lv: rec.Levels) -> AlertRule:
    """A router keeps sending new requests to a replica that preempts and says it is full, while a
    sibling of the same service says it has room (docs/FLEET.md). Every replica full is capacity
    (``GrowPageVLLMPreemptions``), not routing."""
    per_s, full = lv.thresholds.vllm_preemptions_per_s_high, lv.thresholds.fleet_load_full
    window = catalog.RATE_WINDOW
    service = lv.slo  # the replicas of one model in one namespace
    load = catalog.ROUTER_LOAD.name
    expr = (f"sum by ({lv.pod}) (rate({catalog.VLLM_PREEMPTIONS}[{window}])) > {per_s:g}\n"
            f"and on ({lv.join})\n"
            f"sum by ({lv.pod}) (rate({catalog.VLLM_TTFT}_count[{window}])) > 0\n"
            f"and on ({lv.join})\n"
            f"min by ({lv.join}) (min_over_time({load}[{window}])) >= {full:g}\n"
            f"and on ({service})\n"
            f"min by ({service}) ({load}) < {full:g}")
    return AlertRule(
        "GrowPageFleetRoutesToPreemptingReplica", _observing(expr, lv.join),
        catalog.ALERT_FOR.fleet_routes_to_preempting,
        "The router keeps sending requests to a replica that preempts while another has room",
        f"{_WHERE}: vLLM preempts {{{{ $value | humanize }}}} requests per second (over {window}) and new "
        f"requests keep arriving, although this replica's {load} (what it answers GET {catalog.LOAD_PATH}) "
        f"stayed at {full:g} or more while another replica of the service reads below {full:g}: the router "
        f"is not steering by GrowPage's load (policy not power_of_two, or workers it does not poll). "
        f"See docs/FLEET.md. {_DIAGNOSE}",
        PANEL_FLEET_LOAD)


def agent_alerts(config: MixinConfig = DEFAULT_CONFIG) -> list[AlertRule]:
    """The agent's own health: scraped, exporting, not failing, actually running."""
    lv = rec.Levels.of(config)
    up = selector("up", job=config.growpage_job)
    build_info = selector(catalog.BUILD_INFO.name, job=config.growpage_job)
    errors = (f"sum by ({lv.pod}, component) (increase({catalog.AGENT_ERRORS.name}[5m])) > 0")
    # The enforcer has nothing to do outside enforce; the other components run in monitor too.
    # Never while vLLM loads the model (reason starting); settings GrowPage cannot honour
    # (invalid_config) in any mode, since GrowPage then runs off whatever was asked for.
    def idle(matchers: str) -> str:
        return (f"max by ({lv.join}, {_MODEL}, component, reason) "
                f"({selector(catalog.AGENT_ACTIVE.name, matchers)} == 0)")
    ordinary = f'reason!~"{catalog.AGENT_STARTING_REASON}|{catalog.AGENT_INVALID_CONFIG_REASON}"'
    others, enforcer = idle(f'component!="enforcer", {ordinary}'), idle(f'component="enforcer", {ordinary}')
    invalid = idle(f'reason="{catalog.AGENT_INVALID_CONFIG_REASON}"')
    inactive = (f"(\n{_observing(others, lv.join)}\n)\nor\n(\n"
                f"{in_modes(enforcer, catalog.MODES_ENFORCING, lv.join)}\n)\nor\n{invalid}")
    # vLLM answers where its own /metrics is scraped: GrowPage's route failing there is GrowPage's
    # fault. A pod still loading its model answers neither and pages nobody (Kubernetes' readiness
    # and kube-state-metrics' alerts cover a pod that never becomes ready).
    vllm_up = selector("up", job=config.vllm_job)
    return _with_config([
        AlertRule(
            "GrowPageAgentDown", f"{up} == 0\nand on ({lv.join})\n{vllm_up} == 1", catalog.ALERT_FOR.agent_down,
            f"vLLM answers but GrowPage's {catalog.METRICS_PATH} does not",
            f"{{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}}: the {config.growpage_job} target "
            f"{{{{ $labels.instance }}}} has failed every scrape for {catalog.ALERT_FOR.agent_down} while vLLM's own "
            f"{catalog.VLLM_METRICS_PATH} (job {config.vllm_job}) answers: vLLM serves, GrowPage's exporter is "
            f"broken or hung, and GrowPage's alerts are blind for this pod (vLLM's latency SLOs still page). "
            f"Run: gpctl diagnose --endpoint http://{{{{ $labels.instance }}}}{catalog.METRICS_PATH}",
            PANEL_SCRAPE),
        AlertRule(
            "GrowPageMetricsAbsent", f"absent({build_info})\nand on ()\ncount({vllm_up} == 1) > 0",
            catalog.ALERT_FOR.metrics_absent,
            "vLLM serves but no GrowPage metrics reach Prometheus",
            f"No {catalog.BUILD_INFO.name} series from job {config.growpage_job} for "
            f"{catalog.ALERT_FOR.metrics_absent} while vLLM targets (job {config.vllm_job}) answer: no GrowPage "
            f"target is scraped (ServiceMonitor selector or port), the plugin is not loaded (VLLM_PLUGINS), or "
            f"{catalog.METRICS_PATH} serves vLLM's own metrics.",
            PANEL_SCRAPE),
        AlertRule(
            "GrowPageAgentErrors", errors, catalog.ALERT_FOR.agent_errors,
            "GrowPage agent keeps catching errors",
            f"{_WHERE}: the {{{{ $labels.component }}}} component caught {{{{ $value | humanize }}}} errors in "
            f"the last 5m, and errors kept coming for {catalog.ALERT_FOR.agent_errors}. GrowPage falls back "
            f"to vLLM's default paging for the affected requests; serving continues. {_DIAGNOSE}",
            PANEL_ERRORS),
        _observation_stale_alert(lv),
        AlertRule(
            "GrowPageAgentInactive", inactive, catalog.ALERT_FOR.agent_inactive,
            "A GrowPage component does nothing although its mode asks for it",
            f"{_WHERE}: the {{{{ $labels.component }}}} is inactive ({{{{ $labels.reason }}}}) for "
            f"{catalog.ALERT_FOR.agent_inactive} while growpage_build_info says the mode is monitor or enforce, "
            f"or because GrowPage cannot honour its settings (invalid_config: it runs off whatever mode was "
            f"asked; the engine core's log names the setting and the fix): this pod serves with vLLM's default "
            f"paging and its GrowPage metrics describe nothing. {_DIAGNOSE}",
            PANEL_ACTIVE),
    ], config)


def _observation_stale_alert(lv: rec.Levels) -> AlertRule:
    """The observer reports active, steps run with tracked requests, and not one was observed: what
    GrowPage decides then ranks tokens by recency alone, while every panel says it observes. With
    observe_every_steps N (monitor's default 4) the share is 1/N, under full CUDA graphs too (the
    due step runs without its full graph); 0 means observation stopped."""
    window = catalog.RATE_WINDOW
    steps, observed = catalog.VLLM_STEPS.name, catalog.VLLM_OBSERVED_STEPS.name
    active = selector(catalog.AGENT_ACTIVE.name, component="observer", reason=catalog.AGENT_ACTIVE_REASON)
    expr = (f"sum by ({lv.pod}) (rate({steps}[{window}])) > 0\n"
            f"and on ({lv.join})\n"
            f"sum by ({lv.pod}) (rate({observed}[{window}])) == 0\n"
            f"and on ({lv.join})\n"
            f"max by ({lv.join}) ({active} == 1)")
    return AlertRule(
        "GrowPageObservationStale", expr, catalog.ALERT_FOR.observation_stale,
        "GrowPage's observer reports active but observes no step",
        f"{_WHERE}: {{{{ $value | humanize }}}} engine steps per second ran with requests GrowPage tracks "
        f"and none was observed (rate of {observed} over {window}) for {catalog.ALERT_FOR.observation_stale}, "
        f"while growpage_agent_active{{component=\"observer\"}} reads 1: GrowPage's decisions rank tokens by "
        f"recency alone and its attention panels show nothing new. One step in observe_every_steps is "
        f"observed by design; 0 means none is. {_DIAGNOSE}",
        PANEL_OBSERVED_SHARE)


def _throttle_alert(lv: rec.Levels) -> AlertRule:
    share = lv.thresholds.checklist.throttle_saturation
    return AlertRule(
        "GrowPageGrowthThrottled", in_modes(f"{rec.THROTTLED_SHARE} > {share}", catalog.MODES_ENFORCING, lv.join),
        catalog.ALERT_FOR.growth_throttled,
        f"More than {_pct(share)} of page-growth attempts are throttled",
        f"{_WHERE}: max_growth_rate refused {_PERCENT} of growth attempts for "
        f"{catalog.ALERT_FOR.growth_throttled}; requests fall back to compression or wait. Raise "
        f"max_growth_rate if the pool has free pages, or add capacity. {_DIAGNOSE}",
        PANEL_THROTTLED)


def slo_alerts(config: MixinConfig = DEFAULT_CONFIG) -> list[AlertRule]:
    """Per service: vLLM's latency SLOs, then GrowPage's three (utilization, compress ratio, grant latency)."""
    lv = rec.Levels.of(config)
    utilization_low, _ = _utilization_alerts(lv)
    return _with_config([*vllm_latency_alerts(config.thresholds), utilization_low, *_compress_alerts(lv),
                         *_allocation_burn_alerts(lv)], config)


def checklist_alerts(config: MixinConfig = DEFAULT_CONFIG) -> list[AlertRule]:
    """Per pod: stranded pages and preemptions, over-granting, grant latency, fragmentation, throttling."""
    lv = rec.Levels.of(config)
    _, over_granting = _utilization_alerts(lv)
    return _with_config([_stranded_alert(lv), _preemption_alert(lv), fleet_routing_alert(lv), over_granting,
                         _latency_alert(lv), _fragmentation_alert(lv), _throttle_alert(lv)], config)


def _with_config(rules: list[AlertRule], config: MixinConfig) -> list[AlertRule]:
    return [dataclasses.replace(rule, config=config, expr=config.scoped(rule.expr)) for rule in rules]


def alert_rules(config: MixinConfig = DEFAULT_CONFIG) -> list[AlertRule]:
    return [*slo_alerts(config), *checklist_alerts(config), *agent_alerts(config), *router_rules.alerts(config)]


def alert_names() -> list[str]:
    """Alertnames in rule order, each once (burn-rate alerts have one rule per window pair)."""
    return list(dict.fromkeys(rule.name for rule in alert_rules()))


def rules_by_name(config: MixinConfig = DEFAULT_CONFIG) -> dict[str, list[AlertRule]]:
    """Alertname -> its rules (one, or one per burn-rate window pair), in rule order."""
    grouped: dict[str, list[AlertRule]] = {}
    for rule in alert_rules(config):
        grouped.setdefault(rule.name, []).append(rule)
    return grouped
