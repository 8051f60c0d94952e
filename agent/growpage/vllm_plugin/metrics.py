"""Series only the vLLM home has, beside the catalog's (scraping never raises).

``growpage_vllm_decisions_degraded_total``: decisions vLLM could not enforce as decided.

The contract's ``quantize`` (and ``defer``) cannot be applied per request in vLLM: ``kv_cache_dtype``
is deployment-wide and the scheduler has no "wait for budget" state. The scheduler-side enforcer
applies ``evict`` or ``allocate`` instead (see :mod:`~growpage.vllm_plugin.scheduler_requests`);
``growpage_decisions_total`` counts what was *enforced*, this counter counts each degradation as
``{decided, enforced}``. Only the vLLM home serves these; their names and help texts are the
catalog's (``catalog.VLLM_HOME_METRICS``), so rules, dashboards and docs read them like every other
series. Scraping them never raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from growpage import catalog
from growpage.core.stats import StatsRecorder

if TYPE_CHECKING:  # for annotations only
    from prometheus_client.metrics_core import Metric


class ObservedWorkTotals(Protocol):
    """The agent's totals of the work the workers saw (``scheduler_agent.ObservedWork``)."""

    @property
    def steps(self) -> int: ...

    @property
    def steps_observed(self) -> int: ...

    @property
    def steps_with_room(self) -> int: ...

    @property
    def steps_compression_idle(self) -> int: ...

    @property
    def requests(self) -> int: ...

    @property
    def requests_observed(self) -> int: ...

    def own_seconds(self) -> dict[str, float]: ...

    def step_seconds(self) -> dict[str, float]: ...


class AgentCounts(Protocol):
    """The scheduler agent as these collectors read it (a Protocol, not the class: the agent
    imports this module)."""

    @property
    def degraded_total(self) -> dict[tuple[str, str], int]: ...

    @property
    def observed(self) -> ObservedWorkTotals: ...

    @property
    def stats(self) -> StatsRecorder: ...


def _family(spec: catalog.MetricSpec) -> str:
    """The counter family's name as prometheus_client takes it (it appends ``_total``)."""
    return spec.name.removesuffix("_total")


# The names and help texts are the catalog's (catalog.VLLM_HOME_METRICS), like every other series.
DEGRADED_METRIC = _family(catalog.VLLM_DEGRADED_DECISIONS)
STEPS_METRIC = _family(catalog.VLLM_STEPS)
OBSERVED_STEPS_METRIC = _family(catalog.VLLM_OBSERVED_STEPS)
REQUESTS_METRIC = _family(catalog.VLLM_TRACKED_REQUESTS)
OBSERVED_REQUESTS_METRIC = _family(catalog.VLLM_OBSERVED_REQUESTS)


class DegradedDecisionsCollector:
    """A ``prometheus_client`` collector over ``observer.degraded_total`` (``{(decided, enforced): n}``)."""

    def __init__(self, agent: AgentCounts, model: str):
        self._agent = agent
        self._model = model

    def collect(self) -> Iterator[Metric]:
        # deferred: prometheus_client (and its exposition server) load with the exporter, not with this module
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(DEGRADED_METRIC, catalog.VLLM_DEGRADED_DECISIONS.help,
                                     labels=(catalog.MODEL_LABEL, *catalog.VLLM_DEGRADED_DECISIONS.labels))
        try:
            for (decided, enforced), count in sorted(dict(self._agent.degraded_total).items()):
                family.add_metric((self._model, decided, enforced), float(count))
        except Exception:  # a scrape never raises
            self._agent.stats.record_error("plugin")
        yield family


