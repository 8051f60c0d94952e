"""Cumulative metric state, folded from the core's get-and-reset stats snapshots.

``GrowPageManager.make_stats()`` hands out each window's samples once, so the histograms Prometheus
needs (cumulative bucket counts and sums since start) are kept here. Counters need no state: the
snapshot carries the core's cumulative totals. Plain Python, no prometheus import, so the arithmetic
is tested without a registry. Not thread-safe: :class:`~growpage.telemetry.agent.TelemetryAgent`
guards it with its lock.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from growpage import catalog
from growpage.core.stats import StatsSnapshot


@dataclasses.dataclass(frozen=True)
class LinkedExemplar:
    """A sampled trace that observed one histogram value (an OpenMetrics exemplar).

    Attributes:
        trace_id: 32 lowercase hex digits.
        span_id: 16 lowercase hex digits.
        value: the observed value, in the histogram's unit.
        timestamp_s: wall-clock time of the observation, seconds since the epoch.
    """

    trace_id: str
    span_id: str
    value: float
    timestamp_s: float


@dataclasses.dataclass(frozen=True)
class HistogramView:
    """An immutable copy of one histogram for a scrape.

    Attributes:
        upper_bounds: bucket upper bounds, the last one ``+inf``.
        cumulative_counts: observations ``<=`` each bound (same length as ``upper_bounds``).
        sum: sum of the observations, in the histogram's unit.
        exemplars: the latest exemplar per bucket, or None.
    """

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[int, ...]
    sum: float
    exemplars: tuple[LinkedExemplar | None, ...]

    @property
    def count(self) -> int:
        return self.cumulative_counts[-1]


class CumulativeHistogram:
    """Bucket counts and sum since start, Prometheus ``le`` semantics (a value equal to a bound
    falls in that bound's bucket).

    Args:
        upper_bounds: finite bucket bounds, ascending (``+Inf`` is added).
    """

    def __init__(self, upper_bounds: Sequence[float]):
        self.upper_bounds = (*upper_bounds, math.inf)
        self._counts = [0] * len(self.upper_bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._exemplars: list[LinkedExemplar | None] = [None] * len(self.upper_bounds)
        self._pending_exemplars: dict[int, LinkedExemplar] = {}

    def observe(self, values: Iterable[float]) -> None:
        """Count one window's samples, then show the exemplars offered before it was drained."""
        for value in values:
            if value != value:  # NaN would poison the sum forever; a NaN sample carries no signal
                continue
            self._counts[bisect.bisect_left(self.upper_bounds, value)] += 1
            self._sum += value
        for index, exemplar in self._pending_exemplars.items():
            self._exemplars[index] = exemplar
        self._pending_exemplars.clear()

    def add_exemplar(self, exemplar: LinkedExemplar) -> None:
        """Offer ``exemplar`` as the latest example of the bucket its value falls in.

        NOTE: it is shown from the next ``observe`` on: the tracer sees a grant as it happens, the
        histogram only when the window holding it is drained, and an exemplar must not point into
        a bucket whose count does not include it yet.
        """
        if exemplar.value == exemplar.value:
            self._pending_exemplars[bisect.bisect_left(self.upper_bounds, exemplar.value)] = exemplar

    def view(self) -> HistogramView:
        running, cumulative = 0, []
        for count in self._counts:
            running += count
            cumulative.append(running)
        return HistogramView(self.upper_bounds, tuple(cumulative), self._sum, tuple(self._exemplars))


# Which window samples of a snapshot feed which histogram of the contract.
HISTOGRAM_SAMPLES: dict[str, Callable[[StatsSnapshot], Sequence[float]]] = {
    catalog.ALLOCATION_LATENCY.name: lambda snapshot: snapshot.allocation_latencies_s,
    catalog.LTS_ENTROPY.name: lambda snapshot: snapshot.lts_entropy_at_finish,
    catalog.STS_DENSITY.name: lambda snapshot: snapshot.sts_density_at_decision,
    catalog.REQUEST_TOKENS.name: lambda snapshot: snapshot.request_tokens_at_finish,
}


@dataclasses.dataclass(frozen=True)
class MetricView:
    """Everything one scrape renders, copied out of :class:`MetricState` under the agent's lock.

    Attributes:
        snapshot: the latest stats snapshot (counters are its cumulative totals, gauges its
            instantaneous pool state), or None before the first successful poll.
        histograms: by contract metric name.
        compress_ratio: ``growpage_intra_page_compress_ratio`` for this scrape, or None (no
            compression has finished yet: the series is absent).
        build_info: ``growpage_build_info`` label values by label name.
    """

    snapshot: StatsSnapshot | None
    histograms: Mapping[str, HistogramView]
    compress_ratio: float | None
    build_info: Mapping[str, str]


class MetricState:
    """What telemetry must remember between snapshots.

    Args:
        build_info: ``growpage_build_info`` label values, by label name.
    """

    def __init__(self, build_info: Mapping[str, str]):
        self.build_info = dict(build_info)
        self.snapshot: StatsSnapshot | None = None
        self.histograms = {spec.name: CumulativeHistogram(spec.buckets) for spec in catalog.METRICS
                           if spec.type is catalog.MetricType.HISTOGRAM}
        self.samples_dropped_total = 0
        # Compression bytes since the ratio's window last closed (see take_compress_ratio).
        self._ratio_bytes_in = 0
        self._ratio_bytes_out = 0
        self._last_compress_ratio: float | None = None

    def fold(self, snapshot: StatsSnapshot) -> None:
        """Add one get-and-reset snapshot: its window samples go into the cumulative histograms."""
        for name, samples in HISTOGRAM_SAMPLES.items():
            self.histograms[name].observe(samples(snapshot))
        self._ratio_bytes_in += snapshot.window_compress_input_bytes
        self._ratio_bytes_out += snapshot.window_compress_output_bytes
        self.samples_dropped_total += snapshot.samples_dropped
        self.snapshot = snapshot

    def add_exemplar(self, metric_name: str, exemplar: LinkedExemplar) -> None:
        self.histograms[metric_name].add_exemplar(exemplar)

    def take_compress_ratio(self) -> float | None:
        """Close the ratio's window (one per scrape) and return the gauge's value.

        Bytes in / bytes out of the compressions folded since the window last closed. A window
        without output bytes keeps the previous value and carries its bytes into the next window,
        so an idle scrape neither drops the signal nor reports a made-up 1.0; None until the first
        compression (the series is then absent rather than NaN, which would poison ``avg()``).
        """
        if self._ratio_bytes_out > 0:
            self._last_compress_ratio = self._ratio_bytes_in / self._ratio_bytes_out
            self._ratio_bytes_in = self._ratio_bytes_out = 0
        return self._last_compress_ratio

    def view(self) -> MetricView:
        """A copy for one scrape (closes the compress ratio's window)."""
        return MetricView(
            snapshot=self.snapshot,
            histograms={name: histogram.view() for name, histogram in self.histograms.items()},
            compress_ratio=self.take_compress_ratio(),
            build_info=dict(self.build_info))

    def agent_errors(self, own_errors: Mapping[str, int]) -> dict[str, int]:
        """Faults by component: the core's (latest snapshot) plus telemetry's own.

        Every component of the contract is present (0 until a fault), so ``rate()`` and
        ``increase()`` see the first fault instead of a series appearing out of nowhere.

        Args:
            own_errors: faults telemetry caught itself (``collector``, ``tracing``), by component.
        """
        errors: collections.Counter[str] = collections.Counter(
            {component: 0 for component in catalog.AGENT_ERRORS.label_values["component"]})
        if self.snapshot is not None:
            errors.update(self.snapshot.agent_errors_total)
        errors.update(own_errors)
        return dict(errors)
