"""Realistic GrowPage (and DCGM) expositions for diagnose tests, built from the catalog's names.

A :class:`Scenario` says what a deployment does per second (grants, decisions, OOMs, finished
requests with their lengths and entropies) and what its gauges read. :func:`samples` turns it into
the series an agent would export after ``elapsed_s`` seconds of uptime; :func:`text_exposition`
writes them in the Prometheus text format (what ``/metrics/growpage`` serves) and
:func:`openmetrics_backfill` writes many timestamps for ``promtool tsdb create-blocks-from``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from growpage import catalog

MODEL = "smollm2-135m"
UPTIME_AT_START_S = 3600.0  # counters are not 0 at the first snapshot: the agent has been running


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One deployment's behaviour; histogram ``*_shares`` map a bucket bound to a share of events."""

    utilization: tuple[float, ...] = (0.76, 0.80)  # cycled through successive samples
    fragmentation: tuple[float, ...] = (0.12,)
    compress_input_bytes_per_s: float = 2.6e6
    compress_output_bytes_per_s: float = 1.0e6
    compress_ratio_gauge: float = 2.6
    grants_per_s: float = 50.0
    latency_shares: Mapping[float, float] = dataclasses.field(default_factory=lambda: {
        0.001: 0.60, 0.0025: 0.30, 0.005: 0.08, 0.01: 0.019, 0.015: 0.001})
    decisions_per_s: Mapping[str, float] = dataclasses.field(default_factory=lambda: {
        "allocate": 10.0, "quantize": 5.0, "evict": 2.0, "denied": 0.0, "throttled": 1.0, "preempt": 0.0})
    oom_per_s: float = 0.0
    pool_pages: Mapping[str, float] = dataclasses.field(default_factory=lambda: {
        "free": 2000.0, "reserved": 400.0, "used": 1600.0})
    finished_per_s: float = 4.0
    entropy_shares: Mapping[float, float] = dataclasses.field(default_factory=lambda: {
        1.5: 0.1, 2.0: 0.3, 2.1: 0.2, 2.5: 0.3, 3.0: 0.1})
    tokens_shares: Mapping[float, float] = dataclasses.field(default_factory=lambda: {
        256: 0.2, 512: 0.3, 1024: 0.3, 2048: 0.2})
    requests_running: float = 24.0
    errors_per_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    build: Mapping[str, str] = dataclasses.field(default_factory=lambda: {
        "version": "0.1.0", "home": "vllm", "home_version": "0.32.1", "mode": "enforce",
        "block_size": "32", "base_pages": "64", "device": "cuda"})
    granted_token_slots: float = 100_000.0  # live tokens = utilization x this; used = live / (1 - fragmentation)
    components: Mapping[str, str] = dataclasses.field(default_factory=lambda: {
        "observer": "active", "enforcer": "active"})
    drop: frozenset[str] = frozenset()  # metric names (catalog names) the agent does not export
    # monitor's forecast of enforce: counter rates by catalog name (none: the agent exports no forecast), and
    # GrowPage's own seconds per second on each side beside the hooked vLLM calls' (None: not exported)
    forecast_per_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    own_seconds_per_s: float | None = None
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_framebuffer_used_mib: tuple[float, ...] = (60000.0,)
    gpu_framebuffer_total_mib: float = 81559.0
    # vLLM's own /metrics (saved into the same snapshot file, served at /metrics by the test server).
    ttft_shares: Mapping[float, float] = dataclasses.field(default_factory=lambda: {0.25: 0.6, 1.0: 0.4})
    itl_shares: Mapping[float, float] = dataclasses.field(default_factory=lambda: {0.025: 0.7, 0.05: 0.3})
    vllm_requests_per_s: float = 4.0
    vllm_preemptions_per_s: float = 0.0
    vllm_kv_usage: float = 0.6
    vllm_waiting: float = 0.0

    def replace(self, **changes) -> Scenario:
        return dataclasses.replace(self, **changes)


