"""Recording rules, named ``level:metric:operations`` (Prometheus naming conventions).

Alerts and dashboards read these instead of repeating long expressions. Levels say which labels
survive: ``namespace_pod_model_name`` keeps namespace, pod and model_name (one vLLM pod serves one
model); ``namespace_model_name`` is the service, across its pods, where the SLOs are kept (a replaced
pod must not take its error budget with it). Ratios are sums of numerators over sums of
denominators, never averages of per-pod ratios.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.promql import duration_seconds, le_value, selector

RATE_WINDOW = catalog.RATE_WINDOW  # the window of rate-based rules and alerts: 20 scrapes at 15 s
# The one window SLO events are rated over from raw series; every burn window sums its recordings.
SLO_BASE_WINDOW = catalog.RATE_WINDOW
LTS_ROLLOUT_WINDOW = "1h"  # finished requests are sparse: a longer window for the entropy p50
# The cluster label is kept by every aggregation (absent, it is simply not there): one Prometheus
# serving several clusters keeps their pods and error budgets apart.
POD_LEVEL = ", ".join(DEFAULT_CONFIG.pod_labels)
SLO_LEVEL = ", ".join(DEFAULT_CONFIG.slo_labels)


@dataclasses.dataclass(frozen=True)
class Levels:
    """The label lists a mixin config keeps (per pod, per service (SLOs), the pod join), and the
    thresholds its rules compare against."""

    pod: str
    slo: str
    join: str
    thresholds: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS

    @classmethod
    def of(cls, config: MixinConfig) -> Levels:
        return cls(", ".join(config.pod_labels), ", ".join(config.slo_labels), ", ".join(config.pod_join),
                   config.thresholds)
_POD = "_".join(catalog.POD_LABELS)  # namespace_pod_model_name
_SLO = "_".join(catalog.SLO_LABELS)  # namespace_model_name


@dataclasses.dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str

    def to_dict(self) -> dict:
        return {"record": self.record, "expr": self.expr}


def slo_error_ratio_name(window: str) -> str:
    """Share of page grants slower than the latency SLO threshold over ``window``, per service."""
    return f"{_SLO}:{catalog.ALLOCATION_LATENCY.name}:slo_error_ratio_rate{window}"


def slo_events_name(slo: str, kind: str) -> str:
    """The recorded short-window event rate of an SLO, per service: ``kind`` is ``good`` or ``total``.

    Every longer window is built from these (Sloth's and Pyrra's way): a per-service series keeps
    the events of a pod that has since been replaced, and evaluating a 3d window sums recorded
    samples instead of re-reading three days of raw buckets at every evaluation.
    """
    return f"{_SLO}:{slo}:{kind}_rate{SLO_BASE_WINDOW}"


ALLOCATION_P99 = f"{_POD}:{catalog.ALLOCATION_LATENCY.name}:p99_rate{RATE_WINDOW}"
ALLOCATION_P50 = f"{_POD}:{catalog.ALLOCATION_LATENCY.name}:p50_rate{RATE_WINDOW}"
COMPRESS_RATIO = (f"{_SLO}:growpage_compress_input_per_output_bytes:ratio_increase"
                  f"{catalog.COMPRESS_RATIO_RULE_WINDOW}")
UTILIZATION_SLO = f"{_SLO}:{catalog.UTILIZATION.name}:ratio"
UTILIZATION_POD = f"{_POD}:{catalog.UTILIZATION.name}:ratio"
FRAGMENTATION_POD = f"{_POD}:{catalog.FRAGMENTATION.name}:ratio"
POOL_FREE = f"{_POD}:growpage_pool_pages_free:ratio"
STRANDED_SLOTS = f"{_POD}:growpage_kv_token_slots_stranded:ratio"
THROTTLED_SHARE = f"{_POD}:growpage_decisions_throttled:ratio_rate{RATE_WINDOW}"
ALLOCATIONS_RATE = f"{_POD}:{catalog.ALLOCATIONS.name.removesuffix('_total')}:rate{RATE_WINDOW}"
GPU_FRAMEBUFFER_USED = f"{_POD}:gpu_framebuffer_used:ratio"
GPU_UTILIZATION = f"{_POD}:gpu_utilization:ratio"
LTS_ENTROPY_P50 = f"namespace:{catalog.LTS_ENTROPY.name}:p50_rate{LTS_ROLLOUT_WINDOW}"


def vllm_error_ratio_name(slo: str, window: str) -> str:
    """Share of vLLM observations over ``slo``'s threshold over ``window``, per service, counting
    every vLLM pod the mixin's selector matches, whatever GrowPage's mode or health."""
    return f"{_SLO}:{slo}:slo_error_ratio_rate{window}"


COMPRESS_DECISIONS_RATE = f"{_POD}:growpage_decisions_compress:rate{RATE_WINDOW}"
DENIED_RATE = f"{_POD}:growpage_decisions_denied:rate{RATE_WINDOW}"


def slo_windows() -> list[str]:
    """Every window a burn-rate alert reads, short ones first, without repeats (the windows are the
    catalog's; a mixin config changes only their factors)."""
    windows: list[str] = []
    for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS:
        for burn in alert.windows:
            for window in (burn.short_window, burn.long_window):
                if window not in windows:
                    windows.append(window)
    return sorted(windows, key=duration_seconds)


def _rate_sum(series: str, window: str, level: str, function: str = "rate") -> str:
    return f"sum by ({level}) ({function}({series}[{window}]))"


def _sum(series: str, level: str) -> str:
    return f"sum by ({level}) ({series})"


@dataclasses.dataclass(frozen=True)
class SLOEvents:
    """The counters of one SLO with burn alerts: good events are ``good`` with ``good_matcher``, all
    events are ``total``. The one definition the recording rules and ``gpctl diagnose`` read."""

    name: str
    good: str
    good_matcher: str
    total: str


def slo_events(thresholds: catalog.MixinThresholds) -> tuple[SLOEvents, ...]:
    """Every SLO with burn-rate alerts, with the deployment's thresholds: vLLM's latency SLOs (the
    threshold's bucket over ``_count``), its availability (finished requests neither aborted nor
    failed over all), GrowPage's grant latency."""
    def latency(name: str, histogram: str, threshold_s: float) -> SLOEvents:
        return SLOEvents(name, f"{histogram}_bucket", f'le="{le_value(threshold_s)}"', f"{histogram}_count")

    availability = thresholds.vllm_availability_slo
    return (*(latency(slo.name, slo.histogram, slo.threshold_s) for slo in thresholds.vllm_latency_slos),
            SLOEvents(availability.name, availability.counter, availability.good_matcher, availability.counter),
            latency(catalog.SLO_ALLOCATION_LATENCY.name, catalog.ALLOCATION_LATENCY.name,
                    thresholds.allocation_latency_s))


def error_ratio_name(slo: str, window: str) -> str:
    """The recording of ``slo``'s error ratio over ``window`` (what its burn alerts compare)."""
    if slo == catalog.SLO_ALLOCATION_LATENCY.name:
        return slo_error_ratio_name(window)
    return vllm_error_ratio_name(slo, window)


def _slo_rules(events: SLOEvents, lv: Levels) -> list[RecordingRule]:
    """The base window's good and total event rates of an SLO, per service, then 1 - good/total over
    every burn window from them (zero events give NaN, which never alerts: nothing to burn).

    vLLM's SLOs count every pod the selector matches, GrowPage in mode off or its exporter gone
    included: what users feel does not depend on GrowPage reporting it. GrowPage's grant latency
    counts only pods where it observes; the join is instant but sits under the base-window
    recording, so the history it leaves behind keeps a replaced pod's grants.
    """
    def observed(expr: str) -> str:
        return f"{expr}\n  and on ({lv.join}) {_observed_pods(lv)}" if own else expr

    own = events.name == catalog.SLO_ALLOCATION_LATENCY.name
    rates = [RecordingRule(slo_events_name(events.name, kind),
                           f"sum by ({lv.slo}) (\n  {observed(f'rate({series}[{SLO_BASE_WINDOW}])')}\n)")
             for kind, series in (("good", selector(events.good, events.good_matcher)), ("total", events.total))]
    return [*rates, *(_error_ratio(error_ratio_name(events.name, window), events.name, window)
                      for window in slo_windows())]


def _error_ratio(record: str, slo: str, window: str) -> RecordingRule:
    """1 - good/total over ``window``, from the recorded base-window rates."""
    good, total = slo_events_name(slo, "good"), slo_events_name(slo, "total")
    if window == SLO_BASE_WINDOW:
        return RecordingRule(record, f"1 - (\n  {good}\n/\n  {total}\n)")
    return RecordingRule(record, f"1 - (\n  sum_over_time({good}[{window}])\n/\n"
                                 f"  sum_over_time({total}[{window}])\n)")


def _observed_pods(lv: Levels) -> str:
    """Pods whose GrowPage runs in monitor or enforce (growpage_build_info is served in every mode)."""
    modes = "mode=~\"" + "|".join(catalog.MODES_OBSERVING) + "\""
    return f"max by ({lv.join}) ({selector(catalog.BUILD_INFO.name, modes)})"


def _decisions_rate(record: str, matcher: str, lv: Levels) -> RecordingRule:
    return RecordingRule(record, _rate_sum(selector(catalog.DECISIONS.name, matcher), RATE_WINDOW, lv.pod))


def _allocation_quantile(record: str, quantile: float, lv: Levels) -> RecordingRule:
    buckets = _rate_sum(f"{catalog.ALLOCATION_LATENCY.name}_bucket", RATE_WINDOW, f"{lv.pod}, le")
    return RecordingRule(record, f"histogram_quantile({quantile}, {buckets})")


def _compress_ratio(lv: Levels) -> RecordingRule:
    # An hour of increases: compressions come in bursts, and a 5m rate vanishes between bursts (which
    # restarted the alert's `for` each time). "> 0" drops services that did not compress at all, so
    # an idle compressor is not reported as ratio 0 (or +Inf) and cannot trip the < 2.0 alert.
    window = catalog.COMPRESS_RATIO_RULE_WINDOW
    bytes_in = _rate_sum(catalog.COMPRESS_INPUT_BYTES.name, window, lv.slo, "increase")
    bytes_out = _rate_sum(catalog.COMPRESS_OUTPUT_BYTES.name, window, lv.slo, "increase")
    return RecordingRule(COMPRESS_RATIO, f"{bytes_in}\n/\n({bytes_out} > 0)")


def _slot_ratio(record: str, numerator: str, denominator: str, level: str, complement: bool = False) -> RecordingRule:
    ratio = f"{_sum(numerator, level)}\n/\n({_sum(denominator, level)} > 0)"
    return RecordingRule(record, f"1 - (\n{ratio}\n)" if complement else ratio)


def _pool_free(lv: Levels) -> RecordingRule:
    pool = catalog.POOL_PAGES.name
    return RecordingRule(POOL_FREE, f"{_sum(selector(pool, state='free'), lv.pod)}\n/\n"
                                    f"({_sum(pool, lv.pod)} > 0)")


def _throttled_share(lv: Levels) -> RecordingRule:
    # Allocation attempts = pages granted as growth (allocate) + growth refused by max_growth_rate.
    decisions = catalog.DECISIONS.name
    throttled = _rate_sum(selector(decisions, decision="throttled"), RATE_WINDOW, lv.pod)
    attempts = _rate_sum(selector(decisions, 'decision=~"allocate|throttled"'), RATE_WINDOW, lv.pod)
    return RecordingRule(THROTTLED_SHARE, f"{throttled}\n/\n({attempts} > 0)")


def dcgm_by_pod(expr: str) -> str:
    """``expr`` over DCGM series with the GPU's user in namespace/pod.

    label_replace with "(.+)" only rewrites when exported_* is set (honorLabels false), so the same
    expression serves both ServiceMonitor set-ups.
    """
    for target, source in catalog.DCGM_EXPORTED_LABELS.items():
        expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.+)")'
    return expr


