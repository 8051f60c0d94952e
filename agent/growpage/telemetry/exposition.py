"""Rendering ``/metrics/growpage`` for a route the host already serves (FastAPI/Starlette).

The Prometheus text format by default; OpenMetrics (with exemplars) when the ``Accept`` header asks
for ``application/openmetrics-text``, as Prometheus does when it scrapes. The negotiation is
prometheus_client's (``choose_encoder``), so it stays what Prometheus expects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from growpage import catalog

if TYPE_CHECKING:  # starlette is the host's (engine extra), imported lazily below
    from starlette.requests import Request
    from starlette.responses import Response


class MetricsResponse(NamedTuple):
    """One rendered scrape; unpacks as ``body, content_type = agent.render(accept)``.

    Attributes:
        body: the exposition, UTF-8.
        content_type: the HTTP ``Content-Type`` that goes with it.
    """

    body: bytes
    content_type: str


def render_metrics(registry: Collector, accept_header: str | None = None) -> MetricsResponse:
    """Render ``registry`` in the format ``accept_header`` asks for (text 0.0.4 by default)."""
    encoder, content_type = choose_encoder(accept_header or "")
    return MetricsResponse(encoder(registry), content_type)


def starlette_endpoint(registry: Collector) -> Any:
    """A Starlette/FastAPI endpoint serving ``registry``.

    It is a plain (sync) function on purpose: Starlette runs it in its thread pool, so a scrape
    never blocks the event loop the engine may share.
    """
    # deferred: Starlette (the engine extra's) loads only when a route is served
    from starlette.responses import Response

    def metrics_endpoint(request: Request) -> Response:
        rendered = render_metrics(registry, request.headers.get("accept"))
        return Response(content=rendered.body, media_type=None,
                        headers={"Content-Type": rendered.content_type})

    return metrics_endpoint


def add_metrics_route(app: Any, registry: Collector, path: str = catalog.METRICS_PATH) -> None:
    """Serve ``registry`` at ``path`` on a FastAPI/Starlette ``app``, ahead of existing routes.

    NOTE: first, not appended: vLLM mounts its own registry at ``/metrics``, whose pattern also
    matches ``/metrics/growpage`` and would shadow a route added after it.
    """
    # deferred: Starlette (the engine extra's) loads only when a route is added
    from starlette.routing import Route

    app.router.routes.insert(0, Route(path, starlette_endpoint(registry), methods=["GET"]))
