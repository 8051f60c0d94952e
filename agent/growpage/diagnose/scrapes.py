"""Reduce two or more expositions (live scrapes or saved snapshots) to :class:`Observations`.

Counters become increases between consecutive expositions, reset-aware like Prometheus'
``increase()`` but exact (no extrapolation): a value that drops means the agent restarted, and the
new value is all increase. A series that first appears in a later exposition counts from 0 (labelled
counters appear on their first event). With a single exposition, counters are totals since the
agent started and the window says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from growpage import catalog
from growpage.diagnose.exposition import Exposition
from growpage.diagnose.observations import BuildInfo, GaugeStats, HistogramCounts, Observations, Scope, Window

LabelFilter = Callable[[Mapping[str, str]], bool]
SeriesKey = tuple[tuple[str, str], ...]


def observations_from_expositions(
    agent: Sequence[Exposition], dcgm: Sequence[Exposition], source: Mapping[str, object],
    response_time_s: float | None = None, notes: tuple[str, ...] = (), sample_noun: str = "scrapes",
) -> Observations:
    """Observations over the span of ``agent`` expositions (sorted by time; at least one)."""
    agent = sorted(agent, key=lambda exposition: exposition.time_s)
    dcgm = sorted(dcgm, key=lambda exposition: exposition.time_s)
    assert agent, "callers check that at least one agent exposition exists"
    kind = "lifetime" if len(agent) == 1 else sample_noun
    window = Window(agent[0].time_s, agent[-1].time_s, kind, num_samples=len(agent))
    overall = build_scope("all", agent, dcgm, lambda labels: True, response_time_s=response_time_s)
    # Federated or hand-merged snapshots may carry the scrape's namespace label: break down by it.
    namespaces = sorted({sample.labels["namespace"] for exposition in agent for sample in exposition.samples
                         if sample.name.startswith("growpage_") and sample.labels.get("namespace")})
    breakdown = {
        namespace: build_scope(namespace, agent, dcgm,
                               lambda labels, namespace=namespace: labels.get("namespace") == namespace)
        for namespace in namespaces
    }
    return Observations(source=source, window=window, overall=overall,
                        breakdown_label="namespace" if breakdown else None, breakdown=breakdown, notes=notes)


def build_scope(name: str, agent: Sequence[Exposition], dcgm: Sequence[Exposition], keep: LabelFilter,
                response_time_s: float | None = None) -> Scope:
    decisions = counter_increase_by(agent, catalog.DECISIONS.name, keep, "decision")
    errors = counter_increase_by(agent, catalog.AGENT_ERRORS.name, keep, "component")
    return Scope(
        name=name,
        utilization=gauge_stats(agent, catalog.UTILIZATION.name, keep),
        intra_page_compress_ratio=gauge_stats(agent, catalog.INTRA_PAGE_COMPRESS_RATIO.name, keep),
        compress_input_bytes=counter_increase(agent, catalog.COMPRESS_INPUT_BYTES.name, keep),
        compress_output_bytes=counter_increase(agent, catalog.COMPRESS_OUTPUT_BYTES.name, keep),
        allocation_latency=histogram_increase(agent, catalog.ALLOCATION_LATENCY.name, keep),
        page_allocations=counter_increase(agent, catalog.ALLOCATIONS.name, keep),
        decisions=decisions,
        oom_events=counter_increase(agent, catalog.OOM_EVENTS.name, keep),
        fragmentation=gauge_stats(agent, catalog.FRAGMENTATION.name, keep),
        pool_free_fraction_min=_pool_free_fraction_min(agent, keep),
        pool_pages_last=_pool_pages_last(agent, keep),
        lts_entropy=histogram_increase(agent, catalog.LTS_ENTROPY.name, keep),
        request_tokens=histogram_increase(agent, catalog.REQUEST_TOKENS.name, keep),
        requests_running_max=_gauge_max(agent, catalog.REQUESTS_RUNNING.name, keep),
        agent_errors=errors,
        build_infos=_build_infos(agent, keep),
        gpu_framebuffer_used_max=_framebuffer_used_max(dcgm, keep),
        gpu_models=tuple(sorted({s.labels[catalog.DCGM_MODEL_NAME_LABEL] for e in dcgm for s in e.samples
                                 if s.name == catalog.DCGM_FB_USED and keep(s.labels)
                                 and s.labels.get(catalog.DCGM_MODEL_NAME_LABEL)})),
        response_time_s=response_time_s,
    )


def _series(exposition: Exposition, name: str, keep: LabelFilter) -> dict[SeriesKey, float]:
    return {tuple(sorted(sample.labels.items())): sample.value for sample in exposition.samples
            if sample.name == name and keep(sample.labels) and not math.isnan(sample.value)}


def gauge_stats(expositions: Sequence[Exposition], name: str, keep: LabelFilter) -> GaugeStats | None:
    """Mean of every sample, min, max, and the mean of the newest exposition that had the gauge."""
    per_exposition = [list(_series(e, name, keep).values()) for e in expositions]
    values = [value for values in per_exposition for value in values]
    if not values:
        return None
    newest = next(values for values in reversed(per_exposition) if values)
    return GaugeStats(mean=sum(values) / len(values), min=min(values), max=max(values),
                      last=sum(newest) / len(newest))


def _gauge_max(expositions: Sequence[Exposition], name: str, keep: LabelFilter) -> float | None:
    stats = gauge_stats(expositions, name, keep)
    return stats.max if stats else None


def _increase_per_series(expositions: Sequence[Exposition], name: str, keep: LabelFilter,
                         ) -> dict[SeriesKey, float]:
    if len(expositions) == 1:
        return _series(expositions[0], name, keep)  # lifetime: the totals themselves
    increases: dict[SeriesKey, float] = {}
    previous: dict[SeriesKey, float] = {}
    for index, exposition in enumerate(expositions):
        current = _series(exposition, name, keep)
        for key, value in current.items():
            if key in previous:
                before = previous[key]
                # NOTE: a drop is a counter reset (agent restart): everything since is increase.
                increases[key] = increases.get(key, 0.0) + (value - before if value >= before else value)
            elif index > 0:
                increases[key] = increases.get(key, 0.0) + value  # created between expositions
            else:
                increases.setdefault(key, 0.0)
        previous.update(current)
    return increases


def counter_increase(expositions: Sequence[Exposition], name: str, keep: LabelFilter) -> float | None:
    increases = _increase_per_series(expositions, name, keep)
    return sum(increases.values()) if increases else None


def counter_increase_by(expositions: Sequence[Exposition], name: str, keep: LabelFilter,
                        label: str) -> dict[str, float] | None:
    increases = _increase_per_series(expositions, name, keep)
    if not increases:
        return None
    grouped: dict[str, float] = {}
    for key, value in increases.items():
        group = dict(key).get(label, "")
        grouped[group] = grouped.get(group, 0.0) + value
    return grouped


def histogram_increase(expositions: Sequence[Exposition], name: str, keep: LabelFilter,
                       ) -> HistogramCounts | None:
    by_bound = counter_increase_by(expositions, f"{name}_bucket", keep, "le")
    if not by_bound:
        return None
    buckets = tuple(sorted((float(bound), count) for bound, count in by_bound.items() if bound))
    return HistogramCounts(buckets=buckets, total_sum=counter_increase(expositions, f"{name}_sum", keep))


def _pool_free_fraction_min(expositions: Sequence[Exposition], keep: LabelFilter) -> float | None:
    fractions = []
    for exposition in expositions:
        pools: dict[SeriesKey, dict[str, float]] = {}
        for key, value in _series(exposition, catalog.POOL_PAGES.name, keep).items():
            labels = dict(key)
            state = labels.pop("state", "")
            pools.setdefault(tuple(sorted(labels.items())), {})[state] = value
        fractions += [states.get("free", 0.0) / sum(states.values())
                      for states in pools.values() if sum(states.values()) > 0]
    return min(fractions) if fractions else None


def _pool_pages_last(expositions: Sequence[Exposition], keep: LabelFilter) -> dict[str, float] | None:
    for exposition in reversed(expositions):
        pages: dict[str, float] = {}
        for key, value in _series(exposition, catalog.POOL_PAGES.name, keep).items():
            state = dict(key).get("state", "")
            pages[state] = pages.get(state, 0.0) + value
        if pages:
            return pages
    return None


def _build_infos(expositions: Sequence[Exposition], keep: LabelFilter) -> tuple[BuildInfo, ...]:
    # The newest exposition that has it: a restart inside the window may have changed the settings.
    for exposition in reversed(expositions):
        infos = {BuildInfo.from_labels(dict(key))
                 for key in _series(exposition, catalog.BUILD_INFO.name, keep)}
        if infos:
            return tuple(sorted(infos, key=repr))
    return ()


def _framebuffer_used_max(expositions: Sequence[Exposition], keep: LabelFilter) -> float | None:
    ratios = []
    for exposition in expositions:
        free = _series(exposition, catalog.DCGM_FB_FREE, keep)
        for key, used in _series(exposition, catalog.DCGM_FB_USED, keep).items():
            if key in free and used + free[key] > 0:
                ratios.append(used / (used + free[key]))
    return max(ratios) if ratios else None
