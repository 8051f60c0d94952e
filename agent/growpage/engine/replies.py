"""Turning a submitted request's engine output into OpenAI's reply: one JSON body, or SSE chunks.

Whichever way the reply goes, the request never outlives its client: a watcher waits for the ASGI
``http.disconnect`` message (no polling, no token needed to notice it) and aborts the request,
which frees its pages; a reply that ends any other way than finished aborts it too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from growpage.asgi import Receive
from growpage.engine.async_engine import AsyncEngine, EngineFailure
from growpage.engine.engine import RequestOutput
from growpage.engine.protocol import error_body
from growpage.engine.server_settings import ServerCounters

logger = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it


class Disconnected:
    """Put on a request's queue when its client went away."""


DISCONNECTED = Disconnected()

QueueItem = RequestOutput | EngineFailure | Disconnected


@dataclasses.dataclass(frozen=True)
class ReplyHeader:
    """The fields every reply body and chunk of one request repeats."""

    response_id: str
    created: int
    model: str
    chat: bool

    @classmethod
    def new(cls, model: str, chat: bool) -> ReplyHeader:
        """A fresh id (``chatcmpl-``/``cmpl-`` as OpenAI's) stamped now."""
        kind = "chatcmpl" if chat else "cmpl"
        return cls(f"{kind}-{uuid.uuid4().hex[:24]}", int(time.time()), model, chat)

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def fields(self, object_name: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": object_name, "created": self.created, "model": self.model}


@dataclasses.dataclass(frozen=True)
class InFlight:
    """A submitted request as its reply sees it: the engine's queue and how to let go of it."""

    request_id: str
    queue: asyncio.Queue[QueueItem]
    async_engine: AsyncEngine
    counters: ServerCounters

    def abort(self) -> None:
        self.async_engine.abort(self.request_id)

    async def watch_disconnect(self, receive: Receive) -> None:
        """Wait for the client to go away, then abort the request and wake its reply.

        The body has been read already, so the next ASGI message is the disconnect (uvicorn sends
        it the moment the connection closes).
        """
        while (await receive()).get("type") != "http.disconnect":
            pass
        self.abort()
        self.counters.disconnects += 1
        logger.info("client of %s disconnected; request aborted", self.request_id)
        self.queue.put_nowait(DISCONNECTED)


def usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
            "total_tokens": prompt_tokens + output_tokens}


def failure_response(failure: EngineFailure) -> JSONResponse:
    return JSONResponse(error_body(failure.message, failure.code, error_type="server_error"),
                        status_code=failure.status)


async def whole_reply(flight: InFlight, receive: Receive, header: ReplyHeader,
                      prompt_tokens: int) -> Response | dict[str, Any]:
    """Wait for the request to finish and answer it in one body (or with its failure)."""
    text, output_tokens, finished = "", 0, False
    watcher = asyncio.create_task(flight.watch_disconnect(receive))
    try:
        while True:
            item = await flight.queue.get()
            if isinstance(item, Disconnected):
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            if isinstance(item, EngineFailure):
                finished = True  # the engine has let go of it already
                return failure_response(item)
            text += item.new_text
            output_tokens = item.num_output_tokens
            if item.finished:
                finished = True
                return completion_body(header, text, item.finish_reason, usage(prompt_tokens, output_tokens))
    finally:
        watcher.cancel()
        if not finished:  # cancelled (e.g. a forced shutdown) or disconnected: free its pages
            flight.abort()


def completion_body(header: ReplyHeader, text: str, finish_reason: str | None,
                    counts: dict[str, int]) -> dict[str, Any]:
    """A finished request's reply: ``chat.completion`` or ``text_completion``."""
    if header.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": finish_reason, "logprobs": None}
        return {**header.fields("chat.completion"), "choices": [choice], "usage": counts}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**header.fields("text_completion"), "choices": [choice], "usage": counts}


async def streamed_reply(flight: InFlight, receive: Receive, header: ReplyHeader,
                         include_usage: bool) -> AsyncIterator[str]:
    """The request's output as server-sent events, ending with ``[DONE]`` unless the client left."""
    finished = failed = False
    prompt_tokens = output_tokens = 0
    watcher = asyncio.create_task(flight.watch_disconnect(receive))
    try:
        if header.chat:
            yield chunk(header, {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        while not finished:
            item = await flight.queue.get()
            if isinstance(item, Disconnected):
                return
            if isinstance(item, EngineFailure):
                finished = failed = True  # the engine has let go of it already
                yield sse(error_body(item.message, item.code, error_type="server_error"))
                break
            finished = item.finished
            prompt_tokens, output_tokens = item.num_prompt_tokens, item.num_output_tokens
            if item.new_text or finished:
                yield chunk(header, delta_choice(header, item))
        if include_usage and finished and not failed:
            yield sse({**header.fields(header.chunk_object), "choices": [],
                       "usage": usage(prompt_tokens, output_tokens)})
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        if not finished:  # the client went away (or the stream was cancelled): free its pages
            flight.abort()


def delta_choice(header: ReplyHeader, item: RequestOutput) -> dict[str, Any]:
    """One step's new text as a streamed choice (a chat ``delta`` or a completion ``text``)."""
    if header.chat:
        delta = {"content": item.new_text} if item.new_text else {}
        return {"index": 0, "delta": delta, "finish_reason": item.finish_reason}
    return {"index": 0, "text": item.new_text, "logprobs": None, "finish_reason": item.finish_reason}


def chunk(header: ReplyHeader, choice: dict[str, Any]) -> str:
    return sse({**header.fields(header.chunk_object), "choices": [choice]})


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
