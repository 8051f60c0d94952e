"""Sampling parameters (validated at the boundary) and the sampler.

Greedy when ``temperature == 0``; otherwise temperature + nucleus (top-p) sampling drawn from a
per-request ``torch.Generator`` seeded from ``seed``, so a seeded request is reproducible whatever
else shares its batch. As in vLLM, a temperature in (0, 0.01) is raised to 0.01 (dividing logits by
less overflows to inf/nan) and a seed must fit a signed 64-bit integer. :func:`sample_row` raises
:class:`SamplingFault` for a row it cannot sample, so the engine fails that request alone.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch

from growpage.errors import GrowPageError

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-2  # vLLM's floor: below it softmax(logits / T) overflows
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # vLLM's bounds (a C long); torch takes them all


class InvalidRequest(GrowPageError):
    """A request the engine refuses; the server answers it with HTTP 400.

    Args:
        message: what is wrong and how to fix it.
        param: the request field at fault (OpenAI's ``error.param``), when one is.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class SamplingFault(Exception):
    """One row could not be sampled (non-finite logits or probabilities); fails that request only."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to generate one completion.

    Attributes:
        max_tokens: new tokens at most (>= 1).
        temperature: 0 for greedy; in (0, 2]; values in (0, 0.01) are raised to 0.01.
        top_p: nucleus mass in (0, 1].
        seed: seeds this request's generator (sampling only); a signed 64-bit integer.
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
            raise InvalidRequest(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", param="max_tokens")
        if not 0.0 <= float(self.temperature) <= 2.0:  # also refuses nan
            raise InvalidRequest(f"temperature must be in [0, 2], got {self.temperature!r}", param="temperature")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            logger.warning("temperature %s is below %s, which overflows the softmax; using %s",
                           self.temperature, MIN_TEMPERATURE, MIN_TEMPERATURE)
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        if not 0.0 < float(self.top_p) <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}", param="top_p")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not SEED_MIN <= self.seed <= SEED_MAX):
            raise InvalidRequest(f"seed must be an integer in [-2**63, 2**63 - 1], got {self.seed!r}", param="seed")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop must be a non-empty string or a list of them", param="stop")
        if len(self.stop) > 4:
            raise InvalidRequest(f"at most 4 stop strings are supported, got {len(self.stop)}", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    generator = torch.Generator()
    generator.manual_seed(params.seed % 2**64 if params.seed is not None else torch.seed())
    return generator


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int | SamplingFault]:
    """One token per row, or the :class:`SamplingFault` of a row that could not be sampled.

    Args:
        logits: ``[rows, vocab]`` float.
        params, generators: per row.
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1).tolist()
    tokens: list[int | SamplingFault] = []
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        try:
            tokens.append(sample_row(logits[row], p, generator, greedy[row]))
        except SamplingFault as fault:
            tokens.append(fault)
    return tokens


def sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None,
               greedy_token: int) -> int:
    """One token from one row of float logits.

    Raises:
        SamplingFault: the logits or the probabilities are not finite.
    """
    if not bool(torch.isfinite(logits).any()):
        raise SamplingFault("the model produced no finite logit for this request")
    if p.greedy:
        return greedy_token
    probs = torch.softmax(logits / p.temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()) or not math.isfinite(float(probs.sum())):
        raise SamplingFault(f"temperature {p.temperature} gives non-finite probabilities")
    try:
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < p.top_p  # always keeps the top token
            sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
            choice = torch.multinomial(sorted_probs, 1, generator=generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=generator))
    except RuntimeError as error:  # multinomial's own checks (inf/nan/negative mass)
        raise SamplingFault(str(error).splitlines()[0]) from None
