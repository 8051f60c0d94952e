"""Sampling parameters (validated at the boundary) and the sampler.

Greedy when ``temperature == 0``; otherwise temperature + nucleus (top-p) sampling drawn from a
per-request ``torch.Generator`` seeded from ``seed``, so a seeded request is reproducible whatever
else shares its batch.
"""

from __future__ import annotations

import dataclasses

import torch

from growpage.errors import GrowPageError


class InvalidRequest(GrowPageError):
    """A request the engine refuses; the server answers it with HTTP 400."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to generate one completion.

    Attributes:
        max_tokens: new tokens at most (>= 1).
        temperature: 0 for greedy; in (0, 2].
        top_p: nucleus mass in (0, 1].
        seed: seeds this request's generator (sampling only).
        stop: strings that end the completion (not included in the text).
        ignore_eos: keep generating past end-of-sequence tokens (benchmarks).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= float(self.temperature) <= 2.0:
            raise InvalidRequest(f"temperature must be in [0, 2], got {self.temperature!r}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop must be a non-empty string or a list of them")
        if len(self.stop) > 4:
            raise InvalidRequest(f"at most 4 stop strings are supported, got {len(self.stop)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    generator = torch.Generator()
    generator.manual_seed(params.seed if params.seed is not None else torch.seed())
    return generator


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row.

    Args:
        logits: ``[rows, vocab]`` float.
        params, generators: per row.
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1).tolist()
    tokens = []
    for row, (p, generator) in enumerate(zip(params, generators)):
        if p.greedy:
            tokens.append(greedy[row])
            continue
        probs = torch.softmax(logits[row] / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < p.top_p  # always keeps the top token
            sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
            choice = torch.multinomial(sorted_probs, 1, generator=generator)
            tokens.append(int(order[choice]))
        else:
            tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
    return tokens
