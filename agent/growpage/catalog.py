"""The one source of truth for GrowPage's metrics, SLOs and troubleshooting thresholds.

Plain data, no prometheus import: telemetry builds its collector from it, and dashboards, alert
rules, runbooks and ``gpctl diagnose`` read the same names, help texts, buckets and thresholds, so
they cannot drift apart. The contract's prose is ``docs/TELEMETRY.md``. Names users already wrote into
alert rules and dashboards are kept verbatim.
"""

from __future__ import annotations

import dataclasses
import enum

METRICS_PATH = "/metrics/growpage"
SCRAPE_JOB = "vllm-growpage"  # the Prometheus job of /metrics/growpage (ServiceMonitor jobLabel)
# On every series, named as vLLM names it on its own ``vllm:*`` series, so the two join on
# (namespace, pod, model_name) without label_replace. namespace/pod come from the scrape.
MODEL_LABEL = "model_name"


class MetricType(enum.StrEnum):
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
        labels: label names besides ``model_name``, as the agent's state keys them; values must
            come from a bounded set. Prometheus sees :attr:`exported_labels`.
        buckets: histogram upper bounds (``+Inf`` implied).
        label_values: the bounded value set of each label, where it is known up front.
        label_exports: agent-side label -> exported name, where the two differ (build info keeps
            ``engine`` inside the agent but exports ``home``: vLLM's own series already carry an
            ``engine`` label, and a join would collide on it).
    """

    name: str
    type: MetricType
    help: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    label_values: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    label_exports: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def exported_labels(self) -> tuple[str, ...]:
        """Label names as Prometheus sees them (besides ``model_name``), in :attr:`labels` order."""
        return tuple(self.label_exports.get(label, label) for label in self.labels)

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
    "Live KV tokens / token slots of granted pages (reserved + used). SLO >= 0.65. One pod's ratio: "
    "aggregate growpage_kv_live_tokens / growpage_kv_granted_token_slots instead.", "ratio")
# Seconds of compressions the ratio gauge covers: a fixed window of the agent's own polls, so every
# scraper (an HA pair of Prometheus, a curl) reads the same value between two polls.
COMPRESS_RATIO_WINDOW_S = 300.0
INTRA_PAGE_COMPRESS_RATIO = MetricSpec(
    "growpage_intra_page_compress_ratio", MetricType.GAUGE,
    "Bytes in / bytes out of the compressions of the last 5 minutes (scales included), the same for every "
    "scraper; keeps its last value through a window without compressions. SLO >= 2.0.", "ratio")
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
    "Pages granted to requests (admission grants and growth).", "pages")
DECISIONS = MetricSpec(
    "growpage_decisions_total", MetricType.COUNTER,
    "Page-boundary decisions by kind (denied/throttled count refused allocations).", "",
    labels=("decision",), label_values={"decision": DECISION_KINDS})
DEMAND_P95 = MetricSpec(
    "growpage_kv_demand_p95", MetricType.GAUGE,
    "p95 of running requests' capacity boundaries, in pages (one pod; across pods use "
    "histogram_quantile over growpage_kv_demand_requests).", "pages")
DEMAND_PAGES_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEMAND_PAGES = MetricSpec(
    "growpage_kv_demand_pages", MetricType.GAUGE,
    "Sum of running requests' capacity boundaries, in pages: the KV demand, summable across pods.", "pages")
# A gauge histogram. Its bound is `pages_le`, not `le`: promtool rejects `le` on a gauge. The p95
# across pods: histogram_quantile(0.95, sum by (le) (label_replace(sum by (pages_le) (...), "le", "$1",
# "pages_le", "(.*)"))).
DEMAND_REQUESTS = MetricSpec(
    "growpage_kv_demand_requests", MetricType.GAUGE,
    "Running requests whose capacity boundary is <= pages_le pages (cumulative, like histogram buckets): "
    "the demand distribution, summable across pods.", "requests",
    labels=("pages_le",), label_values={"pages_le": (*(str(float(b)) for b in DEMAND_PAGES_BUCKETS), "+Inf")})
COMPRESSION_RATIO = MetricSpec(
    "growpage_compression_ratio", MetricType.GAUGE,
    "Logical KV bytes / stored KV bytes across the pool (1 = nothing saved). One pod's ratio: aggregate "
    "growpage_kv_logical_bytes / growpage_kv_stored_bytes instead.", "ratio")
FRAGMENTATION = MetricSpec(
    "growpage_page_table_fragmentation", MetricType.GAUGE,
    "1 - live tokens / token slots of used pages: tail slack and eviction holes. One pod's ratio: "
    "aggregate 1 - growpage_kv_live_tokens / growpage_kv_used_token_slots instead.", "ratio")
# Numerators and denominators of the ratios above, so a ratio over pods is sum / sum, never the
# average of per-pod ratios (which weighs an idle pod like a full one).
LIVE_TOKENS = MetricSpec(
    "growpage_kv_live_tokens", MetricType.GAUGE, "KV tokens held by running requests.", "tokens")
GRANTED_TOKEN_SLOTS = MetricSpec(
    "growpage_kv_granted_token_slots", MetricType.GAUGE,
    "Token slots of granted pages (reserved + used; quantized pages hold more).", "tokens")
USED_TOKEN_SLOTS = MetricSpec(
    "growpage_kv_used_token_slots", MetricType.GAUGE, "Token slots of used (written) pages.", "tokens")
LOGICAL_BYTES = MetricSpec(
    "growpage_kv_logical_bytes", MetricType.GAUGE,
    "Running requests' seen tokens at full precision, in bytes.", "bytes")
STORED_BYTES = MetricSpec(
    "growpage_kv_stored_bytes", MetricType.GAUGE,
    "Bytes of the live tokens at their page's format, scales included.", "bytes")
POOL_PAGES = MetricSpec(
    "growpage_pool_pages", MetricType.GAUGE, "Pages in the pool by state.", "pages",
    labels=("state",), label_values={"state": POOL_STATES})
LTS_ENTROPY = MetricSpec(
    "growpage_lts_entropy", MetricType.HISTOGRAM,
    "Per-request long-term attention entropy at finish.", "nats",
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
    labels=("version", "engine", "engine_version", "mode", "block_size", "base_pages", "device"),
    label_exports={"engine": "home", "engine_version": "home_version"})
# scheduler: the vLLM home's scheduler agent (metrics, decisions); observer: attention in the
# workers; enforcer: enforce inside vLLM. The reference engine reports observer and enforcer.
AGENT_COMPONENTS = ("scheduler", "observer", "enforcer")
AGENT_ACTIVE_REASON = "active"
# While vLLM loads the model (the engine core's exporter serves from process start): not a fault.
AGENT_STARTING_REASON = "starting"
# Settings GrowPage cannot honour: it runs off (build info says mode off) and vLLM pages on its own;
# whatever mode was asked for, this is a fault to report.
AGENT_INVALID_CONFIG_REASON = "invalid_config"
AGENT_ACTIVE = MetricSpec(
    "growpage_agent_active", MetricType.GAUGE,
    "1 when the component runs, else 0; reason is \"active\" or why not (e.g. starting while vLLM loads "
    "the model, mode_off, invalid_config, unsupported_backend, full_cudagraph, async_scheduling, "
    "model_runner_v2, quantized_kv_cache).", "",
    labels=("component", "reason"), label_values={"component": AGENT_COMPONENTS})
SAMPLES_DROPPED = MetricSpec(
    "growpage_telemetry_samples_dropped_total", MetricType.COUNTER,
    "Histogram samples lost because one stats window held more than the core keeps: poll more often.",
    "samples")
REQUEST_TOKENS = MetricSpec(
    "growpage_request_tokens", MetricType.HISTOGRAM,
    "Tokens a request had seen (prompt + generated) when it finished; sizes base_pages.", "tokens",
    buckets=REQUEST_TOKENS_BUCKETS)

METRICS: tuple[MetricSpec, ...] = (
    UTILIZATION, INTRA_PAGE_COMPRESS_RATIO, COMPRESS_INPUT_BYTES, COMPRESS_OUTPUT_BYTES,
    ALLOCATION_LATENCY, ALLOCATIONS, DECISIONS, DEMAND_P95, DEMAND_PAGES, DEMAND_REQUESTS,
    COMPRESSION_RATIO, FRAGMENTATION, LIVE_TOKENS, GRANTED_TOKEN_SLOTS, USED_TOKEN_SLOTS, LOGICAL_BYTES,
    STORED_BYTES, POOL_PAGES, LTS_ENTROPY, STS_DENSITY, REQUESTS_RUNNING, OOM_EVENTS, AGENT_ERRORS,
    BUILD_INFO, REQUEST_TOKENS, AGENT_ACTIVE, SAMPLES_DROPPED,
)
METRICS_BY_NAME = {spec.name: spec for spec in METRICS}

# The load a router compares replicas by (growpage.core.headroom), served by the vLLM home only: its
# scheduler agent computes it every step, and the endpoint plugin answers GET LOAD_PATH from it. Not
# part of METRICS, the contract both homes serve.
LOAD_PATH = "/get_load"  # what vLLM's router (power_of_two) polls: {"load": N}
HEADROOM_PAGES = MetricSpec(
    "growpage_kv_headroom_pages", MetricType.GAUGE,
    "Free KV pages plus the pages GrowPage could reclaim by compressing enforced requests to their floor: "
    "the room this replica has without preempting.", "pages")
RECLAIMABLE_PAGES = MetricSpec(
    "growpage_kv_reclaimable_pages", MetricType.GAUGE,
    "Pages GrowPage could free by compressing the running requests it enforces, none below its floor "
    "(0 in monitor and off).", "pages")
ROUTER_LOAD = MetricSpec(
    "growpage_router_load", MetricType.GAUGE,
    "What GET /get_load answers: percent of the requests this replica can hold without preempting that it "
    "runs or queues (0 idle, 100 full, above 100 it queues).", "percent")
ROUTER_METRICS: tuple[MetricSpec, ...] = (HEADROOM_PAGES, RECLAIMABLE_PAGES, ROUTER_LOAD)

# Monitor's forecast of enforce (growpage.vllm_plugin.forecast), served by the vLLM home only: what
# enforce would do on this deployment's own traffic, read before a rollout to enforce (dashboards,
# gpctl calibrate's rollout recommendation). Absent where every request is enforced: the real series count it.
FORECAST_PAGES_FREED = MetricSpec(
    "growpage_forecast_pages_freed_total", MetricType.COUNTER,
    "Monitor's forecast: KV pages enforce would have freed (its compactions, against growing), on this "
    "replica's own traffic.", "pages")
FORECAST_COMPACTIONS = MetricSpec(
    "growpage_forecast_compactions_total", MetricType.COUNTER,
    "Monitor's forecast: compactions enforce would have made (boundary evictions and prompts compressed "
    "for admission).", "compactions")
FORECAST_PREEMPTIONS = MetricSpec(
    "growpage_forecast_preemptions_total", MetricType.COUNTER,
    "vLLM preemptions of monitored requests (the denominator of the avoidable ones).", "preemptions")
FORECAST_PREEMPTIONS_AVOIDABLE = MetricSpec(
    "growpage_forecast_preemptions_avoidable_total", MetricType.COUNTER,
    "Monitor's forecast: vLLM preemptions enforce would have avoided (its growth-aware admission would not "
    "have started the request yet, or it would have had a page: one its compactions spared, less what it "
    "runs that vLLM does not, or one freed by compressing a request above its floor), counted once the "
    "request it keeps running settles (vLLM runs it again, or it would have ended).", "preemptions")
FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION = MetricSpec(
    "growpage_forecast_preemptions_avoidable_by_admission_total", MetricType.COUNTER,
    "Monitor's forecast: vLLM preemptions of requests that growth-aware admission (admission: projected) "
    "would not have started yet, whatever the admission setting: what turning it on would avoid.", "preemptions")
FORECAST_RECOMPUTE_SECONDS_AVOIDABLE = MetricSpec(
    "growpage_forecast_recompute_seconds_avoidable_total", MetricType.COUNTER,
    "Monitor's forecast: seconds vLLM spends recomputing the preemptions enforce would have avoided (each "
    "request's prompt and output so far at the engine's measured cost of a prefilled token), counted with "
    "them: what enforce would buy in time, against growpage_vllm_own_seconds_total.", "seconds")
FORECAST_WIDER_BATCH_SECONDS = MetricSpec(
    "growpage_forecast_wider_batch_seconds_total", MetricType.COUNTER,
    "Monitor's forecast: seconds of vLLM's steps enforce's wider batch would save: each token of a request "
    "enforce runs where vLLM does not (kept from a preemption, admitted into spared pages) decodes in a step "
    "that runs anyway, where vLLM decodes it later for a share of a step's fixed cost at its batch width; "
    "counted when the request settles.", "seconds")
FORECAST_SPARE_PAGES = MetricSpec(
    "growpage_forecast_spare_pages", MetricType.GAUGE,
    "Monitor's forecast: KV pages enforce would have free now beyond what vLLM has (monitored requests' "
    "pages less what enforce would hold for them).", "pages")
FORECAST_METRICS: tuple[MetricSpec, ...] = (FORECAST_PAGES_FREED, FORECAST_COMPACTIONS, FORECAST_PREEMPTIONS,
                                            FORECAST_PREEMPTIONS_AVOIDABLE,
                                            FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION,
                                            FORECAST_RECOMPUTE_SECONDS_AVOIDABLE, FORECAST_WIDER_BATCH_SECONDS,
                                            FORECAST_SPARE_PAGES)

# Growth-aware admission under enforce (growpage.vllm_plugin.admission), served by the vLLM home only:
# when it holds waiting requests back, and the running batch's projected KV it holds them against.
ADMISSION_HOLDS = MetricSpec(
    "growpage_admission_holds_total", MetricType.COUNTER,
    "Engine steps in which growth-aware admission held a waiting request back: the running requests' "
    "projected KV at their ends, with it, would not fit the pool (vLLM would have preempted later).", "steps")
ADMISSION_PROJECTED_PAGES = MetricSpec(
    "growpage_admission_projected_pages", MetricType.GAUGE,
    "KV pages the running requests are projected to hold when they end (learned output and kept shares), "
    "which growth-aware admission keeps within the pool.", "pages")
ADMISSION_LOOKAHEAD = MetricSpec(
    "growpage_admission_lookahead", MetricType.GAUGE,
    "1 while growth-aware admission looks ahead (holds a start the pool cannot hold at the batch's end), "
    "0 while vLLM admits on its own: admission auto looks ahead where this engine's measured step costs say "
    "a preemption's recompute costs more than the batch width holding gives up.", "boolean")
ADMISSION_METRICS: tuple[MetricSpec, ...] = (ADMISSION_HOLDS, ADMISSION_PROJECTED_PAGES, ADMISSION_LOOKAHEAD)

# Series only the vLLM home serves, beside the contract: what it could not enforce as decided, and how
# much of the work its observer saw (the shares of steps and of requests observed: below 1 with
# observe_every_steps > 1, monitor's default, and when a batch holds more than observe_max_requests).
VLLM_DEGRADED_DECISIONS = MetricSpec(
    "growpage_vllm_decisions_degraded_total", MetricType.COUNTER,
    "Page-boundary decisions vLLM applied differently than decided (quantize and defer cannot be per-request "
    "in vLLM), by decided and enforced kind.", "decisions", labels=("decided", "enforced"))
VLLM_STEPS = MetricSpec(
    "growpage_vllm_steps_total", MetricType.COUNTER,
    "Engine steps that ran with at least one request GrowPage tracks.", "steps")
VLLM_OBSERVED_STEPS = MetricSpec(
    "growpage_vllm_observed_steps_total", MetricType.COUNTER,
    "Engine steps whose attention GrowPage observed (one in observe_every_steps; under full CUDA graphs "
    "that step runs without its full graph).", "steps")
VLLM_ROOM_STEPS = MetricSpec(
    "growpage_vllm_room_for_all_steps_total", MetricType.COUNTER,
    "Engine steps whose KV pool held every running request to its full length and every waiting one: "
    "enforce grew at every boundary and observed only prompt ends (grow_with_room_for_all).", "steps")
VLLM_IDLE_STEPS = MetricSpec(
    "growpage_vllm_compression_idle_steps_total", MetricType.COUNTER,
    "Engine steps enforce left decode-time compression idle because it had bought neither a wider batch nor "
    "a dear recompute lately: boundaries grew or vLLM preempted, and only prompt ends were observed "
    "(compression_gate).", "steps")
VLLM_TRACKED_REQUESTS = MetricSpec(
    "growpage_vllm_tracked_requests_total", MetricType.COUNTER, "Finished requests GrowPage tracked.", "requests")
VLLM_OBSERVED_REQUESTS = MetricSpec(
    "growpage_vllm_observed_requests_total", MetricType.COUNTER,
    "Finished requests whose attention GrowPage observed at least once.", "requests")
# What GrowPage costs vLLM: its own code's seconds against the seconds of the vLLM calls it hooks (the
# worker's steps, the scheduler's schedule and update), by side; the rates' ratio is its share of the step.
OWN_TIME_SIDES = ("scheduler", "worker")
VLLM_OWN_SECONDS = MetricSpec(
    "growpage_vllm_own_seconds_total", MetricType.COUNTER,
    "Wall-clock seconds GrowPage's own code ran inside vLLM's engine loop (observation, compaction, decisions, "
    "forecast, telemetry polls), by side; against growpage_vllm_step_seconds_total it is GrowPage's share of "
    "the step. Host time: on a GPU the kernels it launches run asynchronously and are not in it.", "seconds",
    labels=("side",), label_values={"side": OWN_TIME_SIDES})
VLLM_STEP_SECONDS = MetricSpec(
    "growpage_vllm_step_seconds_total", MetricType.COUNTER,
    "Wall-clock seconds of the vLLM calls GrowPage hooks (the worker's execute and sample, the scheduler's "
    "schedule and update), GrowPage's own part included, by side.", "seconds",
    labels=("side",), label_values={"side": OWN_TIME_SIDES})
VLLM_HOME_METRICS: tuple[MetricSpec, ...] = (VLLM_DEGRADED_DECISIONS, VLLM_STEPS, VLLM_OBSERVED_STEPS,
                                             VLLM_ROOM_STEPS, VLLM_IDLE_STEPS, VLLM_TRACKED_REQUESTS,
                                             VLLM_OBSERVED_REQUESTS, VLLM_OWN_SECONDS, VLLM_STEP_SECONDS,
                                             *FORECAST_METRICS, *ADMISSION_METRICS)
# The load at and above which a replica holds all it can without preempting (the fleet alert's "full").
FLEET_LOAD_FULL = 100.0


@dataclasses.dataclass(frozen=True)
class SLO:
    """One of GrowPage's own service-level objectives, with the metric that measures it."""

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
    """The troubleshooting checklist, as numbers (diagnose and alerts read these)."""

    utilization_sustained_low: float = 0.40  # over-granting: base_pages too large
    allocation_latency_p99_critical_s: float = 0.020  # block size vs GPU
    # "OOM while memory is not really full", read inside the KV pool rather than from the GPU's
    # framebuffer: vLLM reserves its KV cache at start-up (gpu_memory_utilization ~0.9), so the
    # framebuffer is always "full". Pages are stranded when the pool has no free page left
    # (free share at or under pool_free_low) while this share of the granted token slots holds
    # no live token (reserved-but-unwritten pages, tail slack, eviction holes).
    pool_free_low: float = 0.02
    stranded_slots_high: float = 0.50
    # vLLM's own view of the same thing: its KV cache usage at or above this counts as "no free page".
    vllm_kv_cache_usage_full: float = 0.98
    fragmentation_high: float = 0.50
    # Fragmentation matters only when pages run short: above this free share of the pool, slack
    # in written pages strands nothing anyone is waiting for (a nearly idle pod is not a finding).
    fragmentation_pool_free_max: float = 0.20
    rollout_entropy: float = 2.5  # phase-2 candidates: LTS p50 above this while not enforced
    throttle_saturation: float = 0.5  # throttled / (allocate + throttled) sustained above this
    # GrowPage's own code above this share of the vLLM calls it hooks costs more than observing should
    # (about 3-5 % measured at the shipped sampling on a 2-core CPU, where vLLM's step is shortest)
    own_share_high: float = 0.10


