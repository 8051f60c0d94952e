"""``gpctl serve``: the OpenAI-compatible HTTP server of the reference engine (FastAPI + uvicorn).

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streaming and not), ``/v1/models``,
``/health``, and ``/metrics/growpage`` (GrowPage's series only). Bad input gets a 4xx in OpenAI's
error shape and the server keeps serving; any unexpected fault is a 500 in the same shape.

One request never hurts the others: tokenization runs off the event loop, bodies are bounded
(:mod:`growpage.engine.http_guard`), and a client that disconnects, streaming or not, is noticed at
once (the ASGI ``http.disconnect`` message, not polling): its request is aborted, which frees its
pages. The operator's :class:`~growpage.engine.server_settings.ServerSettings` decide who gets in
and which client-supplied routing (namespace, mode) is honoured; the server counts both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from growpage.chat import chat_token_ids
from growpage.engine.async_engine import AsyncEngine, EngineFailure, ShuttingDown
from growpage.engine.engine import RequestOutput
from growpage.engine.http_guard import GuardMiddleware
from growpage.engine.protocol import ChatBody, CompletionBody, check_text, error_body
from growpage.engine.sampling import InvalidRequest
from growpage.engine.server_settings import ServerCounters, ServerSettings

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
NAMESPACE_HEADER = "x-growpage-namespace"
MODE_HEADER = "x-growpage-mode"
MODES = ("off", "monitor", "enforce")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it


class _Disconnected:
    """Put on a request's queue when its client went away."""


DISCONNECTED = _Disconnected()

MetricsHandler = Callable[[str | None], tuple[bytes, str]]


