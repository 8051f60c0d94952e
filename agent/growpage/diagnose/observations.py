"""The normalized result every source produces and every check reads: :class:`Observations`.

A source (live endpoint, Prometheus, saved snapshots) reduces its raw data to these values over one
window: gauge statistics, counter increases and histogram bucket increases. Checks never see where
the numbers came from, so each check is a pure function that tests can call without I/O.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Window:
    """The time span the observations cover.

    Attributes:
        start_s, end_s: unix seconds.
        kind: ``scrapes`` or ``snapshots`` (two or more expositions: counters are increases between
            them),
            ``range`` (Prometheus range queries over ``[end - duration, end]``) or ``lifetime``
            (one exposition: counters are totals since the agent started).
        num_samples: expositions read (scrapes/lifetime); ``None`` for Prometheus.
    """

    start_s: float
    end_s: float
    kind: str
    num_samples: int | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def describe(self) -> str:
        """Short text for evidence, e.g. ``1m, 2 snapshots`` or ``30m until 2024-05-01T10:00:00Z``."""
        if self.kind == "lifetime":
            return "since agent start, one snapshot"
        span = format_duration(self.duration_s)
        if self.kind == "range":
            return f"{span} until {format_time(self.end_s)}"
        return f"{span}, {self.num_samples} {self.kind}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": format_time(self.start_s), "end": format_time(self.end_s),
                "duration_s": round(self.duration_s, 3), "num_samples": self.num_samples,
                "description": self.describe()}


def format_time(unix_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_duration(seconds: float) -> str:
    """``90`` -> ``1m30s``; whole units stay short (``1800`` -> ``30m``), sub-minute keeps decimals."""
    if seconds < 60:
        return f"{seconds:g}s" if seconds == int(seconds) else f"{seconds:.1f}s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts)


@dataclasses.dataclass(frozen=True)
class GaugeStats:
    """A gauge over the window: mean, lowest, highest and latest value across its series."""

    mean: float
    min: float
    max: float
    last: float

    def to_dict(self) -> dict[str, float | None]:
        return {"mean": round_number(self.mean), "min": round_number(self.min), "max": round_number(self.max),
                "last": round_number(self.last)}


@dataclasses.dataclass(frozen=True)
class HistogramCounts:
    """Observations a histogram gained over the window (or since start, for one snapshot).

    Attributes:
        buckets: ``(upper_bound, cumulative_count)`` sorted by bound, ``+Inf`` last.
        total_sum: increase of ``_sum`` (``None`` when the source did not report it).
    """

    buckets: tuple[tuple[float, float], ...]
    total_sum: float | None = None

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def fraction_at_or_below(self, bound: float) -> float | None:
        """Share of observations <= ``bound``: exact on a bucket bound, else linearly interpolated.

        ``None`` when the histogram is empty (no observations in the window).
        """
        total = self.count
        if total <= 0:
            return None
        previous_bound, previous_count = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if math.isclose(upper, bound, rel_tol=1e-9):
                return min(1.0, cumulative / total)
            if upper > bound:
                if math.isinf(upper):
                    return min(1.0, previous_count / total)
                share = (bound - previous_bound) / (upper - previous_bound)
                return min(1.0, (previous_count + share * (cumulative - previous_count)) / total)
            previous_bound, previous_count = upper, cumulative
        return 1.0

    def quantile(self, q: float) -> float | None:
        """``histogram_quantile`` semantics: linear inside the bucket, capped at the top finite bound."""
        total = self.count
        if total <= 0 or len(self.buckets) < 2:
            return None
        rank = q * total
        previous_bound, previous_count = 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return previous_bound
                in_bucket = cumulative - previous_count
                if in_bucket <= 0:
                    return upper
                return previous_bound + (upper - previous_bound) * (rank - previous_count) / in_bucket
            previous_bound, previous_count = upper, cumulative
        return previous_bound

    @property
    def mean(self) -> float | None:
        if self.total_sum is None or self.count <= 0:
            return None
        return self.total_sum / self.count


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """The labels of ``growpage_build_info``: what diagnose reads instead of guessing."""

    version: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    mode: str | None = None
    block_size: int | None = None
    base_pages: int | None = None
    device: str | None = None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> BuildInfo:
        """From exported labels: ``home``/``home_version`` (agents before them: ``engine``...)."""
        return cls(
            version=labels.get("version") or None, engine=labels.get("home") or labels.get("engine") or None,
            engine_version=labels.get("home_version") or labels.get("engine_version") or None,
            mode=labels.get("mode") or None,
            block_size=_int_or_none(labels.get("block_size")),
            base_pages=_int_or_none(labels.get("base_pages")), device=labels.get("device") or None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "") else None
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class ServiceErrorRatios:
    """One service's error ratios at the window's end, over each burn-rate window, as the recording
    rules compute them (``1 - good / all`` of the histogram's rates, per service: the SLO labels).

    Attributes:
        labels: the service's SLO labels (cluster, namespace, model_name, where present).
        ratios: window (``"5m"``...) -> bad share over it; NaN: no events in it; a window absent: the
            data does not reach back to its start (its pairs are not checked).
        firing: the burn alerts Prometheus reports firing for the service at the evaluation time
            (its ``ALERTS`` series): a page that woke the on-call is named even where its short
            window has fallen back under the limit since its rule last ran.
    """

    labels: Mapping[str, str]
    ratios: Mapping[str, float]
    firing: frozenset[str] = frozenset()

    def describe(self) -> str:
        """``namespace chat, model_name m`` (or ``all`` when the series carry no SLO labels)."""
        return ", ".join(f"{key} {value}" for key, value in sorted(self.labels.items()) if value) or "all"


@dataclasses.dataclass(frozen=True)
class Scope:
    """Everything observed for one scope (the whole source, one namespace, or one pod).

    ``None`` means the source had no such series; a check that needs it reports ``unknown``.
    Counter fields are increases over the window (totals since start for a single snapshot).
    Gauges aggregate across series: mean of all samples, min of mins, max of maxes.
    """

    name: str
    utilization: GaugeStats | None = None
    intra_page_compress_ratio: GaugeStats | None = None
    compress_input_bytes: float | None = None
    compress_output_bytes: float | None = None
    allocation_latency: HistogramCounts | None = None
    page_allocations: float | None = None
    decisions: Mapping[str, float] | None = None
    oom_events: float | None = None
    fragmentation: GaugeStats | None = None
    pool_free_fraction_min: float | None = None
    pool_pages_last: Mapping[str, float] | None = None
    lts_entropy: HistogramCounts | None = None
    request_tokens: HistogramCounts | None = None
    requests_running_max: float | None = None
    agent_errors: Mapping[str, float] | None = None
    build_infos: tuple[BuildInfo, ...] = ()
    # Share of granted token slots holding no live token, highest in the window.
    stranded_slots_max: float | None = None
    # Components that were not active at the latest reading: component -> reason.
    inactive_components: Mapping[str, str] | None = None
    # Metrics whose only samples were NaN or +-Inf: read as unknown, and the report says so.
    non_finite: tuple[str, ...] = ()
    # Live tokens over granted token slots summed across the scope's pods (never a mean of per-pod
    # ratios, which weighs an idle pod like a full one), over the window: what the alerts read.
    pooled_utilization: GaugeStats | None = None
    # vLLM's own series (its /metrics), read where they sit next to GrowPage's: what users feel.
    vllm_ttft: HistogramCounts | None = None
    vllm_itl: HistogramCounts | None = None
    vllm_preemptions: float | None = None  # increase
    # The vLLM home's engine steps with a tracked request, and of them those observed (increases).
    tracked_steps: float | None = None
    observed_steps: float | None = None
    # What GrowPage cost vLLM (increases, both sides summed): its own code's seconds, and the seconds of
    # the vLLM calls it hooks, its own part included.
    own_seconds: float | None = None
    hooked_seconds: float | None = None
    # Monitor's forecast of enforce: the increase of each forecast counter present (catalog.FORECAST_METRICS),
    # by series name; None where the scope has none (enforced, off, or a GrowPage older than the forecast).
    forecast_counters: Mapping[str, float] | None = None
    vllm_kv_cache_usage_max: float | None = None
    vllm_queue_growth: float | None = None  # waiting requests at the end minus at the start
    # Each replica's lowest growpage_router_load in the window, by pod ("" where the series has no pod
    # label): a replica at FLEET_LOAD_FULL or more all window said it was full to the router.
    router_load_min_by_pod: Mapping[str, float] | None = None
    gpu_framebuffer_used_max: float | None = None  # DCGM used / (used + free), highest in window
    gpu_models: tuple[str, ...] = ()
    # Burn-rate windows of each latency SLO (key: the SLO's name), per service; None: the source holds
    # no history (scrapes, snapshots) or the scope is finer than a service (a pod).
    burn_ratios: Mapping[str, tuple[ServiceErrorRatios, ...]] | None = None
    # Health of the data path: endpoint response time, or Prometheus sample age and targets.
    response_time_s: float | None = None
    sample_age_s: float | None = None
    targets_total: int | None = None
    # GrowPage targets whose scrape fails while vLLM's target of the same pod answers (what
    # GrowPageAgentDown reads: a pod that answers neither is still loading its model).
    targets_down: int | None = None
    vllm_targets_up: int | None = None  # vLLM's own targets that answer (job vllm); None: no up series

    def build_value(self, field: str) -> Any:
        """The build-info ``field`` when every series agrees on it, else ``None`` (see :meth:`build_values`)."""
        values = self.build_values(field)
        return values[0] if len(values) == 1 else None

    def build_values(self, field: str) -> tuple[Any, ...]:
        found = {getattr(info, field) for info in self.build_infos} - {None}
        return tuple(sorted(found, key=str))

    @property
    def has_growpage_data(self) -> bool:
        """Whether any GrowPage series reached this scope (the build info or any metric)."""
        values = [getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in {"name", "gpu_framebuffer_used_max", "gpu_models", "response_time_s",
                                        "sample_age_s", "targets_total", "targets_down", "non_finite",
                                        "burn_ratios"}
                  and not field.name.startswith("vllm_")]
        return any(value not in (None, ()) for value in values)


@dataclasses.dataclass(frozen=True)
class Observations:
    """What a source observed: the whole-source scope plus an optional per-label breakdown."""

    source: Mapping[str, Any]  # kind, target, and source-specific details (JSON values)
    window: Window
    overall: Scope
    breakdown_label: str | None = None  # "namespace" or "pod"
    breakdown: Mapping[str, Scope] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()


def round_number(value: float | None) -> float | None:
    """Evidence numbers: 6 decimals (a microsecond, a millionth of a ratio) keep JSON diffs readable."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None  # JSON has no NaN/Infinity; "no value" is what they mean here
    return round(value, 6)