CHECKLIST = ChecklistThresholds()

# GrowPage's own guidance (not a vLLM rule): a page of block_size tokens per GPU generation.
RECOMMENDED_BLOCK_SIZE_BY_GPU = {"A100": 16, "H100": 32, "H200": 32}

# The oldest vLLM release the plugin supports: remediation advice names this, never an upgrade to a
# vLLM "with GrowPage" (no vLLM release contains GrowPage).
MIN_SUPPORTED_VLLM_VERSION = "0.32.0"

# Runbook pages live in the repository under runbooks/<alert name>.md.
RUNBOOK_BASE_URL = "https://github.com/growpage/growpage/blob/main/runbooks"


# ---------------------------------------------------------------------------------------------
# gpctl diagnose. Thresholds the checklist leaves implicit, the DCGM
# exporter names diagnose reads next to the agent's, and one runbook page per diagnose check.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DiagnoseThresholds:
    """Numbers ``gpctl diagnose`` needs beyond :data:`CHECKLIST`."""

    # "Free pages near 0": the lowest free share of the pool in the window at or under this.
    pool_free_low_fraction: float = CHECKLIST.pool_free_low
    # Prometheus: the agent's newest sample older than this means its scrape is failing.
    scrape_stale_s: float = 120.0
    # Endpoint: a /metrics/growpage response slower than this risks Prometheus scrape timeouts.
    endpoint_slow_response_s: float = 2.0
    # Endpoint and DCGM reads stop at this many bytes: diagnose must survive the agent it diagnoses
    # (a real /metrics/growpage is a few tens of KiB; DCGM's a few hundred KiB per node).
    max_response_bytes: int = 16 * 1024 * 1024


