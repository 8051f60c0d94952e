"""Reduce two or more expositions (live scrapes or saved snapshots) to :class:`Observations`.

Counters become increases between consecutive expositions, reset-aware like Prometheus'
``increase()`` but exact (no extrapolation): a value that drops means the agent restarted, and the
new value is all increase. A series that first appears in a later exposition counts from 0 (labelled
counters appear on their first event). With a single exposition, counters are totals since the
agent started and the window says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from growpage import catalog
from growpage.diagnose.exposition import Exposition
from growpage.diagnose.observations import BuildInfo, GaugeStats, HistogramCounts, Observations, Scope, Window

LabelFilter = Callable[[Mapping[str, str]], bool]
SeriesKey = tuple[tuple[str, str], ...]


def dcgm_user_labels(labels: Mapping[str, str], mapping: Mapping[str, str]) -> dict[str, str]:
    """A DCGM sample's labels with the GPU's user in namespace/pod.

    ``mapping`` is target -> source label (catalog.DCGM_EXPORTED_LABELS by default): where the source
    label is set (the exporter scraped with honorLabels false, or relabeled), it names the pod that
    uses the GPU; where it is not, namespace/pod already do.
    """
    joined = dict(labels)
    for target, source_label in mapping.items():
        if labels.get(source_label):
            joined[target] = labels[source_label]
    return joined


def _relabeled(dcgm: Sequence[Exposition], mapping: Mapping[str, str]) -> list[Exposition]:
    return [dataclasses.replace(e, samples=tuple(
                dataclasses.replace(sample, labels=dcgm_user_labels(sample.labels, mapping)) for sample in e.samples))
            for e in dcgm]


def observations_from_expositions(
    agent: Sequence[Exposition], dcgm: Sequence[Exposition], source: Mapping[str, object],
    response_time_s: float | None = None, notes: tuple[str, ...] = (), sample_noun: str = "scrapes",
    dcgm_labels: Mapping[str, str] | None = None,
) -> Observations:
    """Observations over the span of ``agent`` expositions (sorted by time; at least one).

    Args:
        dcgm_labels: target -> source label naming the GPU's user in DCGM series (default
            catalog.DCGM_EXPORTED_LABELS).
    """
    agent = sorted(agent, key=lambda exposition: exposition.time_s)
    mapping = catalog.DCGM_EXPORTED_LABELS if dcgm_labels is None else dcgm_labels
    dcgm = _relabeled(sorted(dcgm, key=lambda exposition: exposition.time_s), mapping)
    assert agent, "callers check that at least one agent exposition exists"
    kind = "lifetime" if len(agent) == 1 else sample_noun
    window = Window(agent[0].time_s, agent[-1].time_s, kind, num_samples=len(agent))
    overall = build_scope("all", agent, dcgm, lambda labels: True, response_time_s=response_time_s)
    # Federated or hand-merged snapshots may carry the scrape's namespace label: break down by it.
    namespaces = sorted({sample.labels["namespace"] for exposition in agent for sample in exposition.samples
                         if sample.name.startswith("growpage_") and sample.labels.get("namespace")})
    def in_namespace(namespace: str) -> LabelFilter:
        return lambda labels: labels.get("namespace") == namespace

    breakdown = {
        namespace: build_scope(namespace, agent, dcgm, in_namespace(namespace))
        for namespace in namespaces
    }
    if overall.non_finite:
        notes = (*notes, f"NaN or Inf values read as unknown (no value), never as data: "
                         f"{', '.join(overall.non_finite)}")
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
        stranded_slots_max=_stranded_slots_max(agent, keep),
        inactive_components=_inactive_components(agent, keep),
        non_finite=_non_finite(agent, keep),
        pool_free_fraction_min=_pool_free_fraction_min(agent, keep),
        pool_pages_last=_pool_pages_last(agent, keep),
        lts_entropy=histogram_increase(agent, catalog.LTS_ENTROPY.name, keep),
        request_tokens=histogram_increase(agent, catalog.REQUEST_TOKENS.name, keep),
        requests_running_max=_gauge_max(agent, catalog.REQUESTS_RUNNING.name, keep),
        agent_errors=errors,
        build_infos=_build_infos(agent, keep),
        pooled_utilization=_pooled_utilization(agent, keep),
        vllm_ttft=histogram_increase(agent, catalog.VLLM_TTFT, keep),
        vllm_itl=histogram_increase(agent, catalog.VLLM_ITL, keep),
        vllm_preemptions=counter_increase(agent, catalog.VLLM_PREEMPTIONS, keep),
        tracked_steps=counter_increase(agent, catalog.VLLM_STEPS.name, keep),
        observed_steps=counter_increase(agent, catalog.VLLM_OBSERVED_STEPS.name, keep),
        own_seconds=counter_increase(agent, catalog.VLLM_OWN_SECONDS.name, keep),
        hooked_seconds=counter_increase(agent, catalog.VLLM_STEP_SECONDS.name, keep),
        forecast_counters=_present({spec.name: counter_increase(agent, spec.name, keep)
                                    for spec in catalog.FORECAST_METRICS if spec.type is catalog.MetricType.COUNTER}),
        vllm_kv_cache_usage_max=_gauge_max(agent, catalog.VLLM_KV_CACHE_USAGE, keep),
        vllm_queue_growth=_growth(agent, catalog.VLLM_REQUESTS_WAITING, keep),
        router_load_min_by_pod=_min_by_pod(agent, catalog.ROUTER_LOAD.name, keep),
        targets_total=_targets(agent, keep, down=False),
        targets_down=_targets(agent, keep, down=True),
        vllm_targets_up=_vllm_targets_up(agent, keep),
        gpu_framebuffer_used_max=_framebuffer_used_max(dcgm, keep),
        gpu_models=tuple(sorted({s.labels[catalog.DCGM_MODEL_NAME_LABEL] for e in dcgm for s in e.samples
                                 if s.name == catalog.DCGM_FB_USED and keep(s.labels)
                                 and s.labels.get(catalog.DCGM_MODEL_NAME_LABEL)})),
        response_time_s=response_time_s,
    )


def _series(exposition: Exposition, name: str, keep: LabelFilter) -> dict[SeriesKey, float]:
    # NaN and +-Inf are no data: "inf OOM events" or "fragmentation reached inf" would be read as
    # facts. They are dropped here, and _non_finite names the metrics that had only those.
    return {tuple(sorted(sample.labels.items())): sample.value for sample in exposition.samples
            if sample.name == name and keep(sample.labels) and math.isfinite(sample.value)}


def _non_finite(expositions: Sequence[Exposition], keep: LabelFilter) -> tuple[str, ...]:
    """GrowPage series names that carried NaN or +-Inf samples."""
    return tuple(sorted({sample.name for exposition in expositions for sample in exposition.samples
                         if sample.name.startswith("growpage_") and keep(sample.labels)
                         and not math.isfinite(sample.value)}))


def _stranded_slots_max(expositions: Sequence[Exposition], keep: LabelFilter) -> float | None:
    """Highest share of granted token slots without a live token, over the expositions.

    From the numerators (sum of live tokens over sum of granted slots); agents that predate them
    give 1 - utilization.
    """
    shares = []
    for exposition in expositions:
        live = sum(_series(exposition, catalog.LIVE_TOKENS.name, keep).values())
        granted = sum(_series(exposition, catalog.GRANTED_TOKEN_SLOTS.name, keep).values())
        if granted > 0:
            shares.append(1 - live / granted)
    if shares:
        return max(shares)
    utilization = gauge_stats(expositions, catalog.UTILIZATION.name, keep)
    return 1 - utilization.min if utilization is not None else None


def _pooled_utilization(expositions: Sequence[Exposition], keep: LabelFilter) -> GaugeStats | None:
    """Sum of live tokens over sum of granted slots, per exposition: what the utilization alerts read."""
    ratios = []
    for exposition in expositions:
        granted = sum(_series(exposition, catalog.GRANTED_TOKEN_SLOTS.name, keep).values())
        if granted > 0:
            ratios.append(sum(_series(exposition, catalog.LIVE_TOKENS.name, keep).values()) / granted)
    if not ratios:
        return None
    return GaugeStats(mean=sum(ratios) / len(ratios), min=min(ratios), max=max(ratios), last=ratios[-1])


def _growth(expositions: Sequence[Exposition], name: str, keep: LabelFilter) -> float | None:
    """A gauge's sum in the newest exposition that has it minus in the oldest (None with fewer than two)."""
    sums = [sum(values.values()) for values in (_series(e, name, keep) for e in expositions) if values]
    return sums[-1] - sums[0] if len(sums) >= 2 else None


