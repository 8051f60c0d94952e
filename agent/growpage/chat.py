"""Chat prompts, written once: every home and benchmark templates a conversation the same way."""

from __future__ import annotations

from typing import Any


def user_turn(text: str) -> list[dict[str, str]]:
    """A one-message conversation from the user."""
    return [{"role": "user", "content": text}]


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` under the model's chat template, ready for the assistant's reply.

    Newer tokenizers return a ``BatchEncoding`` from ``apply_chat_template``; older ones a list.
    """
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def chat_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The templated prompt as text (for engines that tokenize it themselves, e.g. vLLM)."""
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
