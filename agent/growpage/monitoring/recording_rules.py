"""Recording rules, named ``level:metric:operations`` (Prometheus naming conventions).

Alerts and dashboards read these instead of repeating long expressions. Levels say which labels
survive: ``namespace_pod_model`` keeps namespace, pod and model (one vLLM pod serves one model).
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.promql import duration_seconds, le_value, selector

RATE_WINDOW = "5m"  # the window of rate-based rules and alerts: 20 scrapes at the usual 15 s
LTS_ROLLOUT_WINDOW = "1h"  # finished requests are sparse: a longer window for the entropy p50
POD_LEVEL = "namespace, pod, model"


@dataclasses.dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str

    def to_dict(self) -> dict:
        return {"record": self.record, "expr": self.expr}


def slo_error_ratio_name(window: str) -> str:
    """Share of page grants slower than the latency SLO threshold over ``window``."""
    return f"namespace_pod_model:{catalog.ALLOCATION_LATENCY.name}:slo_error_ratio_rate{window}"


ALLOCATION_P99 = f"namespace_pod_model:{catalog.ALLOCATION_LATENCY.name}:p99_rate{RATE_WINDOW}"
ALLOCATION_P50 = f"namespace_pod_model:{catalog.ALLOCATION_LATENCY.name}:p50_rate{RATE_WINDOW}"
COMPRESS_RATIO = f"namespace_pod_model:growpage_compress_input_per_output_bytes:ratio_rate{RATE_WINDOW}"
THROTTLED_SHARE = f"namespace_pod_model:growpage_decisions_throttled:ratio_rate{RATE_WINDOW}"
ALLOCATIONS_RATE = f"namespace_pod_model:{catalog.ALLOCATIONS.name.removesuffix('_total')}:rate{RATE_WINDOW}"
GPU_FRAMEBUFFER_USED = "namespace_pod:gpu_framebuffer_used:ratio"
LTS_ENTROPY_P50 = f"namespace:{catalog.LTS_ENTROPY.name}:p50_rate{LTS_ROLLOUT_WINDOW}"


def slo_windows() -> list[str]:
    """Every window a burn-rate alert reads, short ones first, without repeats."""
    windows: list[str] = []
    for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS:
        for burn in alert.windows:
            for window in (burn.short_window, burn.long_window):
                if window not in windows:
                    windows.append(window)
    return sorted(windows, key=duration_seconds)


def _rate_sum(series: str, window: str, level: str = POD_LEVEL) -> str:
    return f"sum by ({level}) (rate({series}[{window}]))"


def _slo_error_ratio(window: str) -> RecordingRule:
    histogram = catalog.ALLOCATION_LATENCY.name
    fast = selector(f"{histogram}_bucket", le=le_value(catalog.ALLOCATION_LATENCY_SLO_THRESHOLD_S))
    # 1 - good/total: no grants in the window gives NaN, which never alerts (nothing to burn).
    expr = (f"1 - (\n  {_rate_sum(fast, window)}\n/\n  {_rate_sum(f'{histogram}_count', window)}\n)")
    return RecordingRule(slo_error_ratio_name(window), expr)


def _allocation_quantile(record: str, quantile: float) -> RecordingRule:
    buckets = _rate_sum(f"{catalog.ALLOCATION_LATENCY.name}_bucket", RATE_WINDOW, f"{POD_LEVEL}, le")
    return RecordingRule(record, f"histogram_quantile({quantile}, {buckets})")


def _compress_ratio() -> RecordingRule:
    # Only where compressions happened: "> 0" drops pods whose output rate is zero, so an idle
    # compressor is not reported as ratio 0 (or +Inf) and cannot trip the < 2.0 alert.
    bytes_in = _rate_sum(catalog.COMPRESS_INPUT_BYTES.name, RATE_WINDOW)
    bytes_out = _rate_sum(catalog.COMPRESS_OUTPUT_BYTES.name, RATE_WINDOW)
    return RecordingRule(COMPRESS_RATIO, f"{bytes_in}\n/\n({bytes_out} > 0)")


def _throttled_share() -> RecordingRule:
    # Allocation attempts = pages granted as growth (allocate) + growth refused by max_growth_rate.
    decisions = catalog.DECISIONS.name
    throttled = _rate_sum(selector(decisions, decision="throttled"), RATE_WINDOW)
    attempts = _rate_sum(selector(decisions, 'decision=~"allocate|throttled"'), RATE_WINDOW)
    return RecordingRule(THROTTLED_SHARE, f"{throttled}\n/\n({attempts} > 0)")


def _gpu_framebuffer_used() -> RecordingRule:
    used, free = catalog.DCGM_FB_USED, catalog.DCGM_FB_FREE
    ratio = f"{used} / ({used} + {free})"
    # label_replace with "(.+)" only rewrites when exported_* is set (honorLabels false), so the
    # same rule serves both ServiceMonitor set-ups. max: the fullest GPU of a multi-GPU pod.
    for target, source in catalog.DCGM_EXPORTED_LABELS.items():
        ratio = f'label_replace({ratio}, "{target}", "$1", "{source}", "(.+)")'
    return RecordingRule(GPU_FRAMEBUFFER_USED, f"max by (namespace, pod) (\n  {ratio}\n)")


def _lts_entropy_p50() -> RecordingRule:
    buckets = _rate_sum(f"{catalog.LTS_ENTROPY.name}_bucket", LTS_ROLLOUT_WINDOW, "namespace, le")
    return RecordingRule(LTS_ENTROPY_P50, f"histogram_quantile(0.5, {buckets})")


def slo_recording_rules() -> list[RecordingRule]:
    """What the SLO alerts read: latency error ratios per burn-rate window, the compress ratio."""
    return [*(_slo_error_ratio(window) for window in slo_windows()), _compress_ratio()]


def checklist_recording_rules() -> list[RecordingRule]:
    """What the checklist alerts read: p99 latency, throttled share, GPU framebuffer use."""
    return [_allocation_quantile(ALLOCATION_P99, 0.99), _throttled_share(), _gpu_framebuffer_used()]


def dashboard_recording_rules() -> list[RecordingRule]:
    """Read by dashboards and the rollout decision only."""
    return [
        _allocation_quantile(ALLOCATION_P50, 0.5),
        RecordingRule(ALLOCATIONS_RATE, _rate_sum(catalog.ALLOCATIONS.name, RATE_WINDOW)),
        _lts_entropy_p50(),
    ]


def recording_rules() -> list[RecordingRule]:
    return [*slo_recording_rules(), *checklist_recording_rules(), *dashboard_recording_rules()]


def recording_rule_names() -> set[str]:
    return {rule.record for rule in recording_rules()}