def _with_model(dcgm: str, lv: Levels) -> str:
    """The fullest GPU of each pod, labelled with the model the pod serves (from GrowPage's build
    info), so dashboards filter DCGM rows by model_name like every other row."""
    models = f"max by ({lv.pod}) ({catalog.BUILD_INFO.name})"
    return (f"max by ({lv.join}) (\n  {dcgm}\n)\n* on ({lv.join}) group_left ({catalog.MODEL_LABEL})\n"
            f"(0 * {models} + 1)")


def _gpu_framebuffer_used(lv: Levels) -> RecordingRule:
    used, free = catalog.DCGM_FB_USED, catalog.DCGM_FB_FREE
    # max: the fullest GPU of a multi-GPU pod.
    return RecordingRule(GPU_FRAMEBUFFER_USED, _with_model(dcgm_by_pod(f"{used} / ({used} + {free})"), lv))


def _gpu_utilization(lv: Levels) -> RecordingRule:
    return RecordingRule(GPU_UTILIZATION, _with_model(dcgm_by_pod(f"{catalog.DCGM_GPU_UTIL} / 100"), lv))


def _lts_entropy_p50(config: MixinConfig) -> RecordingRule:
    buckets = _rate_sum(f"{catalog.LTS_ENTROPY.name}_bucket", LTS_ROLLOUT_WINDOW,
                        f"{config.cluster_label}, namespace, le")
    return RecordingRule(LTS_ENTROPY_P50, f"histogram_quantile(0.5, {buckets})")


