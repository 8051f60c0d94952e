"""A request's namespace over HTTP: a gateway header or the OpenAI ``user`` field.

vLLM hands the engine only ``vllm_xargs`` (as ``SamplingParams.extra_args``), so the API server's
endpoint plugin adds :class:`NamespaceMiddleware`: for a JSON ``POST`` to a generation route it
writes the namespace into ``vllm_xargs.growpage_namespace``, where the scheduler and worker read it.
Precedence: the ``x-growpage-namespace`` header (set by a trusted gateway), then a
``growpage_namespace`` the client put in ``vllm_xargs``, then the OpenAI ``user`` field. The
middleware is plain ASGI (no framework import) and leaves any other request byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from growpage.vllm_plugin.settings import NAMESPACE_ARG

NAMESPACE_HEADER = "x-growpage-namespace"
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")
MAX_NAMESPACE_CHARS = 128


def namespace_body(body: bytes, header_namespace: str | None) -> bytes | None:
    """The request body with ``vllm_xargs.growpage_namespace`` set, or None to pass it unchanged.

    Args:
        body: the JSON request body.
        header_namespace: the ``x-growpage-namespace`` header's value, if any.
    """
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # not ours to judge: vLLM answers the malformed request
    if not isinstance(payload, dict):
        return None
    xargs = payload.get("vllm_xargs")
    if xargs is not None and not isinstance(xargs, dict):
        return None
    xargs = dict(xargs or {})
    if header_namespace:
        namespace = header_namespace
    elif xargs.get(NAMESPACE_ARG):
        return None
    elif isinstance(payload.get("user"), str) and payload["user"]:
        namespace = payload["user"]
    else:
        return None
    xargs[NAMESPACE_ARG] = namespace[:MAX_NAMESPACE_CHARS]
    payload["vllm_xargs"] = xargs
    return json.dumps(payload).encode()


def _header(headers: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    wanted = name.encode()
    for key, value in headers:
        if key.lower() == wanted:
            return value.decode("latin-1").strip() or None
    return None


class NamespaceMiddleware:
    """ASGI middleware: see the module docstring. Faults leave the request as it came."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if (scope.get("type") != "http" or scope.get("method") != "POST"
                or scope.get("path", "").rstrip("/") not in GENERATION_PATHS):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        message: dict[str, Any] = {}
        while more:
            message = await receive()
            if message.get("type") != "http.request":
                break  # a disconnect: let the app see it
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            rewritten = namespace_body(body, _header(scope.get("headers", ()), NAMESPACE_HEADER))
        except Exception:
            rewritten = None
        if rewritten is not None:
            body = rewritten
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", ())
                                         if k.lower() != b"content-length"]
                         + [(b"content-length", str(len(body)).encode())])
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                if message.get("type") not in (None, "http.request"):
                    return message
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
