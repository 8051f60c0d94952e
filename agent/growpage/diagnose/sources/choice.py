"""The rules every command that reads a source shares (``gpctl diagnose``, ``gpctl calibrate``):
exactly one source, and the modules it needs present, each refused with one line."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from growpage.errors import GrowPageError


def require_one_source(endpoint: str | None, prometheus: str | None, snapshots: Sequence[Path],
                       error: type[GrowPageError] = GrowPageError) -> None:
    """Raises ``error`` unless exactly one of ``--endpoint``, ``--prometheus`` and ``--snapshot`` is given.

    The command chooses the error type, since each maps its own to an exit code.
    """
    chosen = [name for name, value in (("--endpoint", endpoint), ("--prometheus", prometheus),
                                       ("--snapshot", snapshots)) if value]
    if len(chosen) != 1:
        given = f" (got {' and '.join(chosen)})" if chosen else ""
        raise error(f"choose exactly one source: --endpoint URL, --prometheus URL or --snapshot FILE...{given}")


def require_modules(command: str, reads_http: bool, parses_expositions: bool,
                    error: type[GrowPageError] = GrowPageError) -> None:
    """One clear line, not an ImportError, when a module the source needs is missing.

    Args:
        command: the gpctl command, for the message.
        reads_http: the source is a live agent or Prometheus (httpx: HTTP with explicit timeouts).
        parses_expositions: the source is an agent's text (prometheus_client's exposition parser).
    """
    needed = (["httpx"] if reads_http else []) + (["prometheus_client"] if parses_expositions else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise error(f"gpctl {command} needs {' and '.join(missing)}: pip install {' '.join(missing)}")
