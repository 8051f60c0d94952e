"""Synthetic GrowPage series generated from the catalog, for Prometheus-backed tests.

``openmetrics_history`` writes 30 minutes of every catalog metric (counters increasing, histograms
consistent: cumulative buckets, +Inf == count) for two pods, plus ``up``, DCGM's framebuffer series,
vLLM's own and vLLM's router's, for ``promtool tsdb create-blocks-from openmetrics``. ``exposition``
renders one scrape in the Prometheus text format, with chosen gauge values, for a loopback scrape target.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from growpage import catalog
from growpage.catalog import MetricSpec, MetricType
from growpage.monitoring.promql import le_value

MODEL = "qwen2.5-7b"
PODS = (("math-reasoning", "vllm-reasoning-5d8c7b9f4-x2k9q", "enforce"),
        ("chat", "vllm-chat-6f9d8c7b5-p4m2z", "monitor"))
GAUGE_VALUES = {
    catalog.UTILIZATION.name: 0.55, catalog.INTRA_PAGE_COMPRESS_RATIO.name: 1.97,
    catalog.DEMAND_P95.name: 300.0, catalog.DEMAND_PAGES.name: 600.0, catalog.COMPRESSION_RATIO.name: 1.6,
    catalog.FRAGMENTATION.name: 0.3, catalog.LIVE_TOKENS.name: 22_000.0,
    catalog.GRANTED_TOKEN_SLOTS.name: 40_000.0, catalog.USED_TOKEN_SLOTS.name: 31_428.0,
    catalog.LOGICAL_BYTES.name: 1.6e9, catalog.STORED_BYTES.name: 1.0e9,
    catalog.REQUESTS_RUNNING.name: 3.0, catalog.BUILD_INFO.name: 1.0,
    # the vLLM home's router signals (catalog.ROUTER_METRICS)
    catalog.HEADROOM_PAGES.name: 1200.0, catalog.RECLAIMABLE_PAGES.name: 200.0, catalog.ROUTER_LOAD.name: 60.0,
    # monitor's forecast of enforce (catalog.FORECAST_METRICS)
    catalog.FORECAST_SPARE_PAGES.name: 150.0,
    # growth-aware admission under enforce (catalog.ADMISSION_METRICS)
    catalog.ADMISSION_PROJECTED_PAGES.name: 3800.0, catalog.ADMISSION_LOOKAHEAD.name: 1.0,
}
POOL_PAGES = {"free": 1000.0, "reserved": 500.0, "used": 2500.0}
AGENT_ACTIVE = {"observer": "active", "enforcer": "active"}
COUNTER_RATES_PER_S = {  # per label value where the metric has one label
    catalog.COMPRESS_INPUT_BYTES.name: 2.0e6, catalog.COMPRESS_OUTPUT_BYTES.name: 1.0e6,
    catalog.ALLOCATIONS.name: 50.0, catalog.OOM_EVENTS.name: 0.01, catalog.AGENT_ERRORS.name: 0.005,
    catalog.DECISIONS.name: 2.0, catalog.SAMPLES_DROPPED.name: 0.0,
    # the vLLM home's own series (catalog.VLLM_HOME_METRICS): one step in four observed
    catalog.VLLM_DEGRADED_DECISIONS.name: 0.1, catalog.VLLM_STEPS.name: 20.0, catalog.VLLM_OBSERVED_STEPS.name: 5.0,
    catalog.VLLM_ROOM_STEPS.name: 2.0, catalog.VLLM_IDLE_STEPS.name: 4.0,
    catalog.VLLM_TRACKED_REQUESTS.name: 1.0, catalog.VLLM_OBSERVED_REQUESTS.name: 0.9,
    catalog.FORECAST_PAGES_FREED.name: 3.0, catalog.FORECAST_COMPACTIONS.name: 1.5,
    catalog.FORECAST_PREEMPTIONS.name: 0.02, catalog.FORECAST_PREEMPTIONS_AVOIDABLE.name: 0.015,
    catalog.FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION.name: 0.01,
    catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE.name: 0.004,  # 0.27 s a preemption avoided
    catalog.FORECAST_WIDER_BATCH_SECONDS.name: 0.02,
    catalog.ADMISSION_HOLDS.name: 0.5,
    # per side: 3 % of the hooked vLLM calls' seconds are GrowPage's own
    catalog.VLLM_OWN_SECONDS.name: 0.027, catalog.VLLM_STEP_SECONDS.name: 0.9,
}
HISTOGRAM_OBSERVATIONS = {  # (observations per second, typical value): a log-normal-ish spread
    catalog.ALLOCATION_LATENCY.name: (50.0, 0.004), catalog.LTS_ENTROPY.name: (2.0, 2.6),
    catalog.STS_DENSITY.name: (5.0, 0.6), catalog.REQUEST_TOKENS.name: (2.0, 700.0),
}


def pod_labels(namespace: str, pod: str) -> dict[str, str]:
    return {"job": catalog.SCRAPE_JOB, "instance": f"{pod}:8000", "namespace": namespace, "pod": pod,
            catalog.MODEL_LABEL: MODEL}


def _labels_text(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _bucket_share(bound: float, typical: float) -> float:
    """Cumulative share of observations <= bound (a smooth CDF centred on ``typical``)."""
    return 1.0 / (1.0 + (typical / bound) ** 3) if bound > 0 else 0.0


def _series(spec: MetricSpec, labels: dict[str, str], seconds: float, mode: str,
            gauges: Mapping[str, float], home: str = "vllm") -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of one metric of one pod at ``seconds`` since the start."""
    if spec.type is MetricType.INFO:
        info = {"version": "0.1.0", "home": home, "home_version": catalog.MIN_SUPPORTED_VLLM_VERSION,
                "mode": mode, "block_size": "16", "base_pages": "128", "device": "cuda"}
        assert set(info) == set(spec.exported_labels)
        yield spec.name, {**labels, **info}, 1.0
    elif spec.type is MetricType.GAUGE and spec is catalog.POOL_PAGES:
        for state, pages in POOL_PAGES.items():
            yield spec.name, {**labels, "state": state}, pages
    elif spec is catalog.AGENT_ACTIVE:
        for component, reason in AGENT_ACTIVE.items():
            yield spec.name, {**labels, "component": component, "reason": reason}, float(reason == "active")
    elif spec is catalog.DEMAND_REQUESTS:
        running = gauges[catalog.REQUESTS_RUNNING.name]
        for bound in spec.label_values["pages_le"]:
            yield spec.name, {**labels, "pages_le": bound}, running if float(bound) >= 256 else 0.0
    elif spec.type is MetricType.GAUGE:
        yield spec.name, labels, gauges[spec.name]
    elif spec.type is MetricType.COUNTER:
        label, values = next(iter(spec.label_values.items()), (None, (None,)))
        for value in values:
            extra = {label: value} if label else {}
            yield spec.name, {**labels, **extra}, round(COUNTER_RATES_PER_S[spec.name] * seconds, 3)
    else:
        per_s, typical = HISTOGRAM_OBSERVATIONS[spec.name]
        count = math.floor(per_s * seconds)
        for bound in spec.buckets:
            yield f"{spec.name}_bucket", {**labels, "le": le_value(bound)}, \
                math.floor(count * _bucket_share(bound, typical))
        yield f"{spec.name}_bucket", {**labels, "le": "+Inf"}, count
        yield f"{spec.name}_count", labels, count
        yield f"{spec.name}_sum", labels, round(count * typical, 3)