HEALTHY = Scenario()
OVER_GRANTING = Scenario(
    utilization=(0.30, 0.34),
    tokens_shares={128: 0.1, 256: 0.3, 512: 0.4, 1024: 0.15, 2048: 0.05},
    # Reserved-but-empty admission grants: the reference engine, where base_pages is a grant.
    build={**HEALTHY.build, "home": "reference", "mode": "monitor", "block_size": "16", "base_pages": "128"},
    compress_input_bytes_per_s=0.0, compress_output_bytes_per_s=0.0, compress_ratio_gauge=0.0,
    gpu_model="NVIDIA A100-SXM4-80GB")
LATENCY = Scenario(
    latency_shares={0.005: 0.5, 0.01: 0.2, 0.015: 0.15, 0.02: 0.05, 0.05: 0.08, 0.1: 0.02},
    decisions_per_s={**HEALTHY.decisions_per_s, "allocate": 10.0, "throttled": 15.0},
    build={**HEALTHY.build, "block_size": "16"})
# Preemptions while the pool has no free page and two thirds of its granted slots hold no live token.
OOM_FRAGMENTATION = Scenario(
    oom_per_s=0.1, decisions_per_s={**HEALTHY.decisions_per_s, "preempt": 0.2}, fragmentation=(0.55, 0.62),
    utilization=(0.36, 0.34), pool_pages={"free": 20.0, "reserved": 1500.0, "used": 2480.0},
    build={**HEALTHY.build, "home": "reference", "mode": "monitor", "block_size": "16", "base_pages": "128"},
    compress_input_bytes_per_s=0.0, compress_output_bytes_per_s=0.0, compress_ratio_gauge=0.0,
    gpu_model="NVIDIA A100-SXM4-80GB", gpu_framebuffer_used_mib=(48000.0, 50000.0),
    gpu_framebuffer_total_mib=81920.0)
AGENT_ERRORS = Scenario(errors_per_s={"policy": 0.05, "tracing": 0.0})
COMPRESS_INT8 = Scenario(compress_input_bytes_per_s=1.97e6, compress_output_bytes_per_s=1.0e6,
                         compress_ratio_gauge=1.97)
PHASE_TWO_CANDIDATE = Scenario(
    entropy_shares={2.5: 0.2, 3.0: 0.5, 3.5: 0.3}, build={**HEALTHY.build, "mode": "monitor"},
    compress_input_bytes_per_s=0.0, compress_output_bytes_per_s=0.0, compress_ratio_gauge=0.0)
MIXED = OVER_GRANTING.replace(latency_shares=LATENCY.latency_shares, oom_per_s=0.1,
                              fragmentation=(0.55, 0.62), gpu_framebuffer_used_mib=(48000.0,),
                              pool_pages=OOM_FRAGMENTATION.pool_pages)
# What users feel: 5 % of first tokens after 2.5 s is a 5x burn of a 1 % budget over the window;
# 8 % is past the fast-burn line (6x).
SLOW_FIRST_TOKENS = HEALTHY.replace(ttft_shares={1.0: 0.92, 5.0: 0.08})
# GrowPage switched off: the route still answers with build info; nothing it reports is a finding.
MODE_OFF = SLOW_FIRST_TOKENS.replace(build={**HEALTHY.build, "mode": "off"}, compress_input_bytes_per_s=0.0,
                                     compress_output_bytes_per_s=0.0, components={"observer": "mode_off",
                                                                                  "enforcer": "mode_off"})
NO_LATENCY_HISTOGRAM = HEALTHY.replace(drop=frozenset({catalog.ALLOCATION_LATENCY.name}))
IDLE = HEALTHY.replace(grants_per_s=0.0, requests_running=0.0, utilization=(0.0,),
                       decisions_per_s=dict.fromkeys(catalog.DECISION_KINDS, 0.0), finished_per_s=0.0,
                       compress_input_bytes_per_s=0.0, compress_output_bytes_per_s=0.0, vllm_requests_per_s=0.0)


@dataclasses.dataclass(frozen=True)
class Series:
    family: str  # TYPE/HELP name
    type: str  # gauge, counter, histogram
    name: str  # sample name
    labels: Mapping[str, str]
    value: float