class ObservationCollector:
    """How much of the work the observer saw: ``growpage_vllm_steps_total`` (engine steps with a
    request GrowPage tracks) and ``growpage_vllm_observed_steps_total`` (those whose attention was
    observed); ``growpage_vllm_tracked_requests_total`` (finished requests GrowPage tracked) and
    ``growpage_vllm_observed_requests_total`` (those observed at least once); and
    ``growpage_vllm_room_for_all_steps_total`` (steps enforce left the cache alone because the pool
    held every request at its full length) and ``growpage_vllm_compression_idle_steps_total`` (steps
    its compression gate left decode-time compression idle). The ratios are the
    shares of steps and of requests observed: below 1 under full CUDA graphs (decode steps replay
    without Python; a request decoded entirely in replayed steps is never observed) or with
    ``observe_every_steps`` > 1. And what the observing costs: ``growpage_vllm_own_seconds_total``
    against ``growpage_vllm_step_seconds_total``, by side."""

    def __init__(self, agent: AgentCounts, model: str):
        self._agent = agent
        self._model = model

    def collect(self) -> Iterator[Metric]:
        # deferred: prometheus_client (and its exposition server) load with the exporter, not with this module
        from prometheus_client.core import CounterMetricFamily

        steps, observed, roomy, idle, requests, observed_requests = (
            CounterMetricFamily(_family(spec), spec.help, labels=(catalog.MODEL_LABEL,))
            for spec in (catalog.VLLM_STEPS, catalog.VLLM_OBSERVED_STEPS, catalog.VLLM_ROOM_STEPS,
                         catalog.VLLM_IDLE_STEPS, catalog.VLLM_TRACKED_REQUESTS, catalog.VLLM_OBSERVED_REQUESTS))
        own, step = (CounterMetricFamily(_family(spec), spec.help, labels=(catalog.MODEL_LABEL, *spec.labels))
                     for spec in (catalog.VLLM_OWN_SECONDS, catalog.VLLM_STEP_SECONDS))
        try:
            work = self._agent.observed
            steps.add_metric((self._model,), float(work.steps))
            observed.add_metric((self._model,), float(work.steps_observed))
            roomy.add_metric((self._model,), float(work.steps_with_room))
            idle.add_metric((self._model,), float(work.steps_compression_idle))
            requests.add_metric((self._model,), float(work.requests))
            observed_requests.add_metric((self._model,), float(work.requests_observed))
            for family, seconds in ((own, work.own_seconds()), (step, work.step_seconds())):
                for side, value in sorted(seconds.items()):
                    family.add_metric((self._model, side), value)
        except Exception:  # a scrape never raises
            self._agent.stats.record_error("plugin")
        yield from (steps, observed, roomy, idle, requests, observed_requests, own, step)


class StartupCollector:
    """What the engine core serves before its scheduler agent exists (while vLLM loads the model):
    ``growpage_build_info`` and ``growpage_agent_active`` with each component's start-up reason
    (``starting``, or one already final such as ``mode_off``), from the catalog's families.

    Args:
        build_info: ``growpage_build_info``'s label values by label (catalog order).
        model: the ``model_name`` label.
        component_states: ``{component: reason}``.
    """

    def __init__(self, build_info: dict[str, str], model: str, component_states: dict[str, str]):
        self._build_info = build_info
        self._model = model
        self._states = dict(component_states)

    def collect(self) -> Iterator[Metric]:
        # deferred: growpage.telemetry loads OpenTelemetry and prometheus_client; only a scrape needs it
        from growpage.telemetry.collector import empty_family, label_slug

        # Any: both are gauges, but empty_family's union includes histograms, whose add_metric differs
        info: Any = empty_family(catalog.BUILD_INFO)
        info.add_metric([self._model, *(self._build_info[label] for label in catalog.BUILD_INFO.labels)], 1.0)
        active: Any = empty_family(catalog.AGENT_ACTIVE)
        for component, reason in sorted(self._states.items()):
            value = 1.0 if reason == catalog.AGENT_ACTIVE_REASON else 0.0
            active.add_metric([self._model, label_slug(component), label_slug(reason)], value)
        yield from (info, active)
