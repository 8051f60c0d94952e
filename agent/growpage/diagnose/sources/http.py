"""One GET with explicit timeouts, every transport failure turned into a one-line DiagnoseError."""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
import zlib
from typing import TYPE_CHECKING

from growpage import catalog
from growpage.diagnose.errors import DiagnoseError

if TYPE_CHECKING:
    import httpx

# Connecting is quick or not at all; reading may wait on a busy agent (its collector holds a lock).
CONNECT_TIMEOUT_S = 3.0


@dataclasses.dataclass(frozen=True)
class HttpResponse:
    url: str
    status_code: int
    content_type: str
    text: str
    elapsed_s: float
    received_at_s: float  # unix time when the body arrived


def make_client(timeout_s: float) -> httpx.Client:
    import httpx  # noqa: PLC0415 (imported when diagnose runs: other gpctl commands do not need it)

    timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
    # gzip or nothing: the capped reader inflates gzip itself, with the same cap.
    return httpx.Client(timeout=timeout, follow_redirects=True,
                        headers={"User-Agent": "gpctl-diagnose", "Accept-Encoding": "gzip"})


def get(client: httpx.Client, url: str, what: str, params: dict[str, str] | None = None,
        accept: str = "text/plain;version=0.0.4;q=1.0, */*;q=0.1",
        max_bytes: int = catalog.DIAGNOSE_THRESHOLDS.max_response_bytes) -> HttpResponse:
    """GET ``url``; ``what`` names the thing for messages ("the agent", "Prometheus").

    The body is streamed: reading stops at ``max_bytes`` and at an overall deadline of the client's
    read timeout from the start of the request. Per-read timeouts alone let a server that trickles
    a byte a second hold diagnose forever, and an unbounded body can exhaust its memory: diagnose
    must survive the agent it diagnoses.
    """
    import httpx  # noqa: PLC0415 (deferred: see make_client)

    deadline_s = client.timeout.read or 10.0
    started = time.perf_counter()
    try:
        with client.stream("GET", url, params=params, headers={"Accept": accept}) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise DiagnoseError(_too_large(what, url, max_bytes))
            chunks, received = [], 0
            for chunk in response.iter_raw():
                received += len(chunk)
                if received > max_bytes:
                    raise DiagnoseError(_too_large(what, url, max_bytes))
                if time.perf_counter() - started > deadline_s:
                    raise httpx.ReadTimeout("overall deadline")
                chunks.append(chunk)
            body = _decode(response, b"".join(chunks), what, url, max_bytes)
    except httpx.ConnectError as error:
        raise DiagnoseError(f"cannot connect to {what} at {url} ({_reason(error)}): is it running, "
                            "and are the host and port right?") from None
    except httpx.TimeoutException:
        raise DiagnoseError(f"{what} at {url} did not answer within {deadline_s:g}s: check that "
                            "it is up and not overloaded, or raise --timeout") from None
    except httpx.InvalidURL as error:
        raise DiagnoseError(f"invalid URL {url!r} ({error}): use http://HOST:PORT[/path]") from None
    except httpx.HTTPError as error:
        raise DiagnoseError(f"request to {what} at {url} failed ({_reason(error)})") from None
    elapsed_s = time.perf_counter() - started
    return HttpResponse(url=str(response.url), status_code=response.status_code,
                        content_type=response.headers.get("content-type", ""), text=body,
                        elapsed_s=elapsed_s, received_at_s=time.time())


def _decode(response: httpx.Response, raw: bytes, what: str, url: str, max_bytes: int) -> str:
    """The body as text, gunzipped (bounded too: a small gzip can expand without limit)."""
    if "gzip" in response.headers.get("content-encoding", "").lower():
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        raw = inflater.decompress(raw, max_bytes + 1)
        if len(raw) > max_bytes or inflater.unconsumed_tail:
            raise DiagnoseError(_too_large(what, url, max_bytes))
    return raw.decode(response.charset_encoding or "utf-8", errors="replace")


def _too_large(what: str, url: str, max_bytes: int) -> str:
    return (f"{what} at {url} sent more than {max_bytes // (1024 * 1024)} MiB: not a metrics page "
            "diagnose can read (a GrowPage exposition is a few tens of KiB); check the URL")


def check_url(url: str, option: str) -> str:
    """``url`` with a scheme; raises DiagnoseError for something that is not an http(s) URL."""
    if "://" not in url:
        url = f"http://{url}"
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise DiagnoseError(f"{option} {url!r} is not an http(s) URL: use http://HOST:PORT[/path]")
    return url


def with_default_path(url: str, default_path: str) -> str:
    """``http://host:port`` -> ``http://host:port<default_path>``; an explicit path is kept."""
    parsed = urllib.parse.urlparse(url)
    if parsed.path in ("", "/"):
        return urllib.parse.urlunparse(parsed._replace(path=default_path))
    return url


def _reason(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 100 else text[:97] + "..."
