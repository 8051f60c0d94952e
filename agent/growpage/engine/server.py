"""``gpctl serve``: the OpenAI-compatible HTTP server of the reference engine (FastAPI + uvicorn).

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streaming and not), ``/v1/models``,
``/health``, and ``/metrics/growpage`` (GrowPage's series only). Bad input gets a 4xx in OpenAI's
error shape and the server keeps serving; any unexpected fault is a 500 in the same shape.

One request never hurts the others: tokenization runs off the event loop, bodies are bounded
(:mod:`growpage.engine.http_guard`), and a client that disconnects, streaming or not, is noticed at
once (:mod:`growpage.engine.replies`): its request is aborted, which frees its pages. The
operator's :class:`~growpage.engine.server_settings.ServerSettings` decide who gets in and which
client-supplied routing (namespace, mode) is honoured (:mod:`growpage.engine.request_checks`); the
server counts both.

The handlers are module-level functions that read what they share from ``app.state.server`` (a
:class:`ServerState`), so each one can be read and tested on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from growpage.chat import chat_token_ids
from growpage.engine.async_engine import AsyncEngine, ShuttingDown
from growpage.engine.engine import LLMEngine
from growpage.engine.http_guard import GuardMiddleware
from growpage.engine.protocol import ChatBody, CompletionBody, error_body
from growpage.engine.replies import InFlight, ReplyHeader, streamed_reply, whole_reply
from growpage.engine.request_checks import (
    GenerationBody,
    check_length,
    check_token_ids,
    max_text_bytes,
    routing,
    sampling_params,
)
from growpage.engine.sampling import InvalidRequest
from growpage.engine.server_settings import ServerCounters, ServerSettings

logger = logging.getLogger(__name__)

MetricsHandler = Callable[[str | None], tuple[bytes, str]]

router = APIRouter()


@dataclasses.dataclass(frozen=True)
class ServerState:
    """What every handler shares, kept on ``app.state.server``.

    Attributes:
        async_engine: the engine the requests go to.
        settings: the operator's choices.
        counters: what the server counted (also ``app.state.counters``).
        metrics: ``accept_header -> (body, content_type)`` for ``/metrics/growpage``, or None.
        max_text_bytes: texts longer than this cannot fit the context (see
            :func:`~growpage.engine.request_checks.max_text_bytes`).
    """

    async_engine: AsyncEngine
    settings: ServerSettings
    counters: ServerCounters
    metrics: MetricsHandler | None
    max_text_bytes: int | None

    @property
    def engine(self) -> LLMEngine:
        return self.async_engine.engine

    @property
    def model_name(self) -> str:
        return self.engine.config.model_name


def create_app(async_engine: AsyncEngine, metrics: MetricsHandler | None = None,
               settings: ServerSettings | None = None) -> FastAPI:
    """Build the app around a started (or to-be-started) ``AsyncEngine``.

    Args:
        metrics: ``accept_header -> (body, content_type)`` for ``/metrics/growpage``.
        settings: the operator's choices (default: :class:`ServerSettings` for the engine's mode).

    The app's ``state.counters`` is the :class:`ServerCounters` it keeps.
    """
    engine = async_engine.engine
    settings = settings or ServerSettings.for_mode(engine.growpage_config.mode)
    counters = ServerCounters()
    docs: dict[str, Any] = {} if settings.api_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="GrowPage reference engine", lifespan=_lifespan, **docs)
    app.state.server = ServerState(async_engine, settings, counters, metrics,
                                   max_text_bytes(engine.tokenizer.get_vocab(), engine.max_model_len))
    app.state.counters = counters
    app.state.settings = settings
    app.add_middleware(GuardMiddleware, settings=settings, counters=counters)
    app.exception_handler(RequestValidationError)(invalid_body)
    app.exception_handler(InvalidRequest)(refused)
    app.exception_handler(ShuttingDown)(shutting_down)
    app.exception_handler(Exception)(unexpected)
    app.include_router(router)
    return app


def state_of(app: Any) -> ServerState:
    """The :class:`ServerState` :func:`create_app` put on ``app``."""
    state: ServerState = app.state.server
    return state


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engine thread with the server (unless it runs already) and stop it after."""
    async_engine = state_of(app).async_engine
    if not async_engine.healthy:
        async_engine.start()
    yield
    async_engine.stop()


