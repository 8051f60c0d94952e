"""The SLOs' error ratios over every burn-rate window, at the diagnosis' end, per service.

What the burn-rate rules compare, read from the raw series: ``1 - good / all`` of the rates over
each window, summed per service (the mixin's SLO labels: cluster, namespace, model). A latency SLO's
good events are its threshold's bucket and all are ``_count``; the availability SLO's are vLLM's
finished requests not aborted or failed over all of them. vLLM's SLOs count every vLLM pod, whatever
GrowPage's mode (as the rules do: users feel a rollback to off too); GrowPage's grant latency counts
its own series. Raw rates, not the recorded ratios: they need no rules loaded, and they take the
selection (``--namespace``, ``--pod``, ``--cluster``) like every other query. A window counts as
covered for a service when Prometheus holds a sample of its total events at
the window's start (within the 5m lookback); an uncovered window's pairs are not checked.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence

from growpage import catalog
from growpage.diagnose.observations import ServiceErrorRatios
from growpage.monitoring.mixin import MixinConfig
from growpage.monitoring.promql import duration_seconds, le_value

_LOOKBACK = "5m"  # Prometheus' default lookback: a sample this old still answers an instant query
_THREADS = 8

Query = Callable[[str], list[tuple[dict[str, str], float]]]


def burn_windows(thresholds: catalog.MixinThresholds) -> tuple[str, ...]:
    """Every long and short window of the burn alerts, shortest first, once each."""
    found = {w for alert in thresholds.burn_rate_alerts for pair in alert.windows
             for w in (pair.long_window, pair.short_window)}
    return tuple(sorted(found, key=duration_seconds))


@dataclasses.dataclass(frozen=True)
class SLOEvents:
    """The counters of one SLO with burn alerts: good events are ``good`` with ``good_matcher``,
    all events are ``total``."""

    name: str
    good: str
    good_matcher: str
    total: str


def slo_events(thresholds: catalog.MixinThresholds) -> tuple[SLOEvents, ...]:
    """Every SLO with burn-rate alerts, with the deployment's thresholds."""
    def latency(name: str, histogram: str, threshold_s: float) -> SLOEvents:
        return SLOEvents(name, f"{histogram}_bucket", f'le="{le_value(threshold_s)}"', f"{histogram}_count")

    availability = thresholds.vllm_availability_slo
    return (*(latency(slo.name, slo.histogram, slo.threshold_s) for slo in thresholds.vllm_latency_slos),
            SLOEvents(availability.name, availability.counter, availability.good_matcher, availability.counter),
            latency(catalog.SLO_ALLOCATION_LATENCY.name, catalog.ALLOCATION_LATENCY.name,
                    thresholds.allocation_latency_s))


class BurnQueries:
    """The PromQL of the burn windows for one selection (``matchers``) and one mixin config."""

    def __init__(self, matchers: Sequence[str], config: MixinConfig):
        self.matchers = tuple(matchers)
        self.service = ", ".join(config.slo_labels)

    def _select(self, name: str, *extra: str) -> str:
        matchers = (*extra, *self.matchers)
        return name + ("{" + ", ".join(matchers) + "}" if matchers else "")

    def error_ratio(self, slo: SLOEvents, window: str) -> str:
        def rate(series: str) -> str:
            return f"sum by ({self.service}) (rate({series}[{window}]))"

        return f"1 - ({rate(self._select(slo.good, slo.good_matcher))} / {rate(self._select(slo.total))})"

    def covered(self, slo: SLOEvents, window: str) -> str:
        return (f"count by ({self.service}) (last_over_time({self._select(slo.total)}[{_LOOKBACK}] "
                f"offset {window}))")


def read_burn_ratios(query: Query, queries: BurnQueries, thresholds: catalog.MixinThresholds,
                     service_labels: Sequence[str]) -> dict[str, tuple[ServiceErrorRatios, ...]]:
    """SLO name -> each service's error ratios over the covered windows (absent: not covered)."""
    jobs = [(slo.name, window, kind, expr) for slo in slo_events(thresholds) for window in burn_windows(thresholds)
            for kind, expr in (("ratio", queries.error_ratio(slo, window)), ("covered", queries.covered(slo, window)))]
    with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
        results = list(pool.map(lambda job: query(job[3]), jobs))
    ratios: dict[str, dict[tuple[str, ...], dict[str, float]]] = {}
    covered: set[tuple[str, tuple[str, ...], str]] = set()
    for (slo, window, kind, _), rows in zip(jobs, results, strict=True):
        for labels, value in rows:
            key = tuple(labels.get(label, "") for label in service_labels)
            if kind == "covered":
                covered.add((slo, key, window))
            else:
                ratios.setdefault(slo, {}).setdefault(key, {})[window] = value
    return {slo: tuple(ServiceErrorRatios(dict(zip(service_labels, key, strict=True)),
                                          {w: r for w, r in by_window.items() if (slo, key, w) in covered})
                       for key, by_window in sorted(services.items()))
            for slo, services in ratios.items()}


def for_namespace(burns: Mapping[str, tuple[ServiceErrorRatios, ...]],
                  namespace: str) -> dict[str, tuple[ServiceErrorRatios, ...]]:
    """The services of one namespace (a breakdown scope)."""
    return {slo: tuple(s for s in services if s.labels.get("namespace") == namespace)
            for slo, services in burns.items()}