def _cumulative(shares: Mapping[float, float], bounds: Sequence[float], events: float) -> list[tuple[str, float]]:
    rows, running = [], 0.0
    for bound in bounds:
        running += sum(share for at, share in shares.items() if at == bound)
        rows.append((_bound(bound), running * events))
    rows.append(("+Inf", sum(shares.values()) * events))
    return rows


def _bound(bound: float) -> str:
    return repr(float(bound))


def _histogram(spec: catalog.MetricSpec, shares: Mapping[float, float], events: float,
               labels: Mapping[str, str]) -> list[Series]:
    assert set(shares) <= set(spec.buckets), f"{spec.name}: shares must sit on bucket bounds"
    rows = [Series(spec.name, "histogram", f"{spec.name}_bucket", {**labels, "le": le}, count)
            for le, count in _cumulative(shares, spec.buckets, events)]
    total = sum(share * bound for bound, share in shares.items()) * events  # every event at its bound
    rows += [Series(spec.name, "histogram", f"{spec.name}_sum", labels, total),
             Series(spec.name, "histogram", f"{spec.name}_count", labels, sum(shares.values()) * events)]
    return rows


def samples(scenario: Scenario, elapsed_s: float, sample_index: int = 0,
            extra_labels: Mapping[str, str] | None = None) -> list[Series]:
    """Series an agent running ``scenario`` exports ``elapsed_s`` after the first snapshot."""
    uptime_s = UPTIME_AT_START_S + elapsed_s
    labels = {catalog.MODEL_LABEL: MODEL, **(extra_labels or {})}
    c = catalog

    def pick(values: Sequence[float]) -> float:
        return values[sample_index % len(values)]

    def gauge(spec, value, **more):
        return [Series(spec.name, "gauge", spec.name, {**labels, **more}, value)]

    def counter(spec, value, **more):
        return [Series(spec.name, "counter", spec.name, {**labels, **more}, value)]

    rows = [
        *gauge(c.UTILIZATION, pick(scenario.utilization)),
        *gauge(c.INTRA_PAGE_COMPRESS_RATIO, scenario.compress_ratio_gauge),
        *counter(c.COMPRESS_INPUT_BYTES, scenario.compress_input_bytes_per_s * uptime_s),
        *counter(c.COMPRESS_OUTPUT_BYTES, scenario.compress_output_bytes_per_s * uptime_s),
        *_histogram(c.ALLOCATION_LATENCY, scenario.latency_shares, scenario.grants_per_s * uptime_s, labels),
        *counter(c.ALLOCATIONS, scenario.grants_per_s * uptime_s),
        *[row for kind in c.DECISION_KINDS
          for row in counter(c.DECISIONS, scenario.decisions_per_s.get(kind, 0.0) * uptime_s, decision=kind)],
        *gauge(c.DEMAND_P95, 80.0),
        *gauge(c.COMPRESSION_RATIO, 1.4),
        *gauge(c.FRAGMENTATION, pick(scenario.fragmentation)),
        *gauge(c.LIVE_TOKENS, pick(scenario.utilization) * scenario.granted_token_slots),
        *gauge(c.GRANTED_TOKEN_SLOTS, scenario.granted_token_slots),
        *gauge(c.USED_TOKEN_SLOTS, pick(scenario.utilization) * scenario.granted_token_slots
               / (1 - pick(scenario.fragmentation))),
        *[row for component, reason in scenario.components.items()
          for row in gauge(c.AGENT_ACTIVE, float(reason == "active"), component=component, reason=reason)],
        *[row for state, pages in scenario.pool_pages.items() for row in gauge(c.POOL_PAGES, pages, state=state)],
        *_histogram(c.LTS_ENTROPY, scenario.entropy_shares, scenario.finished_per_s * uptime_s, labels),
        *_histogram(c.STS_DENSITY, {0.5: 0.6, 0.75: 0.4}, scenario.finished_per_s * 10 * uptime_s, labels),
        *gauge(c.REQUESTS_RUNNING, scenario.requests_running),
        *counter(c.OOM_EVENTS, scenario.oom_per_s * uptime_s),
        *[row for component, per_s in scenario.errors_per_s.items()
          for row in counter(c.AGENT_ERRORS, per_s * uptime_s, component=component)],
        *gauge(c.BUILD_INFO, 1.0, **scenario.build),
        *_histogram(c.REQUEST_TOKENS, scenario.tokens_shares, scenario.finished_per_s * uptime_s, labels),
        *[row for name, per_s in scenario.forecast_per_s.items()
          for row in [Series(name, "counter", name, labels, per_s * uptime_s)]],
        *[row for side in c.OWN_TIME_SIDES if scenario.own_seconds_per_s is not None
          for row in (*counter(c.VLLM_OWN_SECONDS, scenario.own_seconds_per_s * uptime_s, side=side),
                      *counter(c.VLLM_STEP_SECONDS, 0.5 * uptime_s, side=side))],
    ]
    return [row for row in rows if row.family not in scenario.drop]


