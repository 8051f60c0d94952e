"""What the server checks in a request before the engine sees it, as plain functions.

Each check raises :class:`~growpage.engine.sampling.InvalidRequest` (a 400 naming the field) for
input the client can fix, so a bad request costs neither tokenization nor engine time. Routing
(namespace, mode) is decided here too: the operator's :class:`ServerSettings` say how much of it a
client may choose, and :class:`ServerCounters` record what was honoured or ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from growpage.engine.protocol import ChatBody, CompletionBody, check_text
from growpage.engine.sampling import InvalidRequest, SamplingParams
from growpage.engine.server_settings import ServerCounters, ServerSettings

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
MODE_HEADER = "x-growpage-mode"
MODES = ("off", "monitor", "enforce")

GenerationBody = CompletionBody | ChatBody


def max_text_bytes(vocabulary: Iterable[str], max_model_len: int) -> int | None:
    """The most UTF-8 bytes a text can have and still fit the context; None for an empty vocabulary.

    No token spans more bytes than the vocabulary's longest entry (its mapped form is never shorter
    than the bytes it stands for), so a longer text cannot fit whatever it holds: refusing it up
    front spares seconds of CPU tokenizing it.
    """
    longest = max((len(token.encode("utf-8", "replace")) for token in vocabulary), default=0)
    return max_model_len * longest if longest else None


def check_length(text: str, limit_bytes: int | None, max_model_len: int) -> None:
    """Refuse a text longer than :func:`max_text_bytes` allows (the cheap length test first)."""
    if limit_bytes is not None and len(text) > limit_bytes // 4 and len(text.encode()) > limit_bytes:
        raise InvalidRequest(f"the prompt is {len(text.encode())} bytes, more than this model's context of "
                             f"{max_model_len} tokens can hold; shorten the prompt", param="prompt")


def check_token_ids(token_ids: Sequence[object], vocab_size: int) -> None:
    """Refuse a prompt of token ids unless each one is an id of the model's vocabulary."""
    if any(not isinstance(token, int) or not 0 <= token < vocab_size for token in token_ids):
        raise InvalidRequest("prompt token ids must be integers in the model's vocabulary", param="prompt")


def sampling_params(body: GenerationBody, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
    """The body's sampling parameters, ``max_tokens`` checked against the context as vLLM does.

    Without ``max_tokens`` the request may use :data:`DEFAULT_MAX_TOKENS` or the room left, whichever
    is smaller, so a default never overflows the context.
    """
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise InvalidRequest(f"the prompt is {num_prompt_tokens} tokens; this model's context is "
                             f"{max_model_len} tokens: shorten the prompt", param="prompt")
    params = body.sampling_params(min(DEFAULT_MAX_TOKENS, room))
    if params.max_tokens > room:
        raise InvalidRequest(f"this model's maximum context length is {max_model_len} tokens; you "
                             f"requested {num_prompt_tokens + params.max_tokens} ({num_prompt_tokens} in the "
                             f"prompt, {params.max_tokens} in the completion): lower max_tokens to at most "
                             f"{room} or shorten the prompt", param="max_tokens")
    return params


def routing(headers: Mapping[str, str], body: GenerationBody, settings: ServerSettings,
            counters: ServerCounters) -> tuple[str | None, str | None]:
    """The request's namespace and mode, as far as the operator lets the client choose them."""
    return request_namespace(headers, body, settings, counters), request_mode(headers, body, settings, counters)


def request_namespace(headers: Mapping[str, str], body: GenerationBody, settings: ServerSettings,
                      counters: ServerCounters) -> str | None:
    """The trusted gateway header's namespace, else the body's ``namespace``/``user`` if allowed.

    The header wins because only a gateway that overwrites it can set it; a body namespace is the
    client's own claim, honoured only where the operator lets clients choose.
    """
    trusted = headers.get(settings.namespace_header) if settings.namespace_header else None
    if trusted:
        counters.header_namespaces += 1
        return trusted
    claimed = body.namespace or body.user
    if not claimed:
        return None
    counters.client_namespaces["honoured" if settings.client_namespaces else "ignored"] += 1
    return check_text(claimed, "namespace") if settings.client_namespaces else None


def request_mode(headers: Mapping[str, str], body: GenerationBody, settings: ServerSettings,
                 counters: ServerCounters) -> str | None:
    """The mode the request asks for (header first), or None when it asks none or may not choose.

    A mode outside :data:`MODES` is refused even when overrides are off: the client should hear that
    its request is malformed rather than have it silently ignored.
    """
    mode = headers.get(MODE_HEADER) or body.growpage_mode
    if mode is None:
        return None
    if mode not in MODES:
        raise InvalidRequest(f"{MODE_HEADER} must be off, monitor or enforce, got {mode!r}", param="growpage_mode")
    counters.mode_overrides["honoured" if settings.allow_mode_override else "ignored"] += 1
    if not settings.allow_mode_override:
        logger.info("ignored a request's growpage mode %r: this deployment does not allow overrides", mode)
        return None
    return mode
