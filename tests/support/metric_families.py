"""What Prometheus and its client's parsers make of a catalog metric: its type and its family name."""

from __future__ import annotations

from typing import Any

from growpage import catalog

# The type a parser or Prometheus' metadata gives each catalog type (an info metric is a gauge of 1).
PROMETHEUS_TYPE = {catalog.MetricType.GAUGE: "gauge", catalog.MetricType.COUNTER: "counter",
                   catalog.MetricType.HISTOGRAM: "histogram", catalog.MetricType.INFO: "gauge"}


def family_name(spec: catalog.MetricSpec) -> str:
    """The name parsers and Prometheus' metadata key a family by (a counter without ``_total``)."""
    return spec.name.removesuffix("_total") if spec.type is catalog.MetricType.COUNTER else spec.name


def assert_metadata(prometheus: Any, spec: catalog.MetricSpec) -> None:
    """Prometheus recorded ``spec``'s type and help, from the OpenMetrics scrape."""
    family = family_name(spec)
    metadata = prometheus.metadata(family)
    assert {m["type"] for m in metadata} == {PROMETHEUS_TYPE[spec.type]}, (family, metadata)
    assert {m["help"] for m in metadata} == {spec.help}