# vLLM 0.32's default bucket bounds (vllm/v1/metrics/buckets.py) for the two histograms read here.
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)


def vllm_samples(scenario: Scenario, elapsed_s: float, extra_labels: Mapping[str, str] | None = None) -> list[Series]:
    """Series vLLM's own /metrics exports for ``scenario`` (its names, its ``engine`` label)."""
    uptime_s = UPTIME_AT_START_S + elapsed_s
    labels = {catalog.MODEL_LABEL: MODEL, "engine": "0", **(extra_labels or {})}
    requests = scenario.vllm_requests_per_s * uptime_s
    rows: list[Series] = []
    for name, buckets, shares, events in ((catalog.VLLM_TTFT, VLLM_TTFT_BUCKETS, scenario.ttft_shares, requests),
                                          (catalog.VLLM_ITL, VLLM_ITL_BUCKETS, scenario.itl_shares, requests * 100)):
        assert set(shares) <= set(buckets), f"{name}: shares must sit on bucket bounds"
        rows += [Series(name, "histogram", f"{name}_bucket", {**labels, "le": le}, count)
                 for le, count in _cumulative(shares, buckets, events)]
        rows += [Series(name, "histogram", f"{name}_sum", labels, sum(b * v for b, v in shares.items()) * events),
                 Series(name, "histogram", f"{name}_count", labels, sum(shares.values()) * events)]
    preemptions = catalog.VLLM_PREEMPTIONS.removesuffix("_total")
    return [*rows,
            Series(preemptions, "counter", catalog.VLLM_PREEMPTIONS, labels,
                   scenario.vllm_preemptions_per_s * uptime_s),
            Series(catalog.VLLM_KV_CACHE_USAGE, "gauge", catalog.VLLM_KV_CACHE_USAGE, labels, scenario.vllm_kv_usage),
            Series(catalog.VLLM_REQUESTS_WAITING, "gauge", catalog.VLLM_REQUESTS_WAITING, labels,
                   scenario.vllm_waiting)]


def dcgm_samples(scenario: Scenario, sample_index: int = 0,
                 extra_labels: Mapping[str, str] | None = None) -> list[Series]:
    used = scenario.gpu_framebuffer_used_mib[sample_index % len(scenario.gpu_framebuffer_used_mib)]
    labels = {"gpu": "0", "UUID": "GPU-5f1e8c2a-0000-4000-8000-000000000000", "device": "nvidia0",
              catalog.DCGM_MODEL_NAME_LABEL: scenario.gpu_model, "Hostname": "gpu-node-1", **(extra_labels or {})}
    return [Series(catalog.DCGM_FB_FREE, "gauge", catalog.DCGM_FB_FREE, labels,
                   scenario.gpu_framebuffer_total_mib - used),
            Series(catalog.DCGM_FB_USED, "gauge", catalog.DCGM_FB_USED, labels, used)]