def _targets(expositions: Sequence[Exposition], keep: LabelFilter, down: bool) -> int | None:
    """GrowPage scrape targets (``up{job=...}`` in a federated or replayed snapshot) in the newest
    exposition that has them; ``down`` counts those whose scrape failed while vLLM's target of the
    same pod answers."""
    for exposition in reversed(expositions):
        targets = {key: value for key, value in _series(exposition, "up", keep).items()
                   if dict(key).get("job") == catalog.SCRAPE_JOB}
        if targets:
            if not down:
                return len(targets)
            answering = {_pod(key) for key, value in _series(exposition, "up", keep).items()
                         if dict(key).get("job") == catalog.VLLM_SCRAPE_JOB and value >= 1}
            return sum(1 for key, value in targets.items() if value < 1 and _pod(key) in answering)
    return None


def _pod(key: SeriesKey) -> tuple[str | None, str | None]:
    labels = dict(key)
    return labels.get("namespace"), labels.get("pod")


def _vllm_targets_up(expositions: Sequence[Exposition], keep: LabelFilter) -> int | None:
    """vLLM's own targets that answer, in the newest exposition with any of their ``up`` series."""
    for exposition in reversed(expositions):
        targets = [value for key, value in _series(exposition, "up", keep).items()
                   if dict(key).get("job") == catalog.VLLM_SCRAPE_JOB]
        if targets:
            return sum(1 for value in targets if value >= 1)
    return None