DIAGNOSE_THRESHOLDS = DiagnoseThresholds()

# NVIDIA DCGM exporter series (framebuffer in MiB) and the label that names the GPU model.
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent, 0-100
DCGM_MODEL_NAME_LABEL = "modelName"

# vLLM's own series (its /metrics, scraped as job VLLM_SCRAPE_JOB), read next to GrowPage's on the
# dashboards and by the stranded-pages alert. They carry model_name, like GrowPage's.
VLLM_SCRAPE_JOB = "vllm"
VLLM_METRICS_PATH = "/metrics"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # 0-1 despite the name
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_TTFT = "vllm:time_to_first_token_seconds"  # histogram
VLLM_ITL = "vllm:inter_token_latency_seconds"  # histogram
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"  # histogram: waiting before the first schedule
VLLM_E2E_LATENCY = "vllm:e2e_request_latency_seconds"  # histogram: arrival to the last token
# Finished requests by finished_reason (stop, length, abort, error): the availability SLO's events.
VLLM_REQUESTS_FINISHED = "vllm:request_success_total"
VLLM_FINISHED_REASON_LABEL = "finished_reason"
VLLM_HISTOGRAMS = (VLLM_TTFT, VLLM_ITL, VLLM_QUEUE_TIME, VLLM_E2E_LATENCY)
VLLM_METRICS = (VLLM_KV_CACHE_USAGE, VLLM_PREEMPTIONS, VLLM_REQUESTS_RUNNING, VLLM_REQUESTS_WAITING,
                VLLM_REQUESTS_FINISHED,
                *(f"{histogram}_{suffix}" for histogram in VLLM_HISTOGRAMS for suffix in ("bucket", "sum", "count")))

