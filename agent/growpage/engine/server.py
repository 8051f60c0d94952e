"""``gpctl serve``: the OpenAI-compatible HTTP server of the reference engine (FastAPI + uvicorn).

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streaming and not), ``/v1/models``,
``/health``, and ``/metrics/growpage`` (GrowPage's series only). Bad input gets a 4xx in OpenAI's
error shape and the server keeps serving; a client that disconnects mid-stream has its request
aborted, which frees its pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from growpage.engine.async_engine import AsyncEngine, EngineFailure
from growpage.engine.engine import RequestOutput
from growpage.engine.protocol import ChatBody, CompletionBody, error_body
from growpage.engine.sampling import InvalidRequest

DEFAULT_MAX_TOKENS = 256
NAMESPACE_HEADER = "x-growpage-namespace"
MODE_HEADER = "x-growpage-mode"

MetricsHandler = Callable[[str | None], tuple[bytes, str]]


def create_app(async_engine: AsyncEngine, metrics: MetricsHandler | None = None) -> FastAPI:
    """Build the app around a started (or to-be-started) ``AsyncEngine``.

    Args:
        metrics: ``accept_header -> (body, content_type)`` for ``/metrics/growpage``.
    """
    engine = async_engine.engine
    model_name = engine.config.model_name

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if not async_engine.healthy:
            async_engine.start()
        yield
        async_engine.stop()

    app = FastAPI(title="GrowPage reference engine", lifespan=lifespan)

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
        return JSONResponse(error_body(str(exc), "invalid_request"), status_code=400)

    def check_model(requested: str) -> JSONResponse | None:
        if requested != model_name:
            return JSONResponse(error_body(f"model {requested!r} does not exist; this server serves "
                                           f"{model_name!r} (see /v1/models)", "model_not_found", "model"),
                                status_code=404)
        return None

    def routing(http: Request, body) -> tuple[str | None, str | None]:
        namespace = http.headers.get(NAMESPACE_HEADER) or body.namespace or body.user
        mode = http.headers.get(MODE_HEADER) or body.growpage_mode
        return namespace, mode

    @app.get("/health")
    async def health() -> JSONResponse:
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
        prompt_ids = prompt if isinstance(prompt, list) else engine.tokenizer.encode(prompt)
        if any(not isinstance(t, int) or t < 0 or t >= engine.model.config.vocab_size for t in prompt_ids):
            raise InvalidRequest("prompt token ids must be integers in the model's vocabulary")
        return await _serve(http, body, prompt_ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, http: Request):
        if (missing := check_model(body.model)) is not None:
            return missing
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        prompt_ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(prompt_ids, "input_ids"):  # newer tokenizers return a BatchEncoding
            prompt_ids = prompt_ids["input_ids"]
        return await _serve(http, body, list(prompt_ids), chat=True)

    async def _serve(http: Request, body, prompt_ids: list[int], chat: bool):
        params = body.sampling_params(DEFAULT_MAX_TOKENS)
        namespace, mode = routing(http, body)
        if mode is not None and mode not in ("off", "monitor", "enforce"):
            raise InvalidRequest(f"{MODE_HEADER} must be off, monitor or enforce, got {mode!r}")
        request_id, queue = await async_engine.submit(prompt_ids, params, namespace=namespace, mode=mode)
        kind = "chatcmpl" if chat else "cmpl"
        response_id = f"{kind}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                _stream(http, queue, request_id, response_id, created, chat, body.include_usage),
                media_type="text/event-stream")
        text, finish_reason, prompt_tokens, output_tokens = "", None, len(prompt_ids), 0
        try:
            while True:
                item = await _next_item(http, queue, request_id)
                if isinstance(item, EngineFailure):
                    return JSONResponse(error_body(item.message, "engine_error", error_type="server_error"),
                                        status_code=500)
                text += item.new_text
                output_tokens = item.num_output_tokens
                if item.finished:
                    finish_reason = item.finish_reason
                    break
        except asyncio.CancelledError:
            async_engine.abort(request_id)
            raise
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

    async def _next_item(http: Request, queue: asyncio.Queue, request_id: str):
        """The next output; aborts the request if the client went away while we waited."""
        while True:
            try:
                return await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:
                if await http.is_disconnected():
                    async_engine.abort(request_id)
                    raise asyncio.CancelledError from None

    async def _stream(http: Request, queue: asyncio.Queue, request_id: str, response_id: str, created: int,
                      chat: bool, include_usage: bool) -> AsyncIterator[str]:
        object_name = "chat.completion.chunk" if chat else "text_completion"
        finished = False
        prompt_tokens = output_tokens = 0
        try:
            if chat:
                yield _sse(response_id, object_name, created, model_name,
                           {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
            while not finished:
                item: RequestOutput | EngineFailure = await _next_item(http, queue, request_id)
                if isinstance(item, EngineFailure):
                    yield f"data: {json.dumps(error_body(item.message, 'engine_error', error_type='server_error'))}\n\n"
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
            if include_usage and finished:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
                         "total_tokens": prompt_tokens + output_tokens}
                yield f"data: {json.dumps({'id': response_id, 'object': object_name, 'created': created, 'model': model_name, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (or the stream was cancelled): free its pages
                async_engine.abort(request_id)

    return app


def _sse(response_id: str, object_name: str, created: int, model: str, choice: dict) -> str:
    payload = {"id": response_id, "object": object_name, "created": created, "model": model, "choices": [choice]}
    return f"data: {json.dumps(payload)}\n\n"
