"""The mixin's configuration: what a deployment changes without touching the generators.

Like a monitoring mixin's ``config.libsonnet``: the cluster label multi-cluster Prometheus set-ups
add, the scrape job the rules select, label matchers added to every selector of GrowPage's and
vLLM's series, where runbooks live, and the thresholds every alert, panel, runbook line and ``gpctl
diagnose`` compare against. Metric names, durations and the thresholds' defaults stay in
:mod:`growpage.catalog`, the one source of truth the agent exports from. ``gpctl alerts build``,
``gpctl dashboards build`` and ``gpctl diagnose`` take it (``--mixin-config FILE``, see
:mod:`growpage.monitoring.mixin_file`), and the committed artefacts are built with
:data:`DEFAULT_CONFIG`.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from growpage import catalog
from growpage.monitoring.promql import add_matchers, is_matchers

# Every series name GrowPage's route serves, and vLLM's own that the rules and panels read.
GROWPAGE_SERIES = frozenset(name for spec in (*catalog.METRICS, *catalog.ROUTER_METRICS, *catalog.VLLM_HOME_METRICS)
                            for name in spec.series_names)
VLLM_SERIES = frozenset(catalog.VLLM_METRICS)
ROUTER_SERIES = frozenset(catalog.ROUTER_METRICS_SERIES)  # vLLM's router (vllm-router)


@dataclasses.dataclass(frozen=True)
class MixinConfig:
    """Installation-specific settings of the generated rules and dashboards.

    Attributes:
        cluster_label: kept by every aggregation (SLOs included), so one Prometheus or Thanos
            serving several clusters keeps their error budgets apart; absent labels are harmless.
        growpage_job: the scrape job of ``/metrics/growpage`` (the agent-down and metrics-absent
            alerts select it; vLLM's own series are joined on the pod, whatever their job).
        vllm_job: the scrape job of vLLM's own ``/metrics``: the agent-down alert pages only where
            that target answers (vLLM serves, GrowPage's route does not), so a pod still loading
            its model, where neither answers, pages nobody.
        router_job: the scrape job of vLLM's router (``vllm-router``, its ``--prometheus-port``): the
            router-down alert reads its ``up``.
        runbook_url_pattern: ``{alert}`` is replaced by the alertname.
        thresholds: every number the alerts, panels, runbooks and diagnose compare against.
        vllm_selector: label matchers (``namespace=~"llm-.*"``) added to every selector of vLLM's
            ``vllm:*`` series; empty adds none.
        growpage_selector: the same for GrowPage's ``growpage_*`` series.
        router_selector: the same for the router's ``vllm_router_*`` series.
        time_scale: every range, offset and ``for`` of the generated rules times this, in (0, 1]:
            a game day (``gpctl gameday``) runs the real rules in minutes at 1/60 (an hour-long
            window reads a minute). Rule names and alert texts keep the real durations. Leave it at
            1 in production.
    """

    cluster_label: str = "cluster"
    growpage_job: str = catalog.SCRAPE_JOB
    vllm_job: str = catalog.VLLM_SCRAPE_JOB
    router_job: str = catalog.ROUTER_SCRAPE_JOB
    runbook_url_pattern: str = catalog.RUNBOOK_BASE_URL + "/{alert}.md"
    thresholds: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS
    vllm_selector: str = ""
    growpage_selector: str = ""
    router_selector: str = ""
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.time_scale <= 1:
            raise ValueError(f"time_scale must be in (0, 1] (1 in production; 1/60 runs an hour in a minute); "
                             f"got {self.time_scale}")
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.cluster_label):
            raise ValueError(f"cluster_label must be a Prometheus label name, e.g. k8s_cluster; "
                             f"got {self.cluster_label!r}")
        if "{alert}" not in self.runbook_url_pattern:
            raise ValueError("runbook_url_pattern must contain {alert}, e.g. https://wiki.example.org/growpage/{alert}")
        for name in ("vllm_selector", "growpage_selector", "router_selector"):
            value = getattr(self, name)
            if value and not is_matchers(value):
                raise ValueError(f'{name} must be PromQL label matchers without braces, e.g. namespace=~"llm-.*", '
                                 f'job="vllm"; got {value!r}')

    @functools.cached_property
    def _matchers_by_series(self) -> dict[str, str]:
        scoped = {name: self.growpage_selector for name in GROWPAGE_SERIES if self.growpage_selector}
        scoped.update({name: self.vllm_selector for name in VLLM_SERIES if self.vllm_selector})
        scoped.update({name: self.router_selector for name in ROUTER_SERIES if self.router_selector})
        return scoped

    def scoped(self, expr: str) -> str:
        """``expr`` with :attr:`growpage_selector`, :attr:`vllm_selector` and :attr:`router_selector` in
        every selector of those series (unchanged when all are empty)."""
        return add_matchers(expr, self._matchers_by_series) if self._matchers_by_series else expr

    def runbook_url(self, alert: str) -> str:
        return self.runbook_url_pattern.format(alert=alert)

    @property
    def pod_labels(self) -> tuple[str, ...]:
        """What per-pod rules keep: the cluster, then catalog.POD_LABELS."""
        return (self.cluster_label, *catalog.POD_LABELS)

    @property
    def slo_labels(self) -> tuple[str, ...]:
        """What per-service (SLO) rules keep: the cluster, then catalog.SLO_LABELS."""
        return (self.cluster_label, *catalog.SLO_LABELS)

    @property
    def pod_join(self) -> tuple[str, ...]:
        """The labels GrowPage's and vLLM's series of one pod share (vLLM may name the model otherwise)."""
        return (self.cluster_label, "namespace", "pod")


DEFAULT_CONFIG = MixinConfig()
