"""The mixin's configuration: what a deployment changes without touching the generators.

Like a monitoring mixin's ``config.libsonnet``: the cluster label multi-cluster Prometheus set-ups
add, the scrape job the rules select, and where runbooks live. Metric names, thresholds and
durations stay in :mod:`growpage.catalog`, the one source of truth the agent exports from; this
config holds only what differs between installations. ``gpctl alerts build`` and ``gpctl dashboards
build`` take it (``--cluster-label``, ``--runbook-url``), and the committed artefacts are built with
:data:`DEFAULT_CONFIG`.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog


@dataclasses.dataclass(frozen=True)
class MixinConfig:
    """Installation-specific settings of the generated rules and dashboards.

    Attributes:
        cluster_label: kept by every aggregation (SLOs included), so one Prometheus or Thanos
            serving several clusters keeps their error budgets apart; absent labels are harmless.
        growpage_job: the scrape job of ``/metrics/growpage`` (the agent-down and metrics-absent
            alerts select it; vLLM's own series are joined on the pod, whatever their job).
        runbook_url_pattern: ``{alert}`` is replaced by the alertname.
    """

    cluster_label: str = "cluster"
    growpage_job: str = catalog.SCRAPE_JOB
    runbook_url_pattern: str = catalog.RUNBOOK_BASE_URL + "/{alert}.md"

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