# --- vLLM's router (vllm-router 0.1.17), scraped on its --prometheus-port as job ROUTER_SCRAPE_JOB ---
# Names and labels as the binary exports them (tests/vllm_plugin/test_vllm_fleet_router.py scrapes a real
# one). Counters appear on their first increment. ``worker`` is the worker's URL as the router was given it
# (--worker-urls) or found it (service discovery); namespace/pod are the router pod's, from the scrape.
ROUTER_SCRAPE_JOB = "vllm-router"
ROUTER_METRICS_PATH = "/metrics"
ROUTER_METRICS_PORT = 29000  # --prometheus-port in deploy/components/router
ROUTER_WORKER_LABEL = "worker"
# 1 while the router's health checks pass for the worker (GET /health), 0 once they fail; one per worker.
ROUTER_WORKER_HEALTH = "vllm_router_worker_health"
ROUTER_ACTIVE_WORKERS = "vllm_router_active_workers"  # workers registered, healthy or not (no labels)
# A request the policy sent to a worker, by policy and worker (retries count again). With one healthy
# worker left the router skips the policy, and only processed_requests keeps counting.
ROUTER_POLICY_DECISIONS = "vllm_router_policy_decisions_total"
ROUTER_PROCESSED_REQUESTS = "vllm_router_processed_requests_total"  # attempts sent to each worker, by worker
ROUTER_RUNNING_REQUESTS = "vllm_router_running_requests"  # requests in flight from this router, by worker
# Requests answered successfully, by route: failures are not counted here.
ROUTER_REQUESTS = "vllm_router_requests_total"
# Requests whose every attempt failed (a worker's 5xx, a connection error, no available worker), by route:
# what the client got as a 5xx. The router retries by default (5 attempts), so each failed request once.
ROUTER_REQUESTS_FAILED = "vllm_router_retries_exhausted_total"
# Errors by route and error_type, per attempt: non_retryable_error (a worker's 4xx, the client's fault),
# no_available_workers (every circuit open or worker unhealthy; counted once per attempt).
ROUTER_REQUEST_ERRORS = "vllm_router_request_errors_total"
ROUTER_CIRCUIT_STATE = "vllm_router_cb_state"  # per worker: 0 closed, 1 open, 2 half open
ROUTER_METRICS_SERIES = (ROUTER_WORKER_HEALTH, ROUTER_ACTIVE_WORKERS, ROUTER_POLICY_DECISIONS,
                         ROUTER_PROCESSED_REQUESTS, ROUTER_RUNNING_REQUESTS, ROUTER_REQUESTS,
                         ROUTER_REQUESTS_FAILED, ROUTER_REQUEST_ERRORS, ROUTER_CIRCUIT_STATE)
