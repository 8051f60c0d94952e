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
import time
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
        compress_ratio: ``growpage_intra_page_compress_ratio``, or None (no compression has
            finished yet: the series is absent).
        build_info: ``growpage_build_info`` label values by label name.
        samples_dropped_total: histogram samples lost to full stats windows since start.
    """

    snapshot: StatsSnapshot | None
    histograms: Mapping[str, HistogramView]
    compress_ratio: float | None
    build_info: Mapping[str, str]
    samples_dropped_total: int = 0


class CompressRatioWindow:
    """Bytes in / bytes out of the compressions over the last ``window_s`` seconds of polls.

    Computed when a snapshot is folded, never when a scrape reads it: every scraper (two Prometheus
    replicas, a curl) sees the same value between two polls. It reads the core's cumulative byte
    counters at each poll, so no compression is counted twice or lost between scrapes. A window
    without output bytes keeps the previous value (an idle spell neither drops the signal nor
    reports a made-up 1.0); None until the first compression (the series is then absent rather than
    NaN, which would poison ``avg()``).

    Args:
        window_s: the window's length (catalog.COMPRESS_RATIO_WINDOW_S).
    """

    def __init__(self, window_s: float = catalog.COMPRESS_RATIO_WINDOW_S):
        self.window_s = window_s
        self._points: collections.deque[tuple[float, int, int]] = collections.deque()
        self.value: float | None = None

    def add(self, now_s: float, bytes_in_total: int, bytes_out_total: int,
            window_in: int = 0, window_out: int = 0) -> float | None:
        """Record the cumulative totals at ``now_s``; returns the ratio over the window ending now.

        Args:
            now_s: monotonic seconds of this poll.
            bytes_in_total, bytes_out_total: the core's cumulative compression bytes.
            window_in, window_out: bytes of this poll's window, used only at the first poll to
                date its compressions after the start (the totals may predate the agent).
        """
        if not self._points:
            self._points.append((now_s, bytes_in_total - window_in, bytes_out_total - window_out))
        elif bytes_out_total < self._points[-1][2]:  # the core was replaced: start over from here
            self._points.clear()
            self._points.append((now_s, 0, 0))
        self._points.append((now_s, bytes_in_total, bytes_out_total))
        # Keep the newest point at or before the window's start as the baseline.
        while len(self._points) > 2 and self._points[1][0] <= now_s - self.window_s:
            self._points.popleft()
        _, base_in, base_out = self._points[0]
        if bytes_out_total - base_out > 0:
            self.value = (bytes_in_total - base_in) / (bytes_out_total - base_out)
        return self.value


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
        self.compress_ratio = CompressRatioWindow()

    def fold(self, snapshot: StatsSnapshot, now_s: float | None = None) -> None:
        """Add one get-and-reset snapshot: its window samples go into the cumulative histograms.

        Args:
            snapshot: the core's stats since the previous fold.
            now_s: monotonic seconds of the poll (default: now), for the compress ratio's window.
        """
        for name, samples in HISTOGRAM_SAMPLES.items():
            self.histograms[name].observe(samples(snapshot))
        self.compress_ratio.add(time.monotonic() if now_s is None else now_s,
                                snapshot.compress_input_bytes_total, snapshot.compress_output_bytes_total,
                                snapshot.window_compress_input_bytes, snapshot.window_compress_output_bytes)
        self.samples_dropped_total += snapshot.samples_dropped
        self.snapshot = snapshot

    def add_exemplar(self, metric_name: str, exemplar: LinkedExemplar) -> None:
        self.histograms[metric_name].add_exemplar(exemplar)

    def view(self) -> MetricView:
        """A copy for one scrape; reading changes nothing, so every scraper sees the same values."""
        return MetricView(
            snapshot=self.snapshot,
            histograms={name: histogram.view() for name, histogram in self.histograms.items()},
            compress_ratio=self.compress_ratio.value,
            build_info=dict(self.build_info),
            samples_dropped_total=self.samples_dropped_total)

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
