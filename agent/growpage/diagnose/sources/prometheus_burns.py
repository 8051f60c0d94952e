"""The SLOs' error ratios over every burn-rate window, at the diagnosis' end, per service.

Where Prometheus has the shipped recording rules loaded and the selection is per service, the
ratios are those recordings (:class:`RecordedBurnQueries`): exactly what the burn alerts compare, so
diagnose and the pages agree however much history a window holds. Otherwise they are read from the
raw series: ``1 - good / all`` of the rates over each window, summed per service (the mixin's SLO
labels: cluster, namespace, model). A latency SLO's good events are its threshold's bucket and all
are ``_count``; the availability SLO's are vLLM's finished requests not aborted or failed over all
of them. vLLM's SLOs count every vLLM pod, whatever GrowPage's mode (as the rules do: users feel a
rollback to off too); GrowPage's grant latency counts its own series. Raw rates need no rules
loaded and take ``--pod``; a raw window counts as covered for a service when Prometheus holds a
sample of its total events at the window's start (within the 5m lookback), and an uncovered
window's pairs are not checked. Windows are scaled by the mixin config's ``time_scale`` (a game day).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence

from growpage import catalog
from growpage.diagnose.observations import ServiceErrorRatios
from growpage.monitoring import recording_rules as rec
from growpage.monitoring.mixin import MixinConfig
from growpage.monitoring.promql import duration_seconds, scale_duration
from growpage.monitoring.recording_rules import SLOEvents, slo_events

_LOOKBACK = "5m"  # Prometheus' default lookback: a sample this old still answers an instant query
_THREADS = 8

Query = Callable[[str], list[tuple[dict[str, str], float]]]


def burn_windows(thresholds: catalog.MixinThresholds) -> tuple[str, ...]:
    """Every long and short window of the burn alerts, shortest first, once each."""
    found = {w for alert in thresholds.burn_rate_alerts for pair in alert.windows
             for w in (pair.long_window, pair.short_window)}
    return tuple(sorted(found, key=duration_seconds))


class BurnQueries:
    """The PromQL of the burn windows for one selection (``matchers``) and one mixin config."""

    def __init__(self, matchers: Sequence[str], config: MixinConfig):
        self.matchers = tuple(matchers)
        self.service = ", ".join(config.slo_labels)
        self.time_scale = config.time_scale  # a game day's rules read every window scaled: so does diagnose

    def _select(self, name: str, *extra: str) -> str:
        matchers = (*extra, *self.matchers)
        return name + ("{" + ", ".join(matchers) + "}" if matchers else "")

    def error_ratio(self, slo: SLOEvents, window: str) -> str:
        window = scale_duration(window, self.time_scale)

        def rate(series: str) -> str:
            return f"sum by ({self.service}) (rate({series}[{window}]))"

        return f"1 - ({rate(self._select(slo.good, slo.good_matcher))} / {rate(self._select(slo.total))})"

    def firing(self) -> str:
        """The burn alerts Prometheus has firing in the selection (its ``ALERTS`` series carry the
        alert's service labels, never a pod's)."""
        names = "|".join(sorted(name for name in catalog.SEVERITY_BY_ALERT if name.endswith("Burn")))
        return self._select("ALERTS", 'alertstate="firing"', f'alertname=~"{names}"')

    def covered(self, slo: SLOEvents, window: str) -> str:
        lookback, window = (scale_duration(w, self.time_scale) for w in (_LOOKBACK, window))
        return (f"count by ({self.service}) (last_over_time({self._select(slo.total)}[{lookback}] "
                f"offset {window}))")


class RecordedBurnQueries(BurnQueries):
    """The same ratios read from the shipped recording rules where Prometheus has them loaded: what
    the burn alerts themselves compare, window for window (sums of recorded per-service 5m rates),
    so diagnose and the pages agree whatever history the windows hold. A window counts as covered
    where its recording has a value."""

    def error_ratio(self, slo: SLOEvents, window: str) -> str:
        return self._select(rec.error_ratio_name(slo.name, window))

    def covered(self, slo: SLOEvents, window: str) -> str:
        return f"count by ({self.service}) ({self.error_ratio(slo, window)} >= 0)"


def burn_queries(query: Query, matchers: Sequence[str], config: MixinConfig, per_pod: bool) -> BurnQueries:
    """Recorded ratios when the rules are loaded and the selection is per service; raw rates otherwise
    (no rules, or ``--pod``: the recordings are per service and carry no pod)."""
    probe = rec.error_ratio_name(catalog.SLO_VLLM_TTFT.name, burn_windows(config.thresholds)[0])
    if not per_pod and query(f"count({probe})"):
        return RecordedBurnQueries(matchers, config)
    return BurnQueries(matchers, config)


def read_burn_ratios(query: Query, queries: BurnQueries, thresholds: catalog.MixinThresholds,
                     service_labels: Sequence[str]) -> dict[str, tuple[ServiceErrorRatios, ...]]:
    """SLO name -> each service's error ratios over the covered windows (absent: not covered), and
    the burn alerts Prometheus has firing for it (every SLO's entry of a service carries them all;
    each check names its own)."""
    slos = slo_events(thresholds)
    jobs = [(slo.name, window, kind, expr) for slo in slos for window in burn_windows(thresholds)
            for kind, expr in (("ratio", queries.error_ratio(slo, window)), ("covered", queries.covered(slo, window)))]
    jobs.append(("", "", "firing", queries.firing()))
    with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
        results = list(pool.map(lambda job: query(job[3]), jobs))
    ratios: dict[str, dict[tuple[str, ...], dict[str, float]]] = {}
    covered: set[tuple[str, tuple[str, ...], str]] = set()
    firing: dict[tuple[str, ...], set[str]] = {}
    for (slo_name, window, kind, _), rows in zip(jobs, results, strict=True):
        for labels, value in rows:
            key = tuple(labels.get(label, "") for label in service_labels)
            if kind == "firing":
                firing.setdefault(key, set()).add(labels.get("alertname", ""))
            elif kind == "covered":
                covered.add((slo_name, key, window))
            else:
                ratios.setdefault(slo_name, {}).setdefault(key, {})[window] = value
    return {slo: tuple(ServiceErrorRatios(dict(zip(service_labels, key, strict=True)),
                                          {w: r for w, r in by_window.items() if (slo, key, w) in covered},
                                          frozenset(firing.get(key, ())))
                       for key, by_window in sorted(services.items()))
            for slo, services in ratios.items()}


def for_namespace(burns: Mapping[str, tuple[ServiceErrorRatios, ...]],
                  namespace: str) -> dict[str, tuple[ServiceErrorRatios, ...]]:
    """The services of one namespace (a breakdown scope)."""
    return {slo: tuple(s for s in services if s.labels.get("namespace") == namespace)
            for slo, services in burns.items()}
