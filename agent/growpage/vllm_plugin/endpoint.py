"""``vllm.endpoint_plugins``: ``/metrics/growpage`` on vLLM's OpenAI API server.

The series live in the scheduler's agent (EngineCore, see :mod:`~growpage.vllm_plugin.scheduler_agent`),
which serves them on its standalone exporter (``exporter_port``, loopback-reachable) from start-up. This route relays
that exporter's exposition, so the API port answers ``/metrics/growpage`` with GrowPage's series only.
It is inserted *first*: vLLM mounts its registry at ``/metrics`` and that mount's pattern also matches
``/metrics/growpage``. vLLM loads endpoint plugins only when named: ``VLLM_PLUGINS=growpage``.
``GET /get_load`` answers ``{"load": N}``, what vLLM's router (``power_of_two``) polls: N is
``growpage_router_load`` read from the same exporter (:mod:`~growpage.vllm_plugin.headroom`; the
formula and why: :mod:`growpage.core.headroom`). A 503 when the exporter cannot be read makes the
router fall back to its own count of requests in flight.
It also adds :class:`~growpage.vllm_plugin.namespaces.NamespaceMiddleware`, which maps the
``x-growpage-namespace`` header or the OpenAI ``user`` field to ``vllm_xargs.growpage_namespace``.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from growpage import catalog
from growpage.vllm_plugin.headroom import load_from_exposition

if TYPE_CHECKING:  # the API server's (vLLM depends on FastAPI), imported lazily below
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response
    from vllm.tasks import SupportedTask

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

PLUGIN_NAME = "growpage"
RELAY_TIMEOUT_S = 5.0


class GrowPageEndpoint:
    """The endpoint plugin object (the entry point is this class: a zero-argument factory)."""

    name = PLUGIN_NAME
    required_tasks: tuple[SupportedTask, ...] | None = None  # any server: the routes read the exporter only

    def __init__(self) -> None:
        self.upstream_url: str | None = None

    def attach_router(self, app: FastAPI) -> None:
        # deferred: Starlette loads when vLLM's API server attaches the routes, not when it finds the plugin
        from starlette.responses import Response
        from starlette.routing import Route

        def metrics(request: Request) -> Response:  # sync: Starlette runs it in its thread pool
            return self._relay(request.headers.get("accept"), Response)

        def load(request: Request) -> Response:
            return self.load_response(Response)

        app.router.routes.insert(0, Route(catalog.METRICS_PATH, metrics, methods=["GET"]))
        app.router.routes.insert(0, Route(catalog.LOAD_PATH, load, methods=["GET"]))
        # deferred: namespaces imports torch; this entry point stays torch-free until the server starts
        from growpage.vllm_plugin.namespaces import NamespaceMiddleware

        try:
            app.add_middleware(NamespaceMiddleware)  # x-growpage-namespace / user -> vllm_xargs
        except RuntimeError as error:  # the app already started: namespaces come from vllm_xargs only
            logger.warning("growpage: cannot add the namespace middleware (%s); use vllm_xargs.%s", error,
                           "growpage_namespace")

    async def init_state(self, engine_client: object, state: object, args: object) -> None:
        """Read GrowPage's settings from the server's arguments (``additional_config``, ``block_size``,
        read with ``getattr`` fallbacks); vLLM's engine client and app state are not used."""
        # deferred: resolve and settings import torch; this entry point stays torch-free until the server starts
        from growpage.vllm_plugin.resolve import resolve_settings
        from growpage.vllm_plugin.settings import ADDITIONAL_CONFIG_KEY

        additional = getattr(args, "additional_config", None) or {}
        if isinstance(additional, str):
            additional = json.loads(additional)
        # never raises: settings GrowPage cannot honour are reported (and logged) by the engine core
        resolved = resolve_settings(additional.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional, dict) else None,
                                    block_size=getattr(args, "block_size", None))
        config, settings = resolved.config, resolved.settings
        # deferred: namespaces and settings import torch (see init_state above)
        from growpage.vllm_plugin.namespaces import CURRENT_POLICY, ClientPolicy
        from growpage.vllm_plugin.settings import honours

        CURRENT_POLICY["policy"] = ClientPolicy(honour_mode=honours(settings.client_mode, config.mode),
                                                honour_namespace=honours(settings.client_namespaces, config.mode),
                                                header=settings.namespace_header)
        logger.info("growpage: client mode choices %s, client namespaces %s, trusted header %r",
                    "honoured" if CURRENT_POLICY["policy"].honour_mode else "ignored",
                    "honoured" if CURRENT_POLICY["policy"].honour_namespace else "ignored",
                    settings.namespace_header or None)
        if settings.exporter_enabled and settings.exporter_port > 0:
            self.upstream_url = f"http://127.0.0.1:{settings.exporter_port}{catalog.METRICS_PATH}"
        logger.info("growpage: /metrics/growpage relays %s (mode=%s)", self.upstream_url, config.mode.value)

    def load_response(self, response_class: type[Response]) -> Response:
        """``{"load": N}`` from the exporter's ``growpage_router_load``, or a 503 saying why not."""
        def unavailable(reason: str) -> Response:
            return response_class(json.dumps({"error": reason}), status_code=503, media_type="application/json")

        response = self._relay("text/plain", response_class)
        if response.status_code != 200:
            return unavailable(bytes(response.body).decode(errors="replace").strip())
        value = load_from_exposition(bytes(response.body).decode(errors="replace"))
        if value is None:
            return unavailable(f"{self.upstream_url} serves no {catalog.ROUTER_LOAD.name}; run the same GrowPage "
                               "version in the API server and in the engine core")
        return response_class(json.dumps({"load": value}), media_type="application/json")

    def _relay(self, accept: str | None, response_class: type[Response]) -> Response:
        if self.upstream_url is None:
            return response_class("GrowPage's exporter is disabled (exporter_port -1 or 0); set "
                                  "additional_config.growpage.exporter_port to a fixed port\n", status_code=503)
        request = urllib.request.Request(self.upstream_url, headers={"Accept": accept or "text/plain"})
        try:
            with urllib.request.urlopen(request, timeout=RELAY_TIMEOUT_S) as upstream:
                body = upstream.read()
                content_type = upstream.headers.get("Content-Type", "text/plain; version=0.0.4")
        except (urllib.error.URLError, OSError) as error:
            return response_class(f"GrowPage's exporter at {self.upstream_url} is not answering ({error}); "
                                  "it starts with vLLM's engine core\n", status_code=503)
        return response_class(content=body, headers={"Content-Type": content_type})
