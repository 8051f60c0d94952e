"""A request's namespace over HTTP: a gateway header or the OpenAI ``user`` field.

vLLM hands the engine only ``vllm_xargs`` (as ``SamplingParams.extra_args``), so the API server's
endpoint plugin adds :class:`NamespaceMiddleware`: for a JSON ``POST`` to a generation route it
writes the namespace into ``vllm_xargs.growpage_namespace``, where the scheduler and worker read it.
Precedence: the ``x-growpage-namespace`` header (set by a trusted gateway), then a
``growpage_namespace`` the client put in ``vllm_xargs``, then the OpenAI ``user`` field.

The operator decides what a client may choose (:class:`ClientPolicy`, from the plugin settings
``client_mode``, ``client_namespaces`` and ``namespace_header``): on an enforced deployment, by
default, a client can neither lower its mode (``vllm_xargs.growpage_mode`` is removed) nor pick its
namespace (its ``growpage_namespace`` and ``user`` are not used); only the gateway's header names
the namespace. What was honoured and ignored is counted (:attr:`NamespaceMiddleware.counts`). The
middleware is plain ASGI (no framework import) and leaves any other request byte for byte.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable

from growpage.asgi import Message, body_message, replay_first
from growpage.vllm_plugin.settings import MODE_ARG, NAMESPACE_ARG

logger = logging.getLogger("vllm.growpage")

NAMESPACE_HEADER = "x-growpage-namespace"
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")
MAX_NAMESPACE_CHARS = 128
# Set once by the endpoint plugin's init_state (the middleware is built before the settings are read).
CURRENT_POLICY: dict[str, ClientPolicy] = {}


@dataclasses.dataclass(frozen=True)
class ClientPolicy:
    """What a client may choose for itself (see the module docstring).

    Attributes:
        honour_mode: keep a client's ``vllm_xargs.growpage_mode``.
        honour_namespace: use a client's ``vllm_xargs.growpage_namespace`` or ``user``.
        header: the trusted gateway's namespace header, or ``""`` for none.
    """

    honour_mode: bool = True
    honour_namespace: bool = True
    header: str = NAMESPACE_HEADER


def namespace_body(body: bytes, header_namespace: str | None, policy: ClientPolicy = ClientPolicy(),
                   counts: collections.Counter | None = None) -> bytes | None:
    """The request body with ``vllm_xargs.growpage_namespace`` set (and a client's mode or
    namespace removed where the policy says so), or None to pass it unchanged.

    Args:
        body: the JSON request body.
        header_namespace: the trusted header's value, if any.
        policy: what the client may choose.
        counts: receives ``mode_honoured``/``mode_ignored``, ``namespace_honoured``/``namespace_ignored``.
    """
    counts = counts if counts is not None else collections.Counter()
    parsed = _payload_and_xargs(body)
    if parsed is None:
        return None
    payload, xargs = parsed
    mode_removed = _apply_mode_policy(xargs, policy, counts)
    namespace_removed = _apply_namespace_policy(payload, xargs, header_namespace, policy, counts)
    namespace = _namespace_to_write(payload, xargs, header_namespace, policy)
    if namespace is None and not (mode_removed or namespace_removed):
        return None
    if namespace is not None:
        xargs[NAMESPACE_ARG] = namespace[:MAX_NAMESPACE_CHARS]
    payload["vllm_xargs"] = xargs
    return json.dumps(payload).encode()


def _payload_and_xargs(body: bytes) -> tuple[dict, dict] | None:
    """The JSON object and a copy of its ``vllm_xargs``, or None for a body this middleware leaves
    alone: malformed or unexpected shapes are vLLM's to answer."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict):
        return None
    xargs = payload.get("vllm_xargs")
    if xargs is not None and not isinstance(xargs, dict):
        return None
    return payload, dict(xargs or {})


def _apply_mode_policy(xargs: dict, policy: ClientPolicy, counts: collections.Counter) -> bool:
    """Count a client's mode as honoured or ignored, removing it when ignored; True if removed."""
    if MODE_ARG not in xargs:
        return False
    counts["mode_honoured" if policy.honour_mode else "mode_ignored"] += 1
    if policy.honour_mode:
        return False
    del xargs[MODE_ARG]
    return True


def _apply_namespace_policy(payload: dict, xargs: dict, header_namespace: str | None, policy: ClientPolicy,
                            counts: collections.Counter) -> bool:
    """Count a client's namespace choice (only when no header overrides it) and remove its
    ``growpage_namespace`` when the policy ignores it; True if removed."""
    client_namespace = xargs.get(NAMESPACE_ARG) or (payload.get("user") if isinstance(payload.get("user"), str)
                                                    else None)
    if client_namespace and not header_namespace:
        counts["namespace_honoured" if policy.honour_namespace else "namespace_ignored"] += 1
    if not policy.honour_namespace and NAMESPACE_ARG in xargs:
        del xargs[NAMESPACE_ARG]
        return True
    return False


def _namespace_to_write(payload: dict, xargs: dict, header_namespace: str | None,
                        policy: ClientPolicy) -> str | None:
    """The namespace to set, by precedence (header, then the client's own, then ``user``); None
    when there is none to set or the client's ``growpage_namespace`` already stands."""
    if header_namespace:
        return header_namespace
    if policy.honour_namespace and xargs.get(NAMESPACE_ARG):
        return None  # the client's own choice stands
    if policy.honour_namespace and isinstance(payload.get("user"), str) and payload["user"]:
        return payload["user"]
    return None


def _header(headers: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    wanted = name.encode()
    for key, value in headers:
        if key.lower() == wanted:
            return value.decode("latin-1").strip() or None
    return None


class NamespaceMiddleware:
    """ASGI middleware: see the module docstring. Faults leave the request as it came."""

    def __init__(self, app: Callable[..., Awaitable[None]], policy: ClientPolicy | None = None):
        self.app = app
        self._policy = policy
        self.counts: collections.Counter[str] = collections.Counter()

    @property
    def policy(self) -> ClientPolicy:
        """The policy given, else the one the endpoint plugin resolved from the deployment's settings."""
        return self._policy or CURRENT_POLICY.get("policy") or ClientPolicy()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if (scope.get("type") != "http" or scope.get("method") != "POST"
                or scope.get("path", "").rstrip("/") not in GENERATION_PATHS):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        message: Message = {}
        while more:
            message = await receive()
            if message.get("type") != "http.request":
                break  # a disconnect: let the app see it
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        policy = self.policy
        try:
            header = _header(scope.get("headers", ()), policy.header) if policy.header else None
            rewritten = namespace_body(body, header, policy, self.counts)
        except Exception:
            logger.debug("growpage: namespace middleware left a request unchanged", exc_info=True)
            rewritten = None
        if rewritten is not None:
            body = rewritten
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", ())
                                         if k.lower() != b"content-length"]
                         + [(b"content-length", str(len(body)).encode())])
        first = message if message.get("type") not in (None, "http.request") else body_message(body)
        await self.app(scope, replay_first(first, receive), send)
