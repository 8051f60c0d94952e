"""The server's front door, as plain ASGI: the API key and the request-body limit.

It runs before any parsing, so an unauthenticated or oversized request costs no JSON decoding, no
tokenization and no engine time. The key is compared in constant time (both sides hashed first, so
the comparison does not leak its length either).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable

from growpage.asgi import body_message, replay_first
from growpage.engine.protocol import error_body
from growpage.engine.server_settings import ServerCounters, ServerSettings

BODY_METHODS = {"POST", "PUT", "PATCH"}


def key_matches(given: str | None, expected: str) -> bool:
    """Whether ``given`` (the Authorization header's value) carries ``expected``, in constant time."""
    token = ""
    if given is not None:
        scheme, _, rest = given.strip().partition(" ")
        token = rest.strip() if scheme.lower() == "bearer" else ""
    return hmac.compare_digest(hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest(),
                               hashlib.sha256(expected.encode("utf-8")).digest())


class GuardMiddleware:
    """ASGI middleware: 401 without the API key (except public paths), 413 over the body limit."""

    def __init__(self, app: Callable[..., Awaitable[None]], settings: ServerSettings, counters: ServerCounters):
        self.app = app
        self.settings = settings
        self.counters = counters
        self.public_paths = settings.public_paths()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.lower(): value for key, value in scope.get("headers", ())}
        key = self.settings.api_key
        if key is not None and scope.get("path", "").rstrip("/") not in self.public_paths:
            given = headers.get(b"authorization")
            if not key_matches(given.decode("latin-1") if given is not None else None, key):
                self.counters.refuse("unauthorized")
                await _answer(send, 401, error_body("missing or wrong API key; send 'Authorization: Bearer KEY'",
                                                    "invalid_api_key"), [(b"www-authenticate", b"Bearer")])
                return
        if scope.get("method") not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.settings.max_request_bytes
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > limit:
            await self._too_large(send, limit)
            return
        # Read the body here (bounded), so a chunked upload without a length is held to the limit too.
        chunks, size = [], 0
        first_other: dict | None = None
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                first_other = message  # the client left mid-upload: let the app see it
                break
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await self._too_large(send, limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        first = first_other if first_other is not None else body_message(b"".join(chunks))
        await self.app(scope, replay_first(first, receive), send)

    async def _too_large(self, send: Callable, limit: int) -> None:
        self.counters.refuse("too_large")
        await _answer(send, 413, error_body(f"the request body is larger than this server's limit of {limit} "
                                            "bytes; send a shorter prompt", "request_too_large"))


async def _answer(send: Callable, status: int, payload: dict, extra_headers: list | None = None) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), *(extra_headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