def slo_recording_rules(config: MixinConfig = DEFAULT_CONFIG) -> list[RecordingRule]:
    """What the SLO alerts read, per service: vLLM's and GrowPage's latency error ratios per burn-rate
    window, the compress ratio, utilization."""
    lv = Levels.of(config)
    return _scoped([
        *(rule for events in slo_events(lv.thresholds) for rule in _slo_rules(events, lv)), _compress_ratio(lv),
        _slot_ratio(UTILIZATION_SLO, catalog.LIVE_TOKENS.name, catalog.GRANTED_TOKEN_SLOTS.name, lv.slo)], config)


def checklist_recording_rules(config: MixinConfig = DEFAULT_CONFIG) -> list[RecordingRule]:
    """What the checklist alerts read, per pod: p99 latency, utilization, fragmentation, free pages,
    stranded token slots, throttled share, and GrowPage's view next to the vLLM pages."""
    lv = Levels.of(config)
    live, granted, used = (catalog.LIVE_TOKENS.name, catalog.GRANTED_TOKEN_SLOTS.name,
                           catalog.USED_TOKEN_SLOTS.name)
    return _scoped([
        _allocation_quantile(ALLOCATION_P99, 0.99, lv),
        _slot_ratio(UTILIZATION_POD, live, granted, lv.pod),
        _slot_ratio(FRAGMENTATION_POD, live, used, lv.pod, complement=True),
        _pool_free(lv),
        # Granted slots holding no live token: reserved-but-unwritten pages, tail slack, eviction holes.
        _slot_ratio(STRANDED_SLOTS, live, granted, lv.pod, complement=True),
        _throttled_share(lv),
        # GrowPage's view next to the pages about vLLM's users: compression headroom and denied growth.
        _decisions_rate(COMPRESS_DECISIONS_RATE, 'decision=~"quantize|evict"', lv),
        _decisions_rate(DENIED_RATE, 'decision="denied"', lv),
    ], config)


def dashboard_recording_rules(config: MixinConfig = DEFAULT_CONFIG) -> list[RecordingRule]:
    """Read by dashboards and the rollout decision only."""
    lv = Levels.of(config)
    return _scoped([
        _allocation_quantile(ALLOCATION_P50, 0.5, lv),
        RecordingRule(ALLOCATIONS_RATE, _rate_sum(catalog.ALLOCATIONS.name, RATE_WINDOW, lv.pod)),
        _lts_entropy_p50(config),
        _gpu_framebuffer_used(lv),
        _gpu_utilization(lv),
    ], config)


def recording_rules(config: MixinConfig = DEFAULT_CONFIG) -> list[RecordingRule]:
    return [*slo_recording_rules(config), *checklist_recording_rules(config), *dashboard_recording_rules(config)]


def _scoped(rules: list[RecordingRule], config: MixinConfig) -> list[RecordingRule]:
    """``rules`` with the config's selectors on GrowPage's and vLLM's series."""
    return [dataclasses.replace(rule, expr=config.scoped(rule.expr)) for rule in rules]


def recording_rule_names() -> set[str]:
    return {rule.record for rule in recording_rules()}