# The labels each series carries besides the scrape's (none: the router's own total).
ROUTER_SERIES_LABELS = {
    ROUTER_WORKER_HEALTH: (ROUTER_WORKER_LABEL,), ROUTER_ACTIVE_WORKERS: (),
    ROUTER_POLICY_DECISIONS: ("policy", ROUTER_WORKER_LABEL), ROUTER_PROCESSED_REQUESTS: (ROUTER_WORKER_LABEL,),
    ROUTER_RUNNING_REQUESTS: (ROUTER_WORKER_LABEL,), ROUTER_REQUESTS: ("route",),
    ROUTER_REQUESTS_FAILED: ("route",), ROUTER_REQUEST_ERRORS: ("route", "error_type"),
    ROUTER_CIRCUIT_STATE: (ROUTER_WORKER_LABEL,),
}


@dataclasses.dataclass(frozen=True)
class RouterAlertDurations:
    """``for:`` of the router's alerts. The router health-checks each worker every 60 s by default and
    marks it unhealthy after 3 failed checks, so "no healthy worker" is already minutes old when it shows."""

    no_healthy_worker: str = "2m"
    router_down: str = "5m"


ROUTER_ALERT_FOR = RouterAlertDurations()

# Runbook page (under RUNBOOK_BASE_URL) for each ``gpctl diagnose`` check id: the alert runbook
# (runbooks/<AlertName>.md) of the alert that watches the same condition, so a diagnose finding and
# that alert open the same runbook. The check ids are stable names owned by diagnose.
CHECK_RUNBOOKS = {
    "vllm-latency": "GrowPageVLLMTimeToFirstTokenFastBurn.md",
    "slo-utilization": "GrowPageKVUtilizationLow.md",
    "slo-compress-ratio": "GrowPageCompressRatioLow.md",
    "slo-allocation-latency": "GrowPageAllocationLatencySlowBurn.md",
    "over-granting": "GrowPageKVOverGranting.md",
    "allocation-latency": "GrowPageAllocationLatencyHigh.md",
    "oom-fragmentation": "GrowPageKVPagesStranded.md",
    "rollout": "README.md#the-levers-staged-rollout",
    "agent-health": "GrowPageAgentErrors.md",
}


# ---------------------------------------------------------------------------------------------
# Telemetry.
# ---------------------------------------------------------------------------------------------

# Trace names of the contract (docs/TELEMETRY.md, "Traces"): request ids and page counts live on spans, never
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
    kv_pages_stranded: str = "5m"
    agent_down: str = "5m"
    metrics_absent: str = "10m"
    agent_errors: str = "15m"
    growth_throttled: str = "30m"
    agent_inactive: str = "10m"
    observation_stale: str = "15m"
    vllm_preemptions: str = "15m"
    fleet_routes_to_preempting: str = "10m"


# Windows of the rules (ratios over increases). The compress ratio reads an hour: compressions come
# in bursts, and a 5m rate vanishes between two bursts, which restarted the alert's `for` each time.
RATE_WINDOW = "5m"
COMPRESS_RATIO_RULE_WINDOW = "1h"
STRANDED_WINDOW = "10m"  # an OOM or preemption counts for this long after it happened


ALERT_FOR = AlertDurations()