def _family(spec: MetricSpec) -> tuple[str, str]:
    """OpenMetrics family name and type (counters drop _total; info is exposed as a gauge)."""
    if spec.type is MetricType.COUNTER:
        return spec.name.removesuffix("_total"), "counter"
    return spec.name, "gauge" if spec.type is MetricType.INFO else spec.type.value


def openmetrics_history(end_s: float, duration_s: int = 1800, step_s: int = 15) -> str:
    """Every catalog metric (the vLLM home's router signals too) for both pods, ``end_s - duration_s`` ..
    ``end_s`` every ``step_s``."""
    times = [end_s - duration_s + i * step_s for i in range(duration_s // step_s + 1)]
    lines: list[str] = []
    for spec in (*catalog.METRICS, *catalog.ROUTER_METRICS, *catalog.VLLM_HOME_METRICS):
        family, kind = _family(spec)
        lines += [f"# TYPE {family} {kind}", f"# HELP {family} {spec.help}"]
        for namespace, pod, mode in PODS:
            for t in times:
                for name, labels, value in _series(spec, pod_labels(namespace, pod), t - times[0] + step_s,
                                                   mode, GAUGE_VALUES):
                    lines.append(f"{name}{_labels_text(labels)} {value} {t:.3f}")
    lines += _external_history(times)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _external_history(times: list[float]) -> list[str]:
    """``up`` per pod and DCGM framebuffer series as the dcgm-exporter's ServiceMonitor scrapes them
    (honorLabels false: the GPU's user in exported_namespace / exported_pod)."""
    lines = ["# TYPE up gauge"]
    for namespace, pod, _ in PODS:
        lines += [f"up{_labels_text(pod_labels(namespace, pod))} 1 {t:.3f}" for t in times]
        lines += [f"up{_labels_text(router_target(namespace))} 1 {t:.3f}" for t in times]
    lines += _vllm_history(times)
    lines += _router_history(times)
    for metric, mib in ((catalog.DCGM_FB_USED, 40_000), (catalog.DCGM_FB_FREE, 41_000), (catalog.DCGM_GPU_UTIL, 87)):
        lines.append(f"# TYPE {metric} gauge")
        for gpu, (namespace, pod, _) in enumerate(PODS):
            labels = {"job": "dcgm-exporter", "namespace": "gpu-operator", "pod": f"nvidia-dcgm-exporter-{gpu}",
                      "gpu": str(gpu), catalog.DCGM_MODEL_NAME_LABEL: "NVIDIA H100 80GB HBM3",
                      **{source: {"namespace": namespace, "pod": pod}[target]
                         for target, source in catalog.DCGM_EXPORTED_LABELS.items()}}
            lines += [f"{metric}{_labels_text(labels)} {mib} {t:.3f}" for t in times]
    return lines


def _vllm_history(times: list[float]) -> list[str]:
    """vLLM's own /metrics for both pods (job vllm), as its ServiceMonitor scrapes them."""
    lines = []
    gauges = {catalog.VLLM_KV_CACHE_USAGE: 0.7, catalog.VLLM_REQUESTS_RUNNING: 3, catalog.VLLM_REQUESTS_WAITING: 1}
    for metric, value in gauges.items():
        lines.append(f"# TYPE {metric} gauge")
        for namespace, pod, _ in PODS:
            labels = {**pod_labels(namespace, pod), "job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}
            lines += [f"{metric}{_labels_text(labels)} {value} {t:.3f}" for t in times]
    lines.append(f"# TYPE {catalog.VLLM_PREEMPTIONS.removesuffix('_total')} counter")
    for namespace, pod, _ in PODS:
        labels = {**pod_labels(namespace, pod), "job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}
        lines += [f"{catalog.VLLM_PREEMPTIONS}{_labels_text(labels)} {0.02 * (t - times[0]):.3f} {t:.3f}"
                  for t in times]
    finished = catalog.VLLM_REQUESTS_FINISHED
    lines.append(f"# TYPE {finished.removesuffix('_total')} counter")
    for namespace, pod, _ in PODS:
        labels = {**pod_labels(namespace, pod), "job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}
        for reason, per_s in (("stop", 4.0), ("length", 0.9), ("abort", 0.02)):
            reason_labels = {**labels, catalog.VLLM_FINISHED_REASON_LABEL: reason}
            lines += [f"{finished}{_labels_text(reason_labels)} {per_s * (t - times[0]):.3f} {t:.3f}" for t in times]
    for histogram, typical in ((catalog.VLLM_TTFT, 0.2), (catalog.VLLM_ITL, 0.03), (catalog.VLLM_QUEUE_TIME, 0.05),
                               (catalog.VLLM_E2E_LATENCY, 2.0)):
        lines.append(f"# TYPE {histogram} histogram")
        bounds = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
        for namespace, pod, _ in PODS:
            labels = {**pod_labels(namespace, pod), "job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}
            for t in times:
                count = math.floor(5.0 * (t - times[0] + 15))
                for bound in bounds:
                    bucket = {**labels, "le": le_value(bound)}
                    lines.append(f"{histogram}_bucket{_labels_text(bucket)} "
                                 f"{math.floor(count * _bucket_share(bound, typical))} {t:.3f}")
                lines.append(f"{histogram}_bucket{_labels_text({**labels, 'le': '+Inf'})} {count} {t:.3f}")
                lines.append(f"{histogram}_count{_labels_text(labels)} {count} {t:.3f}")
                lines.append(f"{histogram}_sum{_labels_text(labels)} {count * typical:.3f} {t:.3f}")
    return lines


def exposition(gauges: Mapping[str, float] | None = None, mode: str = "enforce", seconds: float = 600.0,
               home: str = "vllm") -> str:
    """One scrape of one agent in the Prometheus text format (namespace/pod come from the scrape).

    ``home`` is the build info's engine: over-granting means something only where base_pages is an
    admission grant (the reference engine)."""
    values = {**GAUGE_VALUES, **(gauges or {})}
    lines: list[str] = []
    for spec in catalog.METRICS:
        family, kind = _family(spec)
        lines += [f"# HELP {family} {spec.help}", f"# TYPE {family} {kind}"]
        for name, labels, value in _series(spec, {catalog.MODEL_LABEL: MODEL}, seconds, mode, values, home):
            lines.append(f"{name}{_labels_text(labels)} {value}")
    return "\n".join(lines) + "\n"


ROUTER_WORKERS = ("http://vllm-reasoning-0.vllm-reasoning-peers:8000", "http://vllm-reasoning-1.vllm-reasoning-peers:8000")


def _router_samples(seconds: float) -> Iterator[tuple[str, dict[str, str], float]]:
    """vLLM's router as vllm-router 0.1.17 exports it (catalog.ROUTER_SERIES_LABELS): two workers, one
    request in two hundred failing, a few client errors."""
    route = {"route": "/v1/completions"}
    yield catalog.ROUTER_ACTIVE_WORKERS, {}, float(len(ROUTER_WORKERS))
    yield catalog.ROUTER_REQUESTS, route, round(10.0 * seconds, 3)
    yield catalog.ROUTER_REQUESTS_FAILED, route, round(0.05 * seconds, 3)
    yield catalog.ROUTER_REQUEST_ERRORS, {**route, "error_type": "non_retryable_error"}, round(0.1 * seconds, 3)
    for worker in ROUTER_WORKERS:
        yield catalog.ROUTER_WORKER_HEALTH, {"worker": worker}, 1.0
        yield catalog.ROUTER_POLICY_DECISIONS, {"policy": "power_of_two", "worker": worker}, round(5.0 * seconds, 3)
        yield catalog.ROUTER_PROCESSED_REQUESTS, {"worker": worker}, round(5.1 * seconds, 3)
        yield catalog.ROUTER_RUNNING_REQUESTS, {"worker": worker}, 2.0
        yield catalog.ROUTER_CIRCUIT_STATE, {"worker": worker}, 0.0


def router_target(namespace: str) -> dict[str, str]:
    """The scrape labels of the router pod in ``namespace`` (job vllm-router)."""
    return {"job": catalog.ROUTER_SCRAPE_JOB, "instance": f"10.42.1.{len(namespace)}:{catalog.ROUTER_METRICS_PORT}",
            "namespace": namespace, "pod": f"vllm-router-6b8f9c7d5-{namespace[:4]}"}


def _router_history(times: list[float]) -> list[str]:
    """The router's series, for a router pod in each pod's namespace."""
    lines: list[str] = []
    for namespace, _, _ in PODS:
        target = router_target(namespace)
        for t in times:
            for name, labels, value in _router_samples(t - times[0] + 15):
                lines.append(f"{name}{_labels_text({**target, **labels})} {value} {t:.3f}")
    return _grouped_by_family(lines)


def _grouped_by_family(lines: list[str]) -> list[str]:
    """OpenMetrics wants one family's samples together, after its TYPE line."""
    families: dict[str, list[str]] = {}
    for line in lines:
        name = line.split("{", 1)[0]
        families.setdefault(name, []).append(line)
    out: list[str] = []
    for name, samples in families.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        family = name.removesuffix("_total") if kind == "counter" else name
        out += [f"# TYPE {family} {kind}", *samples]
    return out
