"""OpenAI-compatible request bodies, validated with pydantic, and their conversion to engine inputs.

Fields this server does not implement (``logprobs``, ``echo``, ``best_of``, penalties, tools, ...)
are refused with a 400 naming them whenever they ask for something, rather than answered as if
they had been honoured; left at their neutral value they are accepted. Other unknown fields are
ignored, as OpenAI clients send many. Text must be valid Unicode (no unpaired surrogates).
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from growpage.engine.sampling import InvalidRequest, SamplingParams

# Fields of OpenAI's (and vLLM's) APIs this server does not implement, with the values that ask for
# nothing: any other value is refused by name.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    # vLLM's sampling extras
    "top_k": (None, 0, -1),
    "min_p": (None, 0),
    "repetition_penalty": (None, 1),
    "min_tokens": (None, 0),
    "use_beam_search": (None, False),
    "stop_token_ids": (None, []),
    "prompt_logprobs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}


def refuse_unsupported(extra: dict[str, Any] | None) -> None:
    """Raise :class:`InvalidRequest` naming the first unsupported field that asks for something."""
    for name, value in (extra or {}).items():
        neutral = UNSUPPORTED_FIELDS.get(name)
        if neutral is not None and not any(_same(value, n) for n in neutral):
            raise InvalidRequest(f"{name} is not supported by this server; remove it from the request",
                                 param=name)


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(value, bool) or isinstance(neutral, bool) or value is None or neutral is None:
        return value is neutral  # False is not 0 here, and 0 is not False
    return bool(value == neutral)


def check_text(text: str, where: str) -> str:
    """``text`` if it is valid Unicode; an unpaired surrogate (e.g. ``"\\ud800"``) is refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidRequest(f"{where} holds an unpaired surrogate at character {error.start}; send valid "
                             "UTF-8 text", param=where) from None
    return text


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    user: str | None = None
    # GrowPage extras: the staged rollout's request namespace and a per-request mode.
    namespace: str | None = None
    growpage_mode: Literal["off", "monitor", "enforce"] | None = None
    ignore_eos: bool = False

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.n != 1:
            raise InvalidRequest(f"n={self.n} is not supported; send n=1 (or several requests)", param="n")
        refuse_unsupported(self.model_extra)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        for text in stop:
            check_text(text, "stop")
        max_tokens = self.max_tokens if self.max_tokens is not None else default_max_tokens
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              seed=self.seed, stop=stop, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] = Field(...)

    def prompt_text_or_ids(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return check_text(prompt, "prompt")
        if prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise InvalidRequest("a batch of prompts is not supported; send one prompt per request")
            return check_text(prompt[0], "prompt")
        # pydantic validated one branch of the union: a list not of strings is the list[int] one
        return cast(list[int], prompt)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return check_text(self.content, "messages.content")
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest("only text content parts are supported", param="messages.content")
            parts.append(check_text(part["text"], "messages.content"))
        return "".join(parts)


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


def error_body(message: str, code: str, param: str | None = None,
               error_type: str = "invalid_request_error") -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