@dataclasses.dataclass(frozen=True)
class BurnRateWindow:
    """A long and a short window that must both burn the error budget ``factor`` times too fast.

    The short window makes the alert reset soon after the burn stops (Google SRE workbook, ch. 5).
    """

    long_window: str
    short_window: str
    factor: float
    # Each pair waits its own time: a short pair reacts in minutes, a long one needs longer to mean it.
    for_duration: str = "0m"


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
                  (BurnRateWindow("1h", "5m", 14.4, "2m"), BurnRateWindow("6h", "30m", 6.0, "15m"))),
    # 10 % in 1 day, or 10 % in 3 days: a ticket for working hours.
    BurnRateAlert("slow", SEVERITY_TICKET, "1h",
                  (BurnRateWindow("1d", "2h", 3.0, "1h"), BurnRateWindow("3d", "6h", 1.0, "3h"))),
)
SLO_COMPLIANCE_WINDOW = "30d"  # the period the burn-rate factors are sized for (2 % of it in 1 h, ...)
# The window the dashboards' "budget left" panels sum over: inside kube-prometheus-stack's default
# retention (10 days), so the panel reads what Prometheus still holds.
SLO_BUDGET_PANEL_WINDOW = "7d"
# SLOs are kept per service, not per pod: a replaced pod must not take its error budget with it.
SLO_LABELS = ("namespace", MODEL_LABEL)
POD_LABELS = ("namespace", "pod", MODEL_LABEL)

# GPU framebuffer (DCGM_FB_USED / DCGM_FB_FREE above), for "OOM while the GPU is not full". With the
# dcgm-exporter's own ServiceMonitor (honorLabels false, its default) the pod that uses a GPU is in
# exported_namespace / exported_pod, because namespace / pod name the exporter's pod. Rules map
# them back; with honorLabels true the labels are already namespace / pod and are kept. diagnose
# joins through the same mapping, and takes another with --dcgm-label (relabeled set-ups).
DCGM_EXPORTED_LABELS = {"namespace": "exported_namespace", "pod": "exported_pod"}

# The HPA scales on vLLM's queue: requests waiting for KV blocks, per pod. Grants per second would
# fall under overload (grants wait for free pages), the moment more pods are needed. prometheus-adapter
# serves vllm:num_requests_waiting under a name the custom metrics API accepts (no colon).
HPA_SOURCE_SERIES = VLLM_REQUESTS_WAITING
HPA_METRIC = "vllm_num_requests_waiting"
HPA_TARGET_WAITING_PER_POD = 4


# --- What vLLM users feel: vLLM's own latency histograms, read as SLOs the GrowPage kit pages on ---


@dataclasses.dataclass(frozen=True)
class LatencySLO:
    """A latency objective on one of vLLM's histograms: ``objective`` of observations <= ``threshold_s``.

    ``threshold_s`` must be one of vLLM's bucket bounds, so the good share is an exact bucket, not an
    interpolation (vLLM 0.32's defaults: TTFT has 2.5, inter-token latency has 0.1).
    """

    name: str
    histogram: str
    threshold_s: float
    objective: float
    description: str


SLO_VLLM_TTFT = LatencySLO("vllm_time_to_first_token", VLLM_TTFT, 2.5, 0.99,
                           "99 % of requests get their first token within 2.5 s.")
SLO_VLLM_ITL = LatencySLO("vllm_inter_token_latency", VLLM_ITL, 0.1, 0.99,
                          "99 % of decode steps emit the next token within 100 ms.")
VLLM_LATENCY_SLOS = (SLO_VLLM_TTFT, SLO_VLLM_ITL)


@dataclasses.dataclass(frozen=True)
class AvailabilitySLO:
    """An availability objective on vLLM's finished requests: ``objective`` of them not failed.

    ``failed_reasons`` are the ``finished_reason`` values that count against it: ``error`` (vLLM
    answers 500) and ``abort`` (the client gave up: at a healthy pod a small, steady share of users
    cancel, which the objective absorbs; a surge means clients time out on a slow or stuck server).
    """

    name: str
    counter: str
    failed_reasons: tuple[str, ...]
    objective: float
    description: str

    @property
    def good_matcher(self) -> str:
        return f'{VLLM_FINISHED_REASON_LABEL}!~"{"|".join(self.failed_reasons)}"'


SLO_VLLM_AVAILABILITY = AvailabilitySLO(
    "vllm_request_availability", VLLM_REQUESTS_FINISHED, ("abort", "error"), 0.99,
    "99 % of finished requests are neither aborted nor failed with an error.")
# Preemptions a pod may take before it is worth a ticket: sustained over RATE_WINDOW, per second.
VLLM_PREEMPTIONS_PER_S_HIGH = 0.05
# vLLM's queue "grows" when it is longer at the end of this window than at its start.
VLLM_QUEUE_GROWTH_WINDOW = "10m"

# Modes in which GrowPage's own alerts mean something (growpage_build_info{mode}). Off: nothing is
# observed, so nothing GrowPage says about the pod can page. Enforce: only then does GrowPage change
# the KV (compressions, growth throttling).
MODES_OBSERVING = ("monitor", "enforce")
MODES_ENFORCING = ("enforce",)
# Homes (growpage_build_info{home}) where base_pages is an admission grant. Inside vLLM pages are
# granted on demand (pages_reserved is 0, granted equals used) and base_pages is a compaction floor,
# so low utilization there is slack inside written pages, not over-granting.
HOMES_GRANTING_BASE_PAGES = ("reference",)


# --- Severity: one table read by the alert rules, gpctl diagnose and the runbooks ---


@dataclasses.dataclass(frozen=True)
class Condition:
    """A condition the kit reports, the alert that fires on it and the diagnose check that finds it.

    Attributes:
        alert: the alertname (and runbook file name).
        check: the ``gpctl diagnose`` check id whose finding names this alert when it holds.
        severity: SEVERITY_PAGE or SEVERITY_TICKET; the alert's ``severity`` label, the diagnose
            finding's status and severity, and the runbook's severity line.
    """

    alert: str
    check: str
    severity: str


