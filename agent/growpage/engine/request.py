"""A request as the engine tracks it: token ids, progress, output text and its stop logic."""

from __future__ import annotations

import dataclasses
import enum
import time

import torch

from growpage.engine.sampling import SamplingParams


class RequestStatus(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # client went away or the request was cancelled
    # Not OpenAI's values, on purpose: a client must not mistake these for a normal "length".
    TRUNCATED = "truncated"  # the KV pool could not hold the request even alone: output cut short
    ERROR = "error"  # this request's step failed (e.g. sampling); the others carried on


@dataclasses.dataclass
class Request:
    """One completion in flight.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache (prompt first, then outputs);
    after a preemption it goes back to 0 and everything is recomputed.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    namespace: str | None = None
    mode: str | None = None  # a per-request GrowPage mode (may only lower the deployment's)
    block_hashes: list[int] = dataclasses.field(default_factory=list)
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    output_text: str = ""
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    arrival_s: float = dataclasses.field(default_factory=time.monotonic)
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    token_times_s: list[float] = dataclasses.field(default_factory=list)
    # Teacher forcing (evaluation): forced outputs, their log-probs, greedy agreement per step.
    teacher_token_ids: list[int] | None = None
    teacher_logprobs: list[float] = dataclasses.field(default_factory=list)
    teacher_greedy_matches: list[bool] = dataclasses.field(default_factory=list)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a block's hash covers its whole prefix)."""
    hashes, parent = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        hashes.append(parent)
    return hashes
