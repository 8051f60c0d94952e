"""The one source of truth for GrowPage's metrics, SLOs and troubleshooting thresholds.

Plain data, no prometheus import: telemetry builds its collector from it, and dashboards, alert
rules, runbooks and ``gpctl diagnose`` read the same names, help texts, buckets and thresholds, so
they cannot drift apart. Contract: ``shared/design/METRICS.md`` (v1). Names from the seed that users
already wrote into HPA rules and dashboards are kept verbatim.
"""

from __future__ import annotations

import dataclasses
import enum

METRICS_PATH = "/metrics/growpage"
SCRAPE_JOB = "vllm-growpage"  # the seed's job name
MODEL_LABEL = "model"  # on every series; namespace/pod come from the scrape


class MetricType(str, enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"  # exposed as a gauge = 1 named *_info


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract.

    Attributes:
        name: full exposition name (counters include ``_total``, as Prometheus queries them).
        type: gauge, counter, histogram or info.
        help: the HELP text.
        unit: base unit or range, for docs and dashboards (``ratio``, ``seconds``, ``bytes``...).
        labels: label names besides ``model``; values must come from a bounded set.
        buckets: histogram upper bounds (``+Inf`` implied).
        label_values: the bounded value set of each label, where it is known up front.
    """

    name: str
    type: MetricType
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    label_values: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def series_names(self) -> tuple[str, ...]:
        """Names the series appear under in Prometheus (histograms expand into three)."""
        if self.type is MetricType.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


DECISION_KINDS = ("allocate", "quantize", "evict", "denied", "throttled", "preempt")
POOL_STATES = ("free", "reserved", "used")
ERROR_COMPONENTS = ("policy", "actuator", "observer", "summaries", "listener", "collector", "tracing",
                    "plugin")
ALLOCATION_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1.0)
LTS_ENTROPY_BUCKETS_NATS = (0.5, 1.0, 1.5, 2.0, 2.1, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)
STS_DENSITY_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.7, 0.75, 0.875, 1.0)
REQUEST_TOKENS_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


UTILIZATION = MetricSpec(
    "growpage_kv_page_utilization", MetricType.GAUGE,
    "Live KV tokens / token slots of granted pages (reserved + used). SLO >= 0.65.", "ratio")
INTRA_PAGE_COMPRESS_RATIO = MetricSpec(
    "growpage_intra_page_compress_ratio", MetricType.GAUGE,
    "Bytes in / bytes out of the compressions since the previous scrape (scales included). SLO >= 2.0.",
    "ratio")
COMPRESS_INPUT_BYTES = MetricSpec(
    "growpage_compress_input_bytes_total", MetricType.COUNTER,
    "Bytes read by compressions (quantized pages, eviction candidates).", "bytes")
COMPRESS_OUTPUT_BYTES = MetricSpec(
    "growpage_compress_output_bytes_total", MetricType.COUNTER,
    "Bytes written by compressions, scales included.", "bytes")
ALLOCATION_LATENCY = MetricSpec(
    "growpage_page_allocation_latency_seconds", MetricType.HISTOGRAM,
    "Time to grant pages to a request (admission grant or one growth page). SLO: 99% under 15 ms.",
    "seconds", buckets=ALLOCATION_LATENCY_BUCKETS_S)
ALLOCATIONS = MetricSpec(
    "growpage_kv_page_allocations_total", MetricType.COUNTER,
    "Pages granted to requests (admission grants and growth); the seed's HPA metric.", "pages")
DECISIONS = MetricSpec(
    "growpage_decisions_total", MetricType.COUNTER,
    "Page-boundary decisions by kind (denied/throttled count refused allocations).", "",
    labels=("decision",), label_values={"decision": DECISION_KINDS})
DEMAND_P95 = MetricSpec(
    "growpage_kv_demand_p95", MetricType.GAUGE,
    "p95 of running requests' capacity boundaries, in pages.", "pages")
COMPRESSION_RATIO = MetricSpec(
    "growpage_compression_ratio", MetricType.GAUGE,
    "Logical KV bytes / stored KV bytes across the pool (1 = nothing saved).", "ratio")
FRAGMENTATION = MetricSpec(
    "growpage_page_table_fragmentation", MetricType.GAUGE,
    "1 - live tokens / token slots of used pages: tail slack and eviction holes.", "ratio")
POOL_PAGES = MetricSpec(
    "growpage_pool_pages", MetricType.GAUGE, "Pages in the pool by state.", "pages",
    labels=("state",), label_values={"state": POOL_STATES})
LTS_ENTROPY = MetricSpec(
    "growpage_lts_entropy", MetricType.HISTOGRAM,
    "Per-request long-term attention entropy at finish (the seed's lts_entropy_distribution).", "nats",
    buckets=LTS_ENTROPY_BUCKETS_NATS)
STS_DENSITY = MetricSpec(
    "growpage_sts_density_ratio", MetricType.HISTOGRAM,
    "Short-term attention density at each page-boundary decision.", "ratio", buckets=STS_DENSITY_BUCKETS)
REQUESTS_RUNNING = MetricSpec(
    "growpage_requests_running", MetricType.GAUGE, "Requests the agent tracks.", "requests")
OOM_EVENTS = MetricSpec(
    "growpage_oom_events_total", MetricType.COUNTER,
    "Allocation failures that forced a preemption or an error.", "events")
AGENT_ERRORS = MetricSpec(
    "growpage_agent_errors_total", MetricType.COUNTER,
    "Faults caught inside GrowPage (it falls back to the engine's default and never takes it down).",
    "errors", labels=("component",), label_values={"component": ERROR_COMPONENTS})
BUILD_INFO = MetricSpec(
    "growpage_build_info", MetricType.INFO,
    "GrowPage build and deployment settings (value 1); diagnose reads these instead of guessing.", "",
    labels=("version", "engine", "engine_version", "mode", "block_size", "base_pages", "device"))
REQUEST_TOKENS = MetricSpec(
    "growpage_request_tokens", MetricType.HISTOGRAM,
    "Tokens a request had seen (prompt + generated) when it finished; sizes base_pages.", "tokens",
    buckets=REQUEST_TOKENS_BUCKETS)

METRICS: tuple[MetricSpec, ...] = (
    UTILIZATION, INTRA_PAGE_COMPRESS_RATIO, COMPRESS_INPUT_BYTES, COMPRESS_OUTPUT_BYTES,
    ALLOCATION_LATENCY, ALLOCATIONS, DECISIONS, DEMAND_P95, COMPRESSION_RATIO, FRAGMENTATION,
    POOL_PAGES, LTS_ENTROPY, STS_DENSITY, REQUESTS_RUNNING, OOM_EVENTS, AGENT_ERRORS, BUILD_INFO,
    REQUEST_TOKENS,
)
METRICS_BY_NAME = {spec.name: spec for spec in METRICS}


@dataclasses.dataclass(frozen=True)
class SLO:
    """A service-level objective from the seed, with the metric that measures it."""

    name: str
    metric: str
    objective: float
    description: str


SLO_UTILIZATION = SLO("kv_page_utilization", UTILIZATION.name, 0.65,
                      "Granted KV pages hold live tokens: utilization >= 65 %.")
SLO_COMPRESS_RATIO = SLO("intra_page_compress_ratio", INTRA_PAGE_COMPRESS_RATIO.name, 2.0,
                         "Compressions halve the bytes they touch: ratio >= 2.0x (INT8 alone cannot "
                         "reach it once scales count; INT4 or eviction can).")
SLO_ALLOCATION_LATENCY = SLO("page_allocation_latency", ALLOCATION_LATENCY.name, 0.99,
                             "99 % of page grants complete in under 15 ms.")
ALLOCATION_LATENCY_SLO_THRESHOLD_S = 0.015
SLOS = (SLO_UTILIZATION, SLO_COMPRESS_RATIO, SLO_ALLOCATION_LATENCY)


@dataclasses.dataclass(frozen=True)
class ChecklistThresholds:
    """The seed's troubleshooting checklist, as numbers (diagnose and alerts read these)."""

    utilization_sustained_low: float = 0.40  # over-granting: base_pages too large
    allocation_latency_p99_critical_s: float = 0.020  # block size vs GPU
    gpu_framebuffer_used_low: float = 0.80  # OOM while the GPU is not full -> fragmentation
    fragmentation_high: float = 0.50
    rollout_entropy: float = 2.5  # phase-2 candidates: LTS p50 above this while not enforced
    throttle_saturation: float = 0.5  # throttled / (allocate + throttled) sustained above this


CHECKLIST = ChecklistThresholds()

# GrowPage's own guidance (not a vLLM rule): a page of block_size tokens per GPU generation.
RECOMMENDED_BLOCK_SIZE_BY_GPU = {"A100": 16, "H100": 32, "H200": 32}

# The oldest vLLM release the plugin supports: remediation advice names this, never the seed's
# fictional "vLLM >= v0.6.3 GrowPage patch" (no vLLM release contains GrowPage).
MIN_SUPPORTED_VLLM_VERSION = "0.32.0"

# Runbook pages live in the repository under runbooks/<alert name>.md.
RUNBOOK_BASE_URL = "https://github.com/growpage/growpage/blob/main/runbooks"


# ---------------------------------------------------------------------------------------------
# gpctl diagnose (added for issue 6). Thresholds the seed's checklist leaves implicit, the DCGM
# exporter names diagnose reads next to the agent's, and one runbook page per diagnose check.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DiagnoseThresholds:
    """Numbers ``gpctl diagnose`` needs beyond :data:`CHECKLIST` (the seed gives none for these)."""

    # "Free pages near 0": the lowest free share of the pool in the window at or under this.
    pool_free_low_fraction: float = 0.02
    # Prometheus: the agent's newest sample older than this means its scrape is failing.
    scrape_stale_s: float = 120.0
    # Endpoint: a /metrics/growpage response slower than this risks Prometheus scrape timeouts.
    endpoint_slow_response_s: float = 2.0


DIAGNOSE_THRESHOLDS = DiagnoseThresholds()

# NVIDIA DCGM exporter series (framebuffer in MiB) and the label that names the GPU model.
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_MODEL_NAME_LABEL = "modelName"

# Runbook page (under RUNBOOK_BASE_URL) for each ``gpctl diagnose`` check id. Stable names owned by
# diagnose; the lead reconciles them with the alert runbooks (runbooks/<AlertName>.md).
CHECK_RUNBOOKS = {
    "slo-utilization": "GrowPageKVUtilizationLow.md",
    "slo-compress-ratio": "GrowPageCompressRatioLow.md",
    "slo-allocation-latency": "GrowPageAllocationLatencySlowBurn.md",
    "over-granting": "GrowPageKVUtilizationCritical.md",
    "allocation-latency": "GrowPageAllocationLatencyHigh.md",
    "oom-fragmentation": "GrowPageOOMWithFreeGPUMemory.md",
    "rollout": "README.md#the-levers-staged-rollout",
    "agent-health": "GrowPageAgentErrors.md",
}


# ---------------------------------------------------------------------------------------------
# Telemetry (added for issue 4).
# ---------------------------------------------------------------------------------------------

# Trace names of the contract (METRICS.md "Spans"): request ids and page counts live on spans, never
# on metric labels. Telemetry emits these; docs and diagnose may search for them.
SPAN_REQUEST = "growpage.request"  # one per request, admission to release
SPAN_COMPRESS = "growpage.compress"  # child, only when the request span is sampled
SPAN_ALLOCATE = "growpage.allocate"  # child, only when the request span is sampled
EVENT_DECISION = "growpage.decision"  # span event per page-boundary decision
# The histogram whose buckets carry exemplars (trace_id, span_id) when tracing is on.
EXEMPLAR_METRICS = (ALLOCATION_LATENCY.name,)

# --- Alerting and autoscaling (read by growpage.monitoring: rules, dashboards, Alertmanager, deploy) ---
# Like kubernetes-mixin's config.libsonnet: every duration and threshold an alert uses lives here.

SEVERITY_PAGE = "critical"  # routed to the pager receiver
SEVERITY_TICKET = "warning"  # routed to the ticket/chat receiver


@dataclasses.dataclass(frozen=True)
class AlertDurations:
    """How long a condition must hold before its alert fires (Prometheus ``for:`` durations).

    Long enough that one bursty window does not wake anyone; the checklist's "sustained" low
    utilization is an hour, because over-granting wastes capacity but hurts no request right away.
    """

    utilization_below_slo: str = "30m"
    utilization_sustained_low: str = "1h"
    compress_ratio_below_slo: str = "30m"
    allocation_latency_p99_high: str = "10m"
    fragmentation_high: str = "15m"
    oom_with_free_gpu_memory: str = "5m"
    agent_down: str = "5m"
    metrics_absent: str = "10m"
    agent_errors: str = "15m"
    growth_throttled: str = "30m"


ALERT_FOR = AlertDurations()


@dataclasses.dataclass(frozen=True)
class BurnRateWindow:
    """A long and a short window that must both burn the error budget ``factor`` times too fast.

    The short window makes the alert reset soon after the burn stops (Google SRE workbook, ch. 5).
    """

    long_window: str
    short_window: str
    factor: float


@dataclasses.dataclass(frozen=True)
class BurnRateAlert:
    """One alert over several windows, ORed: the workbook's recommended multi-window form."""

    speed: str  # "fast" pages, "slow" makes a ticket; part of the alert name
    severity: str
    for_duration: str
    windows: tuple[BurnRateWindow, ...]


ALLOCATION_LATENCY_BURN_RATE_ALERTS = (
    # 2 % of a 30-day budget in 1 h, or 5 % in 6 h: someone should look now.
    BurnRateAlert("fast", SEVERITY_PAGE, "2m",
                  (BurnRateWindow("1h", "5m", 14.4), BurnRateWindow("6h", "30m", 6.0))),
    # 10 % in 1 day, or 10 % in 3 days: a ticket for working hours.
    BurnRateAlert("slow", SEVERITY_TICKET, "1h",
                  (BurnRateWindow("1d", "2h", 3.0), BurnRateWindow("3d", "6h", 1.0))),
)
SLO_COMPLIANCE_WINDOW = "30d"  # the window an error budget is counted over (dashboards)

# GPU framebuffer (DCGM_FB_USED / DCGM_FB_FREE above), for "OOM while the GPU is not full". With the
# dcgm-exporter's own ServiceMonitor (honorLabels false, its default) the pod that uses a GPU is in
# exported_namespace / exported_pod, because namespace / pod name the exporter's pod. Rules map
# them back; with honorLabels true the labels are already namespace / pod and are kept.
DCGM_EXPORTED_LABELS = {"namespace": "exported_namespace", "pod": "exported_pod"}

# The seed's HPA: scale out above 1,200 granted pages per pod per second (prometheus-adapter
# serves the counter's rate under the counter's own name, so the seed's HPA works verbatim).
HPA_TARGET_ALLOCATIONS_PER_POD_PER_S = 1200
