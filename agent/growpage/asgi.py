"""Plain-ASGI helpers for GrowPage's middlewares (no web framework imported).

A middleware that reads the request body before the app (to bound it, or to rewrite it) has used
up the messages the app expects from ``receive``; :func:`replay_first` hands the app what it read,
as one message, and then the connection's own ``receive`` again (so a later ``http.disconnect``
still reaches the app).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]  # as ASGI servers and Starlette type it
Receive = Callable[[], Awaitable[Message]]


def body_message(body: bytes) -> Message:
    """The whole request body as one final ``http.request`` message."""
    return {"type": "http.request", "body": body, "more_body": False}


def replay_first(first: Message, receive: Receive) -> Receive:
    """A ``receive`` that returns ``first`` once, then defers to ``receive``.

    Args:
        first: what the middleware consumed: :func:`body_message` of the body it read, or the
            message that interrupted the read (a disconnect), which the app must see.
        receive: the connection's own ``receive``.
    """
    pending = [first]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
