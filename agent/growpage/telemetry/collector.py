"""The Prometheus collector for the metrics contract, generated from ``growpage.catalog``.

Every family's name, type, help, unit, labels and buckets come from :data:`catalog.METRICS`; this
module only says where each value is read (:data:`SAMPLE_READERS`, keyed by the catalog's names).
A reader that raises costs its own family only: the fault is counted in
``growpage_agent_errors_total{component="collector"}`` and the rest of the scrape is served
(scraping never raises).
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from growpage import catalog
from growpage.core.faults import FaultGuard
from growpage.core.quantiles import percentile
from growpage.core.stats import PoolGauges, StatsSnapshot
from growpage.telemetry.state import HistogramView, MetricView

logger = logging.getLogger(__name__)

COLLECTOR_COMPONENT = "collector"

# (label values besides ``model_name``, value) pairs of one family.
Samples = Sequence[tuple[tuple[str, ...], float]]
Reader = Callable[[MetricView], Samples]


class MetricSource(Protocol):
    """What the collector reads; :class:`~growpage.telemetry.agent.TelemetryAgent` implements it."""

    def metric_view(self) -> MetricView:
        """A consistent copy of the metric state for one scrape."""

    def agent_errors(self) -> dict[str, int]:
        """Faults by component (core and telemetry), read after the other families were built."""

    def count_error(self, component: str) -> None:
        """Count a fault caught by telemetry."""


def demand_p95(gauges: PoolGauges) -> float:
    """The 95th percentile of running requests' capacity boundaries, in pages.

    0 with nothing running: no KV demand, which autoscaling sums should see as 0, not as a gap.
    """
    p95 = percentile(gauges.capacity_boundaries, 0.95)
    return 0.0 if p95 is None else p95


def _gauge(read: Callable[[PoolGauges], float]) -> Reader:
    return lambda view: [] if view.snapshot is None else [((), float(read(view.snapshot.gauges)))]


def _counter(read: Callable[[StatsSnapshot], float]) -> Reader:
    return lambda view: [] if view.snapshot is None else [((), float(read(view.snapshot)))]


def _decisions(view: MetricView) -> Samples:
    if view.snapshot is None:
        return []
    totals = view.snapshot.decisions_total
    # Only the catalog's kinds: the label's value set stays bounded whatever the core records.
    return [((kind,), float(totals.get(kind, 0)))
            for kind in catalog.DECISIONS.label_values["decision"]]


def _pool_pages(view: MetricView) -> Samples:
    if view.snapshot is None:
        return []
    gauges = view.snapshot.gauges
    pages = {"free": gauges.pages_free, "reserved": gauges.pages_reserved, "used": gauges.pages_used}
    return [((state,), float(pages[state])) for state in catalog.POOL_PAGES.label_values["state"]]


def _compress_ratio(view: MetricView) -> Samples:
    return [] if view.compress_ratio is None else [((), view.compress_ratio)]


def _build_info(view: MetricView) -> Samples:
    return [(tuple(view.build_info[label] for label in catalog.BUILD_INFO.labels), 1.0)]


def demand_buckets(boundaries: Sequence[float]) -> list[tuple[str, float]]:
    """``(le, running requests whose capacity boundary is <= le)``, cumulative, ``+Inf`` last."""
    ordered = sorted(boundaries)
    bounds = catalog.DEMAND_PAGES_BUCKETS
    counts = [bisect.bisect_right(ordered, bound) for bound in bounds]
    return [*((str(float(b)), float(c)) for b, c in zip(bounds, counts, strict=True)), ("+Inf", float(len(ordered)))]


def _demand_requests(view: MetricView) -> Samples:
    if view.snapshot is None:
        return []
    return [((le,), count) for le, count in demand_buckets(view.snapshot.gauges.capacity_boundaries)]


_SLUG = re.compile(r"[^a-z0-9_]+")


def label_slug(text: str) -> str:
    """A bounded, Prometheus-friendly label value: lowercase ``[a-z0-9_]``, at most 40 characters."""
    return _SLUG.sub("_", str(text).lower()).strip("_")[:40] or "unknown"


def _agent_active(view: MetricView) -> Samples:
    """One series per component: 1 and reason ``active``, or 0 and why not.

    Components the core has not reported yet are left out rather than guessed at (a host without
    an enforcer reports it as inactive with its reason).
    """
    if view.snapshot is None:
        return []
    states = view.snapshot.component_states
    return [((label_slug(component), label_slug(state)), 1.0 if state == catalog.AGENT_ACTIVE_REASON else 0.0)
            for component, state in sorted(states.items())]


def _samples_dropped(view: MetricView) -> Samples:
    return [((), float(view.samples_dropped_total))]


# Where each non-histogram metric of the contract is read. Histograms come from the view's
# cumulative state; agent errors are read last (see GrowPageCollector.collect).
SAMPLE_READERS: dict[str, Reader] = {
    catalog.UTILIZATION.name: _gauge(lambda gauges: gauges.utilization),
    catalog.INTRA_PAGE_COMPRESS_RATIO.name: _compress_ratio,
    catalog.COMPRESS_INPUT_BYTES.name: _counter(lambda snapshot: snapshot.compress_input_bytes_total),
    catalog.COMPRESS_OUTPUT_BYTES.name: _counter(lambda snapshot: snapshot.compress_output_bytes_total),
    catalog.ALLOCATIONS.name: _counter(lambda snapshot: snapshot.pages_allocated_total),
    catalog.DECISIONS.name: _decisions,
    catalog.DEMAND_P95.name: _gauge(demand_p95),
    catalog.DEMAND_PAGES.name: _gauge(lambda gauges: sum(gauges.capacity_boundaries)),
    catalog.DEMAND_REQUESTS.name: _demand_requests,
    catalog.COMPRESSION_RATIO.name: _gauge(lambda gauges: gauges.compression_ratio),
    catalog.FRAGMENTATION.name: _gauge(lambda gauges: gauges.fragmentation),
    catalog.LIVE_TOKENS.name: _gauge(lambda gauges: gauges.live_tokens),
    catalog.GRANTED_TOKEN_SLOTS.name: _gauge(lambda gauges: gauges.granted_token_slots),
    catalog.USED_TOKEN_SLOTS.name: _gauge(lambda gauges: gauges.used_token_slots),
    catalog.LOGICAL_BYTES.name: _gauge(lambda gauges: gauges.logical_bytes),
    catalog.STORED_BYTES.name: _gauge(lambda gauges: gauges.stored_bytes),
    catalog.POOL_PAGES.name: _pool_pages,
    catalog.REQUESTS_RUNNING.name: _gauge(lambda gauges: gauges.requests_running),
    catalog.OOM_EVENTS.name: _counter(lambda snapshot: snapshot.oom_events_total),
    catalog.BUILD_INFO.name: _build_info,
    catalog.AGENT_ACTIVE.name: _agent_active,
    catalog.SAMPLES_DROPPED.name: _samples_dropped,
}


def exposition_unit(spec: catalog.MetricSpec) -> str:
    """The OpenMetrics ``# UNIT`` of a family, or "" (OpenMetrics requires the name to end with
    ``_<unit>``; ratios and counts such as ``_utilization`` carry their unit in the help text)."""
    base = spec.name.removesuffix("_total") if spec.type is catalog.MetricType.COUNTER else spec.name
    return spec.unit if spec.unit and base.endswith(f"_{spec.unit}") else ""


Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily


def empty_family(spec: catalog.MetricSpec) -> Family:
    """The family of ``spec`` with no samples (names, type, help, unit, labels)."""
    labels = [catalog.MODEL_LABEL, *spec.exported_labels]
    unit = exposition_unit(spec)
    if spec.type is catalog.MetricType.COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=labels, unit=unit)
    if spec.type is catalog.MetricType.HISTOGRAM:
        return HistogramMetricFamily(spec.name, spec.help, labels=labels, unit=unit)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels, unit=unit)  # gauge and info


def _histogram_buckets(histogram: HistogramView) -> list[tuple]:
    buckets: list[tuple] = []
    for bound, count, exemplar in zip(histogram.upper_bounds, histogram.cumulative_counts,
                                      histogram.exemplars, strict=True):
        bucket: tuple = (floatToGoString(bound), float(count))
        if exemplar is not None:
            bucket += (Exemplar({"trace_id": exemplar.trace_id, "span_id": exemplar.span_id},
                                exemplar.value, exemplar.timestamp_s),)
        buckets.append(bucket)
    return buckets


class GrowPageCollector(Collector):
    """Renders the contract for one engine from a :class:`MetricSource`.

    Args:
        source: the metric state's owner (the telemetry agent).
        model: value of the ``model_name`` label on every series.
    """

    def __init__(self, source: MetricSource, model: str):
        self._source = source
        self._model = model
        self._faults = FaultGuard(source.count_error, logger,
                                  suffix="further faults are counted in growpage_agent_errors_total")

    def describe(self) -> Iterator[Metric]:
        """Names for the registry's duplicate check, without reading (or closing windows of) state."""
        for spec in catalog.METRICS:
            yield empty_family(spec)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        try:
            view: MetricView | None = self._source.metric_view()
        except Exception:
            self._fault("metric state")
            view = None
        if view is not None:
            for spec in catalog.METRICS:
                if spec is catalog.AGENT_ERRORS:
                    continue
                try:
                    families[spec.name] = self._family(spec, view)
                except Exception:
                    self._fault(spec.name)
        try:  # last, so the faults of this very scrape are in it
            errors = self._source.agent_errors()
            errors_family = empty_family(catalog.AGENT_ERRORS)
            assert not isinstance(errors_family, HistogramMetricFamily)  # a counter
            for component, count in sorted(errors.items()):
                errors_family.add_metric([self._model, component], float(count))
            families[catalog.AGENT_ERRORS.name] = errors_family
        except Exception:
            logger.debug("growpage telemetry: agent errors family failed", exc_info=True)
        for spec in catalog.METRICS:
            if spec.name in families:
                yield families[spec.name]

    def _family(self, spec: catalog.MetricSpec, view: MetricView) -> Family:
        family = empty_family(spec)
        if isinstance(family, HistogramMetricFamily):
            histogram = view.histograms[spec.name]
            family.add_metric([self._model], _histogram_buckets(histogram), histogram.sum)
            return family
        for label_values, value in SAMPLE_READERS[spec.name](view):
            family.add_metric([self._model, *label_values], value)
        return family

    def _fault(self, what: str) -> None:
        # logged once per series: a persistent fault must not flood the logs at every scrape
        self._faults.fault(COLLECTOR_COMPONENT, f"collecting {what} failed; it is left out of the scrape",
                           log_key=what)
