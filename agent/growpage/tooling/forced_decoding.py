"""Forced decoding inside vLLM: a logits processor that makes a request emit given tokens.

Fidelity inside vLLM is measured by teacher forcing: a request is decoded under a method's cache
but made to emit full KV's own continuation, and the log-probability the *unforced* distribution
gave each forced token is its per-token NLL. vLLM computes ``raw_logprobs`` (its default
``logprobs_mode``) before any logits processor runs, so this processor changes what is sampled
and leaves the reported log-probabilities those of the model under the method's cache.

Load it by qualified name, ``LLM(..., logits_processors=[FORCE_PROCESSOR])``, and give a request its
tokens with ``SamplingParams(extra_args={REFERENCE_KEY: [token ids]}, max_tokens=len(ids),
logprobs=0, temperature=0)``. Requests without the key decode as usual.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

REFERENCE_KEY = "growpage_reference_token_ids"
FORCE_PROCESSOR = "growpage.tooling.forced_decoding:ForceReferenceTokens"


def force_row(reference: list[int], output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    """One request's logits row (shape ``[vocab]``) with every token but the next reference token
    at -inf; unchanged once the reference is used up (the request ends at ``max_tokens``)."""
    position = len(output_token_ids)
    if position >= len(reference):
        return logits
    token = reference[position]
    logits.fill_(float("-inf"))
    logits[token] = 0.0
    return logits


class ForceReferenceTokens(AdapterLogitsProcessor):
    """Per request: emit ``extra_args[REFERENCE_KEY]`` in order, whatever the model prefers."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy choice: that is its job

    def new_req_logits_processor(self, params: SamplingParams
                                 ) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        reference = (params.extra_args or {}).get(REFERENCE_KEY)
        if reference is None:
            return None
        tokens = [int(token) for token in reference]

        def force(output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            return force_row(tokens, output_token_ids, logits)

        return force