SEVERITY_TABLE: tuple[Condition, ...] = (
    # Pages: what users of the vLLM pod feel.
    Condition("GrowPageVLLMTimeToFirstTokenFastBurn", "vllm-latency", SEVERITY_PAGE),
    Condition("GrowPageVLLMInterTokenLatencyFastBurn", "vllm-latency", SEVERITY_PAGE),
    Condition("GrowPageVLLMAvailabilityFastBurn", "vllm-latency", SEVERITY_PAGE),
    Condition("GrowPageKVPagesStranded", "oom-fragmentation", SEVERITY_PAGE),
    # Tickets: capacity wasted or at risk, GrowPage's own objectives, the agent's health.
    Condition("GrowPageVLLMTimeToFirstTokenSlowBurn", "vllm-latency", SEVERITY_TICKET),
    Condition("GrowPageVLLMInterTokenLatencySlowBurn", "vllm-latency", SEVERITY_TICKET),
    Condition("GrowPageVLLMAvailabilitySlowBurn", "vllm-latency", SEVERITY_TICKET),
    Condition("GrowPageVLLMPreemptions", "oom-fragmentation", SEVERITY_TICKET),
    Condition("GrowPageFleetRoutesToPreemptingReplica", "oom-fragmentation", SEVERITY_TICKET),
    Condition("GrowPageFragmentationHigh", "oom-fragmentation", SEVERITY_TICKET),
    Condition("GrowPageKVUtilizationLow", "slo-utilization", SEVERITY_TICKET),
    Condition("GrowPageKVOverGranting", "over-granting", SEVERITY_TICKET),
    Condition("GrowPageCompressRatioLow", "slo-compress-ratio", SEVERITY_TICKET),
    # Grant latency is a cause: the user-facing burn pages (TTFT, inter-token latency), this tickets.
    Condition("GrowPageAllocationLatencyFastBurn", "slo-allocation-latency", SEVERITY_TICKET),
    Condition("GrowPageAllocationLatencySlowBurn", "slo-allocation-latency", SEVERITY_TICKET),
    Condition("GrowPageAllocationLatencyHigh", "allocation-latency", SEVERITY_TICKET),
    Condition("GrowPageGrowthThrottled", "rollout", SEVERITY_TICKET),
    # vLLM serves while GrowPage's route fails: GrowPage is blind, users are not hurt (vLLM's own
    # SLOs still page), so a ticket.
    Condition("GrowPageAgentDown", "agent-health", SEVERITY_TICKET),
    Condition("GrowPageMetricsAbsent", "agent-health", SEVERITY_TICKET),
    Condition("GrowPageAgentErrors", "agent-health", SEVERITY_TICKET),
    Condition("GrowPageAgentInactive", "agent-health", SEVERITY_TICKET),
    # The observer says active but has observed no step while steps ran: decisions rank by recency.
    Condition("GrowPageObservationStale", "agent-health", SEVERITY_TICKET),
    # vLLM's router, the fleet's entry point: every request fails (no healthy worker, the error budget
    # burning fast) pages; a slow burn, or router pods that stop answering their scrapes, make tickets.
    # gpctl diagnose has no router check yet: the rows name vllm-latency, the users' check.
    Condition("GrowPageRouterNoHealthyWorker", "vllm-latency", SEVERITY_PAGE),
    Condition("GrowPageRouterAvailabilityFastBurn", "vllm-latency", SEVERITY_PAGE),
    Condition("GrowPageRouterAvailabilitySlowBurn", "vllm-latency", SEVERITY_TICKET),
    Condition("GrowPageRouterDown", "vllm-latency", SEVERITY_TICKET),
)
SEVERITY_BY_ALERT = {condition.alert: condition.severity for condition in SEVERITY_TABLE}
# Alerts no check of gpctl diagnose judges yet (their rows name the check an SRE opens beside them): the
# router's, whose series diagnose does not read. The alert-replay test leaves them out, and says so.
UNDIAGNOSED_ALERTS = frozenset({"GrowPageRouterNoHealthyWorker", "GrowPageRouterAvailabilityFastBurn",
                                "GrowPageRouterAvailabilitySlowBurn", "GrowPageRouterDown"})
CHECK_BY_ALERT = {condition.alert: condition.check for condition in SEVERITY_TABLE}


# --- The thresholds a deployment may change (growpage.monitoring.mixin.MixinConfig.thresholds) ---


def _objective_description(objective: float, what: str) -> str:
    return f"{objective * 100:g} % of {what}"


