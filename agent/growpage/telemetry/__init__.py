"""GrowPage telemetry: the metrics contract at ``/metrics/growpage`` and OpenTelemetry spans.

The only package that imports ``prometheus_client`` and ``opentelemetry`` (the ``telemetry``
extra). Layers, one way::

    state.py       MetricState: cumulative histograms folded from get-and-reset snapshots
    collector.py   GrowPageCollector: catalog.METRICS -> metric families (scraping never raises)
    agent.py       TelemetryAgent: the single make_stats() consumer; threading; build info
    exposition.py  render_metrics / add_metrics_route: text or OpenMetrics for a host route
    exporter.py    start_exporter: /metrics/growpage on its own port
    tracing.py     configure_tracing (OTEL_* env) and RequestTracer (a core StatsListener)

Typical use, on the engine's thread::

    agent = TelemetryAgent.from_env(manager, model="SmolLM2-135M-Instruct", engine="reference")
    agent.serve(port=9464)          # or add_metrics_route(app, agent.registry)
    ...                             # engine loop: after every step
    agent.on_step()

See ``docs/TELEMETRY.md``.
"""

from growpage.telemetry.agent import TelemetryAgent, build_info_labels
from growpage.telemetry.collector import GrowPageCollector
from growpage.telemetry.exporter import MetricsExporter, start_exporter
from growpage.telemetry.exposition import MetricsResponse, add_metrics_route, render_metrics
from growpage.telemetry.tracing import RequestTracer, configure_tracing, tracing_enabled

__all__ = [
    "GrowPageCollector", "MetricsExporter", "MetricsResponse", "RequestTracer", "TelemetryAgent",
    "add_metrics_route", "build_info_labels", "configure_tracing", "render_metrics", "start_exporter",
    "tracing_enabled",
]
