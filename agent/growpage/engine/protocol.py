"""OpenAI-compatible request bodies, validated with pydantic (unknown fields are ignored, as
OpenAI clients send many), and their conversion to engine inputs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from growpage.engine.sampling import InvalidRequest, SamplingParams


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
            raise InvalidRequest(f"n={self.n} is not supported; send n=1 (or several requests)")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        max_tokens = self.max_tokens if self.max_tokens is not None else default_max_tokens
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              seed=self.seed, stop=stop, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] = Field(...)

    def prompt_text_or_ids(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise InvalidRequest("a batch of prompts is not supported; send one prompt per request")
            return self.prompt[0]
        return self.prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest("only text content parts are supported")
            parts.append(part["text"])
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