def _labels(labels: Mapping[str, str]) -> str:
    escaped = (f'{key}="{_escape(value)}"' for key, value in labels.items())
    return "{" + ",".join(escaped) + "}" if labels else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def text_exposition(rows: Iterable[Series], snapshot_time_s: float | None = None) -> str:
    """Prometheus text format 0.0.4 (HELP/TYPE per family), optionally with the snapshot-time line."""
    lines = [] if snapshot_time_s is None else [f"# growpage-snapshot-time: {snapshot_time_s:.3f}"]
    seen: set[str] = set()
    for row in rows:
        if row.family not in seen:
            seen.add(row.family)
            spec = catalog.METRICS_BY_NAME.get(row.family)
            help_text = spec.help if spec else f"{row.family} ({'vLLM' if row.family.startswith('vllm:') else 'DCGM'})"
            lines += [f"# HELP {row.family} {help_text}", f"# TYPE {row.family} {row.type}"]
        lines.append(f"{row.name}{_labels(row.labels)} {_value(row.value)}")
    return "\n".join(lines) + "\n"


def write_snapshots(directory: Path, scenario: Scenario, start_s: float = 1_714_557_600.0,
                    interval_s: float = 60.0, count: int = 2, dcgm: bool = True,
                    separate_dcgm: bool = False, vllm: bool = True) -> list[Path]:
    """``count`` agent snapshots ``interval_s`` apart (and DCGM ones), each with its time line; vLLM's
    own /metrics goes into the agent's file, as the documentation says to save it."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        time_s = start_s + index * interval_s
        rows = [*samples(scenario, index * interval_s, index),
                *(vllm_samples(scenario, index * interval_s) if vllm else [])]
        gpu = dcgm_samples(scenario, index) if dcgm else []
        if separate_dcgm and gpu:
            gpu_path = directory / f"dcgm-{index + 1}.prom"
            gpu_path.write_text(text_exposition(gpu, time_s), encoding="utf-8")
            paths.append(gpu_path)
            gpu = []
        path = directory / f"agent-{index + 1}.prom"
        path.write_text(text_exposition([*rows, *gpu], time_s), encoding="utf-8")
        paths.append(path)
    return paths


def openmetrics_backfill(targets: Mapping[tuple[str, str], Scenario], start_s: float, end_s: float,
                         step_s: float = 15.0) -> str:
    """OpenMetrics with timestamps for ``promtool tsdb create-blocks-from openmetrics``.

    ``targets`` maps ``(namespace, pod)`` to the scenario that pod runs; every series also gets the
    scrape's ``job``/``instance`` labels and an ``up`` series, as Prometheus would store them.
    """
    times = [start_s + i * step_s for i in range(int((end_s - start_s) // step_s) + 1)]
    families: dict[str, tuple[str, list[str]]] = {}
    for (namespace, pod), scenario in targets.items():
        scrape = {"job": catalog.SCRAPE_JOB, "instance": f"{pod}:8000", "namespace": namespace, "pod": pod}
        for index, at in enumerate(times):
            elapsed = at - start_s
            # As dcgm-exporter's own ServiceMonitor stores them (honorLabels false): namespace/pod
            # name the exporter's pod, exported_namespace/exported_pod the pod using the GPU.
            exporter = {"job": "dcgm-exporter", "instance": "10.0.0.9:9400", "namespace": "gpu-operator",
                        "pod": "nvidia-dcgm-exporter-x2k9q", "exported_namespace": namespace, "exported_pod": pod}
            vllm_scrape = {**scrape, "job": catalog.VLLM_SCRAPE_JOB}
            rows = [*samples(scenario, elapsed, index, scrape), *dcgm_samples(scenario, index, exporter),
                    *vllm_samples(scenario, elapsed, vllm_scrape), Series("up", "gauge", "up", scrape, 1.0)]
            for row in rows:
                family = row.family.removesuffix("_total") if row.type == "counter" else row.family
                families.setdefault(family, (row.type, []))[1].append(
                    f"{row.name}{_labels(row.labels)} {_value(row.value)} {at:.3f}")
    lines = []
    for family, (kind, family_lines) in families.items():
        lines.append(f"# TYPE {family} {kind}")
        lines += _group_by_series(family_lines)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _group_by_series(lines: list[str]) -> list[str]:
    # Keep each series' samples together and in time order (they were appended time-major).
    by_series: dict[str, list[str]] = {}
    for line in lines:
        by_series.setdefault(line.rsplit(" ", 2)[0], []).append(line)
    return [line for series_lines in by_series.values() for line in series_lines]