def _inactive_components(expositions: Sequence[Exposition], keep: LabelFilter) -> dict[str, str] | None:
    """component -> reason for components not active in the newest exposition that reports any."""
    for exposition in reversed(expositions):
        states = _series(exposition, catalog.AGENT_ACTIVE.name, keep)
        if states:
            return {dict(key).get("component", ""): dict(key).get("reason", "")
                    for key, value in sorted(states.items()) if value < 1}
    return None


def gauge_stats(expositions: Sequence[Exposition], name: str, keep: LabelFilter) -> GaugeStats | None:
    """Mean of every sample, min, max, and the mean of the newest exposition that had the gauge."""
    per_exposition = [list(_series(e, name, keep).values()) for e in expositions]
    values = [value for values in per_exposition for value in values]
    if not values:
        return None
    newest = next(values for values in reversed(per_exposition) if values)
    return GaugeStats(mean=sum(values) / len(values), min=min(values), max=max(values),
                      last=sum(newest) / len(newest))


def _min_by_pod(expositions: Sequence[Exposition], name: str, keep: LabelFilter) -> dict[str, float] | None:
    """The lowest value of ``name`` in the window, per pod."""
    lowest: dict[str, float] = {}
    for exposition in expositions:
        for labels, value in _series(exposition, name, keep).items():
            pod = dict(labels).get("pod", "")
            lowest[pod] = min(value, lowest.get(pod, value))
    return lowest or None


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


def _present(values: Mapping[str, float | None]) -> dict[str, float] | None:
    """The values that are there, or None when none is."""
    found = {name: value for name, value in values.items() if value is not None}
    return found or None


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