def create_app(async_engine: AsyncEngine, metrics: MetricsHandler | None = None,
               settings: ServerSettings | None = None) -> FastAPI:
    """Build the app around a started (or to-be-started) ``AsyncEngine``.

    Args:
        metrics: ``accept_header -> (body, content_type)`` for ``/metrics/growpage``.
        settings: the operator's choices (default: :class:`ServerSettings` for the engine's mode).

    The app's ``state.counters`` is the :class:`ServerCounters` it keeps.
    """
    engine = async_engine.engine
    model_name = engine.config.model_name
    settings = settings or ServerSettings.for_mode(engine.growpage_config.mode)
    counters = ServerCounters()
    # No token spans more UTF-8 bytes than the vocabulary's longest entry (its mapped form is never
    # shorter than the bytes it stands for), so a text over context × that many bytes cannot fit:
    # refuse it without spending seconds of CPU tokenizing it.
    max_token_bytes = max((len(token.encode("utf-8", "replace")) for token in engine.tokenizer.get_vocab()),
                          default=0)
    max_text_bytes = engine.max_model_len * max_token_bytes if max_token_bytes else None

    def check_length(text: str) -> None:
        if max_text_bytes is not None and len(text) > max_text_bytes // 4 and len(text.encode()) > max_text_bytes:
            raise InvalidRequest(f"the prompt is {len(text.encode())} bytes, more than this model's context of "
                                 f"{engine.max_model_len} tokens can hold; shorten the prompt", param="prompt")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if not async_engine.healthy:
            async_engine.start()
        yield
        async_engine.stop()

    docs = {} if settings.api_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="GrowPage reference engine", lifespan=lifespan, **docs)
    app.state.counters = counters
    app.state.settings = settings
    app.add_middleware(GuardMiddleware, settings=settings, counters=counters)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        if first.get("type") == "json_invalid":
            message = "the request body is not valid JSON"
        else:
            message = f"{where}: {first.get('msg', 'invalid value')}"
        return JSONResponse(error_body(message, "invalid_request", where), status_code=400)

    @app.exception_handler(InvalidRequest)
    async def refused(_: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request", exc.param), status_code=400)

    @app.exception_handler(ShuttingDown)
    async def shutting_down(_: Request, exc: ShuttingDown) -> JSONResponse:
        counters.refuse("shutting_down")
        return JSONResponse(error_body(str(exc), "shutting_down", error_type="server_error"), status_code=503)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.error("unexpected fault while serving a request", exc_info=exc)
        return JSONResponse(error_body("the server failed on this request; see the server log", "internal_error",
                                       error_type="server_error"), status_code=500)

    def check_model(requested: str) -> JSONResponse | None:
        if requested != model_name:
            return JSONResponse(error_body(f"model {requested!r} does not exist; this server serves "
                                           f"{model_name!r} (see /v1/models)", "model_not_found", "model"),
                                status_code=404)
        return None

    def routing(http: Request, body) -> tuple[str | None, str | None]:
        """The request's namespace and mode, as far as the operator lets the client choose them."""
        namespace = None
        trusted = http.headers.get(settings.namespace_header) if settings.namespace_header else None
        client_namespace = body.namespace or body.user
        if trusted:
            namespace = trusted
            counters.header_namespaces += 1
        elif client_namespace:
            outcome = "honoured" if settings.client_namespaces else "ignored"
            counters.client_namespaces[outcome] += 1
            namespace = check_text(client_namespace, "namespace") if settings.client_namespaces else None
        mode = http.headers.get(MODE_HEADER) or body.growpage_mode
        if mode is not None and mode not in MODES:
            raise InvalidRequest(f"{MODE_HEADER} must be off, monitor or enforce, got {mode!r}", param="growpage_mode")
        if mode is not None:
            counters.mode_overrides["honoured" if settings.allow_mode_override else "ignored"] += 1
            if not settings.allow_mode_override:
                logger.info("ignored a request's growpage mode %r: this deployment does not allow overrides", mode)
                mode = None
        return namespace, mode

    @app.get("/health")
    async def health() -> JSONResponse:
        if async_engine.draining:  # tell the load balancer before the listener closes
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if async_engine.healthy:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "engine stopped"}, status_code=503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "growpage"}]}

    @app.get("/metrics/growpage")
    async def growpage_metrics(http: Request) -> Response:
        if metrics is None:
            return JSONResponse(error_body("telemetry is not enabled on this server", "unavailable"),
                                status_code=503)
        body, content_type = await asyncio.to_thread(metrics, http.headers.get("accept"))
        return Response(content=body, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, http: Request):
        if (missing := check_model(body.model)) is not None:
            return missing
        prompt = body.prompt_text_or_ids()
        if isinstance(prompt, list):
            prompt_ids = prompt
        else:  # off the event loop: a long prompt must not stall /health and the other requests
            check_length(prompt)
            prompt_ids = await asyncio.to_thread(engine.tokenizer.encode, prompt)
        if any(not isinstance(t, int) or t < 0 or t >= engine.model.config.vocab_size for t in prompt_ids):
            raise InvalidRequest("prompt token ids must be integers in the model's vocabulary", param="prompt")
        return await _serve(http, body, prompt_ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, http: Request):
        if (missing := check_model(body.model)) is not None:
            return missing
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        check_length("".join(m["content"] for m in messages))
        prompt_ids = await asyncio.to_thread(chat_token_ids, engine.tokenizer, messages)
        return await _serve(http, body, prompt_ids, chat=True)

    def sampling_params(body, num_prompt_tokens: int):
        """The body's sampling parameters, ``max_tokens`` checked against the context as vLLM does."""
        room = engine.max_model_len - num_prompt_tokens
        if room < 1:
            raise InvalidRequest(f"the prompt is {num_prompt_tokens} tokens; this model's context is "
                                 f"{engine.max_model_len} tokens: shorten the prompt", param="prompt")
        params = body.sampling_params(min(DEFAULT_MAX_TOKENS, room))
        if params.max_tokens > room:
            raise InvalidRequest(f"this model's maximum context length is {engine.max_model_len} tokens; you "
                                 f"requested {num_prompt_tokens + params.max_tokens} ({num_prompt_tokens} in the "
                                 f"prompt, {params.max_tokens} in the completion): lower max_tokens to at most "
                                 f"{room} or shorten the prompt", param="max_tokens")
        return params

    async def _serve(http: Request, body, prompt_ids: list[int], chat: bool):
        params = sampling_params(body, len(prompt_ids))
        namespace, mode = routing(http, body)
        request_id, queue = await async_engine.submit(prompt_ids, params, namespace=namespace, mode=mode)
        kind = "chatcmpl" if chat else "cmpl"
        response_id = f"{kind}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                _stream(http, queue, request_id, response_id, created, chat, body.include_usage),
                media_type="text/event-stream")
        text, finish_reason, prompt_tokens, output_tokens = "", None, len(prompt_ids), 0
        watcher = asyncio.create_task(_watch_disconnect(http, queue, request_id))
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is DISCONNECTED:
                    return Response(status_code=CLIENT_CLOSED_REQUEST)
                if isinstance(item, EngineFailure):
                    finished = True
                    return JSONResponse(error_body(item.message, item.code, error_type="server_error"),
                                        status_code=item.status)
                text += item.new_text
                output_tokens = item.num_output_tokens
                if item.finished:
                    finished = True
                    finish_reason = item.finish_reason
                    break
        finally:
            watcher.cancel()
            if not finished:  # cancelled (e.g. a forced shutdown) or disconnected: free its pages
                async_engine.abort(request_id)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
                 "total_tokens": prompt_tokens + output_tokens}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": finish_reason, "logprobs": None}
            return {"id": response_id, "object": "chat.completion", "created": created, "model": model_name,
                    "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {"id": response_id, "object": "text_completion", "created": created, "model": model_name,
                "choices": [choice], "usage": usage}

    async def _watch_disconnect(http: Request, queue: asyncio.Queue, request_id: str) -> None:
        """Wait for the client to go away, then abort its request and wake its handler.

        The body has been read already, so the next ASGI message is the disconnect (uvicorn sends
        it the moment the connection closes): no polling, no token needed to notice it.
        """
        while (await http.receive()).get("type") != "http.disconnect":
            pass
        async_engine.abort(request_id)
        counters.disconnects += 1
        logger.info("client of %s disconnected; request aborted", request_id)
        queue.put_nowait(DISCONNECTED)

    async def _stream(http: Request, queue: asyncio.Queue, request_id: str, response_id: str, created: int,
                      chat: bool, include_usage: bool) -> AsyncIterator[str]:
        object_name = "chat.completion.chunk" if chat else "text_completion"
        finished = failed = False
        prompt_tokens = output_tokens = 0
        watcher = asyncio.create_task(_watch_disconnect(http, queue, request_id))
        try:
            if chat:
                yield _sse(response_id, object_name, created, model_name,
                           {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
            while not finished:
                item: RequestOutput | EngineFailure | _Disconnected = await queue.get()
                if isinstance(item, _Disconnected):
                    return
                if isinstance(item, EngineFailure):
                    finished = failed = True  # the engine has let go of it already
                    yield f"data: {json.dumps(error_body(item.message, item.code, error_type='server_error'))}\n\n"
                    break
                finished = item.finished
                prompt_tokens, output_tokens = item.num_prompt_tokens, item.num_output_tokens
                if not item.new_text and not finished:
                    continue
                if chat:
                    delta = {"content": item.new_text} if item.new_text else {}
                    choice = {"index": 0, "delta": delta, "finish_reason": item.finish_reason}
                else:
                    choice = {"index": 0, "text": item.new_text, "logprobs": None,
                              "finish_reason": item.finish_reason}
                yield _sse(response_id, object_name, created, model_name, choice)
            if include_usage and finished and not failed:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
                         "total_tokens": prompt_tokens + output_tokens}
                yield f"data: {json.dumps({'id': response_id, 'object': object_name, 'created': created, 'model': model_name, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            if not finished:  # the client went away (or the stream was cancelled): free its pages
                async_engine.abort(request_id)

    return app


def _sse(response_id: str, object_name: str, created: int, model: str, choice: dict) -> str:
    payload = {"id": response_id, "object": object_name, "created": created, "model": model, "choices": [choice]}
    return f"data: {json.dumps(payload)}\n\n"