@dataclasses.dataclass(frozen=True)
class MixinThresholds:
    """Every number an alert, a panel, a runbook line and ``gpctl diagnose`` compare against.

    The defaults are the constants above (the SLOs, :data:`CHECKLIST`, the burn-rate factors), so the
    committed rules and dashboards are built from them; a deployment that changes one gets the same
    number in its rules, dashboards, runbooks and diagnose verdicts. Validated on construction.

    Attributes:
        vllm_ttft_s / vllm_itl_s: vLLM latency SLO thresholds; each must be a bucket bound of the
            histogram the deployment's vLLM exports (the rules read the good share from that bucket,
            and a bound vLLM does not export selects nothing). Not checked here: vLLM's
            ``--custom-histogram-buckets`` changes the bounds.
        vllm_ttft_objective / vllm_itl_objective: the share of observations within them, in (0, 1).
        vllm_availability_objective: the share of finished requests neither aborted nor failed.
        utilization_objective, compress_ratio_objective: GrowPage's own SLOs.
        allocation_latency_s / allocation_latency_objective: the grant-latency SLO; the threshold
            must be one of :data:`ALLOCATION_LATENCY_BUCKETS_S`.
        burn_rate_factors: one factor per window pair of :data:`ALLOCATION_LATENCY_BURN_RATE_ALERTS`,
            in order (fast pairs first).
        vllm_preemptions_per_s_high: the preemption ticket's rate.
        fleet_load_full: the router load at which a replica counts as full.
        checklist: the troubleshooting checklist's numbers.
    """

    vllm_ttft_s: float = SLO_VLLM_TTFT.threshold_s
    vllm_ttft_objective: float = SLO_VLLM_TTFT.objective
    vllm_itl_s: float = SLO_VLLM_ITL.threshold_s
    vllm_itl_objective: float = SLO_VLLM_ITL.objective
    vllm_availability_objective: float = SLO_VLLM_AVAILABILITY.objective
    utilization_objective: float = SLO_UTILIZATION.objective
    compress_ratio_objective: float = SLO_COMPRESS_RATIO.objective
    allocation_latency_s: float = ALLOCATION_LATENCY_SLO_THRESHOLD_S
    allocation_latency_objective: float = SLO_ALLOCATION_LATENCY.objective
    burn_rate_factors: tuple[float, ...] = tuple(
        window.factor for alert in ALLOCATION_LATENCY_BURN_RATE_ALERTS for window in alert.windows)
    vllm_preemptions_per_s_high: float = VLLM_PREEMPTIONS_PER_S_HIGH
    fleet_load_full: float = FLEET_LOAD_FULL
    checklist: ChecklistThresholds = CHECKLIST

    def __post_init__(self) -> None:
        for name in ("vllm_ttft_objective", "vllm_itl_objective", "vllm_availability_objective",
                     "allocation_latency_objective"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"thresholds.{name} must be a share between 0 and 1 (exclusive), "
                                 f"e.g. 0.99; got {getattr(self, name)}")
        if self.allocation_latency_s not in ALLOCATION_LATENCY_BUCKETS_S:
            raise ValueError(f"thresholds.allocation_latency_s must be a bucket bound of {ALLOCATION_LATENCY.name} "
                             f"({', '.join(f'{b:g}' for b in ALLOCATION_LATENCY_BUCKETS_S)}); "
                             f"got {self.allocation_latency_s}")
        pairs = sum(len(alert.windows) for alert in ALLOCATION_LATENCY_BURN_RATE_ALERTS)
        if len(self.burn_rate_factors) != pairs or min(self.burn_rate_factors) <= 0:
            raise ValueError(f"thresholds.burn_rate_factors needs {pairs} positive factors, one per window "
                             f"pair, fast pairs first (default {list(MixinThresholds.burn_rate_factors)})")
        if min(self.vllm_ttft_s, self.vllm_itl_s, self.utilization_objective, self.compress_ratio_objective,
               self.vllm_preemptions_per_s_high, self.fleet_load_full) <= 0:
            raise ValueError("thresholds: latency thresholds, objectives and rates must be positive")

    @property
    def vllm_latency_slos(self) -> tuple[LatencySLO, LatencySLO]:
        """:data:`VLLM_LATENCY_SLOS` with these thresholds (descriptions say the numbers)."""
        return (_latency_slo(SLO_VLLM_TTFT, self.vllm_ttft_s, self.vllm_ttft_objective,
                             "requests get their first token within"),
                _latency_slo(SLO_VLLM_ITL, self.vllm_itl_s, self.vllm_itl_objective,
                             "decode steps emit the next token within"))

    @property
    def vllm_availability_slo(self) -> AvailabilitySLO:
        """:data:`SLO_VLLM_AVAILABILITY` with this objective."""
        if self.vllm_availability_objective == SLO_VLLM_AVAILABILITY.objective:
            return SLO_VLLM_AVAILABILITY
        text = _objective_description(self.vllm_availability_objective, "finished requests")
        return dataclasses.replace(SLO_VLLM_AVAILABILITY, objective=self.vllm_availability_objective,
                                   description=f"{text} are neither aborted nor failed with an error.")

    @property
    def slo_utilization(self) -> SLO:
        return _slo(SLO_UTILIZATION, self.utilization_objective,
                    f"Granted KV pages hold live tokens: utilization >= {self.utilization_objective * 100:g} %.")

    @property
    def slo_compress_ratio(self) -> SLO:
        return _slo(SLO_COMPRESS_RATIO, self.compress_ratio_objective,
                    f"Compressions shrink the bytes they touch: ratio >= {self.compress_ratio_objective:g}x.")

    @property
    def slo_allocation_latency(self) -> SLO:
        if (self.allocation_latency_s, self.allocation_latency_objective) == (
                ALLOCATION_LATENCY_SLO_THRESHOLD_S, SLO_ALLOCATION_LATENCY.objective):
            return SLO_ALLOCATION_LATENCY
        text = _objective_description(self.allocation_latency_objective, "page grants complete in under")
        return dataclasses.replace(SLO_ALLOCATION_LATENCY, objective=self.allocation_latency_objective,
                                   description=f"{text} {self.allocation_latency_s * 1000:g} ms.")

    @property
    def burn_rate_alerts(self) -> tuple[BurnRateAlert, ...]:
        """:data:`ALLOCATION_LATENCY_BURN_RATE_ALERTS` with :attr:`burn_rate_factors`."""
        factors = iter(self.burn_rate_factors)
        return tuple(dataclasses.replace(alert, windows=tuple(dataclasses.replace(window, factor=next(factors))
                                                              for window in alert.windows))
                     for alert in ALLOCATION_LATENCY_BURN_RATE_ALERTS)


def _latency_slo(default: LatencySLO, threshold_s: float, objective: float, what: str) -> LatencySLO:
    if (threshold_s, objective) == (default.threshold_s, default.objective):
        return default
    limit = f"{threshold_s:g} s" if threshold_s >= 1 else f"{threshold_s * 1000:g} ms"
    return dataclasses.replace(default, threshold_s=threshold_s, objective=objective,
                               description=f"{_objective_description(objective, what)} {limit}.")


def _slo(default: SLO, objective: float, description: str) -> SLO:
    """``default`` itself when unchanged (its hand-written description), else the new objective."""
    if objective == default.objective:
        return default
    return dataclasses.replace(default, objective=objective, description=description)


MIXIN_THRESHOLDS = MixinThresholds()