# ---- errors: every refusal in OpenAI's shape ---------------------------------------------------------
async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
    """400 naming the first field pydantic refused (or saying the body is not JSON)."""
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    if first.get("type") == "json_invalid":
        message = "the request body is not valid JSON"
    else:
        message = f"{where}: {first.get('msg', 'invalid value')}"
    return JSONResponse(error_body(message, "invalid_request", where), status_code=400)


async def refused(_: Request, exc: InvalidRequest) -> JSONResponse:
    return JSONResponse(error_body(str(exc), "invalid_request", exc.param), status_code=400)


async def shutting_down(http: Request, exc: ShuttingDown) -> JSONResponse:
    state_of(http.app).counters.refuse("shutting_down")
    return JSONResponse(error_body(str(exc), "shutting_down", error_type="server_error"), status_code=503)


async def unexpected(_: Request, exc: Exception) -> JSONResponse:
    """500 without details: the client gets no internals, the server log gets the traceback."""
    logger.error("unexpected fault while serving a request", exc_info=exc)
    return JSONResponse(error_body("the server failed on this request; see the server log", "internal_error",
                                   error_type="server_error"), status_code=500)


def unknown_model(requested: str, served: str) -> JSONResponse | None:
    """404 for a model this server does not serve, else None."""
    if requested == served:
        return None
    return JSONResponse(error_body(f"model {requested!r} does not exist; this server serves "
                                   f"{served!r} (see /v1/models)", "model_not_found", "model"), status_code=404)


# ---- routes ----------------------------------------------------------------------------------------
@router.get("/health")
async def health(http: Request) -> JSONResponse:
    async_engine = state_of(http.app).async_engine
    if async_engine.draining:  # tell the load balancer before the listener closes
        return JSONResponse({"status": "shutting down"}, status_code=503)
    if async_engine.healthy:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "engine stopped"}, status_code=503)


@router.get("/v1/models")
async def models(http: Request) -> dict:
    return {"object": "list", "data": [{"id": state_of(http.app).model_name, "object": "model", "created": 0,
                                        "owned_by": "growpage"}]}


@router.get("/metrics/growpage")
async def growpage_metrics(http: Request) -> Response:
    metrics = state_of(http.app).metrics
    if metrics is None:
        return JSONResponse(error_body("telemetry is not enabled on this server", "unavailable"), status_code=503)
    body, content_type = await asyncio.to_thread(metrics, http.headers.get("accept"))
    return Response(content=body, media_type=content_type)


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionBody, http: Request) -> Response | dict[str, Any]:
    state = state_of(http.app)
    if (missing := unknown_model(body.model, state.model_name)) is not None:
        return missing
    prompt = body.prompt_text_or_ids()
    if isinstance(prompt, list):
        prompt_ids = prompt
    else:  # off the event loop: a long prompt must not stall /health and the other requests
        check_length(prompt, state.max_text_bytes, state.engine.max_model_len)
        prompt_ids = await asyncio.to_thread(state.engine.tokenizer.encode, prompt)
    check_token_ids(prompt_ids, state.engine.model.config.vocab_size)
    return await serve(http, state, body, prompt_ids, chat=False)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatBody, http: Request) -> Response | dict[str, Any]:
    state = state_of(http.app)
    if (missing := unknown_model(body.model, state.model_name)) is not None:
        return missing
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    check_length("".join(m["content"] for m in messages), state.max_text_bytes, state.engine.max_model_len)
    prompt_ids = await asyncio.to_thread(chat_token_ids, state.engine.tokenizer, messages)
    return await serve(http, state, body, prompt_ids, chat=True)


async def serve(http: Request, state: ServerState, body: GenerationBody, prompt_ids: list[int],
                chat: bool) -> Response | dict[str, Any]:
    """Submit the checked request and reply, streamed or in one body."""
    params = sampling_params(body, len(prompt_ids), state.engine.max_model_len)
    namespace, mode = routing(http.headers, body, state.settings, state.counters)
    request_id, queue = await state.async_engine.submit(prompt_ids, params, namespace=namespace, mode=mode)
    flight = InFlight(request_id, queue, state.async_engine, state.counters)
    header = ReplyHeader.new(state.model_name, chat)
    if body.stream:
        return StreamingResponse(streamed_reply(flight, http.receive, header, body.include_usage),
                                 media_type="text/event-stream")
    return await whole_reply(flight, http.receive, header, len(prompt_ids))
