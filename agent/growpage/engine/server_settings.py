"""What the operator decides about the HTTP server: who gets in, how much a request may send,
which client-supplied GrowPage routing is honoured, and how long a shutdown may take.

Defaults are safe for an enforced deployment: :meth:`ServerSettings.for_mode` turns off per-request
mode lowering and body/``user`` namespaces when the deployment enforces, so a client cannot opt
out of enforcement; the namespace then comes only from the trusted header a gateway sets.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from growpage.config import Mode
from growpage.errors import ConfigError

PUBLIC_ENDPOINTS = {"health": ("/health",), "metrics": ("/metrics/growpage",)}
DEFAULT_NAMESPACE_HEADER = "x-growpage-namespace"
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # a full 8k-token prompt is ~50 KB of JSON; leaves wide room
DEFAULT_SHUTDOWN_TIMEOUT_S = 50.0  # a little under the manifests' terminationGracePeriodSeconds (60)


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """The server's operator-facing knobs, validated on construction.

    Attributes:
        api_key: when set, every route but the ``public`` ones needs ``Authorization: Bearer KEY``.
        public: endpoints open without the key: ``health`` and/or ``metrics``.
        api_docs: serve ``/docs``, ``/redoc`` and ``/openapi.json``.
        max_request_bytes: a larger request body is refused with 413 before it is parsed.
        allow_mode_override: honour ``growpage_mode`` / ``X-GrowPage-Mode`` (they only lower the mode).
        client_namespaces: honour the body's ``namespace`` and ``user`` as the request's namespace.
        namespace_header: the header a trusted gateway sets to the request's namespace ("" or None:
            none is trusted).
        shutdown_timeout_s: after SIGTERM, running requests may finish for this long; queued ones
            are refused at once and whatever is left at the deadline is failed with 503.
    """

    api_key: str | None = None
    public: tuple[str, ...] = ("health", "metrics")
    api_docs: bool = False
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    allow_mode_override: bool = True
    client_namespaces: bool = True
    namespace_header: str | None = DEFAULT_NAMESPACE_HEADER
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "public", tuple(self.public))
        object.__setattr__(self, "api_key", self.api_key or None)
        object.__setattr__(self, "namespace_header", (self.namespace_header or "").strip().lower() or None)
        unknown = [name for name in self.public if name not in PUBLIC_ENDPOINTS]
        if unknown:
            raise ConfigError(f"public endpoint {unknown[0]!r} is unknown; choose from "
                              f"{', '.join(PUBLIC_ENDPOINTS)} (or none)")
        if self.api_key is not None and (len(self.api_key) < 8 or self.api_key != self.api_key.strip()):
            raise ConfigError("the API key must be at least 8 characters without surrounding spaces; "
                              "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if (not isinstance(self.max_request_bytes, int) or isinstance(self.max_request_bytes, bool)
                or self.max_request_bytes < 1024):
            raise ConfigError(f"max_request_bytes must be an integer >= 1024, got {self.max_request_bytes!r}; "
                              f"try {DEFAULT_MAX_REQUEST_BYTES}")
        if (isinstance(self.shutdown_timeout_s, bool) or not isinstance(self.shutdown_timeout_s, (int, float))
                or not math.isfinite(self.shutdown_timeout_s) or self.shutdown_timeout_s < 0):
            raise ConfigError(f"shutdown timeout must be a finite number of seconds >= 0, got "
                              f"{self.shutdown_timeout_s!r}; try {DEFAULT_SHUTDOWN_TIMEOUT_S:g}")

    @classmethod
    def for_mode(cls, mode: Mode | str, **overrides: Any) -> ServerSettings:
        """Settings whose routing defaults follow the deployment's mode; ``overrides`` that are
        None keep the default.

        An enforced deployment honours neither per-request mode lowering nor body namespaces by
        default: either would let any client opt out of enforcement.
        """
        enforced = Mode(mode) is Mode.ENFORCE
        values: dict[str, Any] = {"allow_mode_override": not enforced, "client_namespaces": not enforced}
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)

    def public_paths(self) -> frozenset[str]:
        return frozenset(path for name in self.public for path in PUBLIC_ENDPOINTS[name])


@dataclasses.dataclass
class ServerCounters:
    """What the server counted (exported once the telemetry catalog has these series).

    Attributes:
        mode_overrides: per-request mode requests, by outcome: ``honoured`` or ``ignored``.
        client_namespaces: body/``user`` namespaces, by outcome: ``honoured`` or ``ignored``.
        header_namespaces: namespaces taken from the trusted gateway header.
        disconnects: requests aborted because their client went away.
        refused: requests refused before the engine, by reason (``too_large``, ``unauthorized``,
            ``shutting_down``).
    """

    mode_overrides: dict[str, int] = dataclasses.field(default_factory=lambda: {"honoured": 0, "ignored": 0})
    client_namespaces: dict[str, int] = dataclasses.field(default_factory=lambda: {"honoured": 0, "ignored": 0})
    header_namespaces: int = 0
    disconnects: int = 0
    refused: dict[str, int] = dataclasses.field(default_factory=dict)

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
