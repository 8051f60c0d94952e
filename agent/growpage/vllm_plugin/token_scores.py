"""What a worker ranks a request's tokens by when it compacts them inside vLLM.

The observer hands over one observation per observed step and enforced request: ``[P]`` attention
mass per physical slot (the mean over sampled heads, summed over observed layers), or with per-head
keep sets ``[kv_heads, P]`` (each KV head's own; every tensor here then carries that head axis). The first one
after a request is admitted (or restarted) is its prompt's: the step that ends the prompt, scored by
the prompt's last query (or its observation window). How observations combine is the method's
:class:`~growpage.core.methods.TokenScore`:

- ``ACCUMULATED`` (H2O): the sum of every observation, the prompt's included.
- ``WINDOW`` (SnapKV): an exponential window of about ``window_steps`` observations (each older one
  fades by ``1 - 1 / window_steps`` per step), max-pooled over ``pool_kernel`` neighbours.
- ``PROMPT_ANCHORED`` (GrowPage): the prompt's observation counts as ``prompt_prior_steps``
  decode steps' (a prior of that strength): ``(k * prompt + sum of decodes) / (k + decodes)``.
  The prompt's last query is where the question sits; it says which prompt tokens the answer needs
  (SnapKV's premise). Summed as H2O does, it is one row among every decode step's, and a
  compaction that comes a few decode steps after the prefill ranks by what the preamble of the
  answer looked at (``The door code for the ...`` attends to every `` the`` of the notes):
  measured inside vLLM on retrieval under pressure, a digit of the needle then fell out of the kept
  set in most requests. Anchored, the question decides while few decode steps have been seen, and
  a long decode (reasoning) is ranked by its own attention as evidence accumulates; among
  generated tokens (no prompt mass) the order is H2O's.
- ``RECENCY`` (StreamingLLM): no scores; the compactor keeps the newest.

Scores stay on the attention's device (no host copy per step); a compaction reads them once.
Pure torch over small tensors, so tests run it without vLLM.
"""

from __future__ import annotations

import dataclasses

import torch

from growpage.core.evict import max_pool_scores, tokens_for_coverage
from growpage.core.methods import PROMPT_PRIOR_STEPS, SCORED_TOKEN_SCORES, KVMethod, TokenScore
from growpage.vllm_plugin.compaction import take_slots


@dataclasses.dataclass
class _RequestScores:
    prompt: torch.Tensor  # [(kv_heads,) prompt physical slots] the prompt's observation
    decoded: torch.Tensor | None = None  # [(kv_heads,) P] decode observations: summed, or decayed for WINDOW
    steps: int = 0  # decode observations folded into ``decoded``


def _grown(current: torch.Tensor | None, length: int, like: torch.Tensor) -> torch.Tensor:
    """``current`` zero-padded to ``length`` slots on its last axis (a new tensor when it must grow)."""
    if current is not None and current.shape[-1] >= length:
        return current
    grown = torch.zeros(*like.shape[:-1], length, dtype=torch.float32, device=like.device)
    if current is not None:
        grown[..., :current.shape[-1]] = current
    return grown


def _padded(scores: torch.Tensor | None, length: int, heads: tuple[int, ...] = ()) -> torch.Tensor:
    """``scores[..., :length]`` on the host, zero-padded to ``length`` (shape ``heads + (length,)``
    when ``scores`` is None)."""
    if scores is None:
        return torch.zeros(*heads, length, dtype=torch.float32)
    out = torch.zeros(*scores.shape[:-1], length, dtype=torch.float32)
    count = min(length, scores.shape[-1])
    out[..., :count] = scores[..., :count].float().cpu()
    return out


class TokenScores:
    """Per-request compaction scores of one worker (see the module docstring).

    Args:
        kind: how observations combine; ``RECENCY`` keeps none.
        window_steps: the time constant of ``WINDOW`` scores, in observed steps.
        pool_kernel: max-pool width over neighbouring positions before ranking (1: none).
        prompt_prior_steps: for ``PROMPT_ANCHORED``, how many decode steps the prompt's
            observation counts as.
    """

    def __init__(self, kind: TokenScore, window_steps: int = 32, pool_kernel: int = 1,
                 prompt_prior_steps: int = PROMPT_PRIOR_STEPS):
        if kind not in SCORED_TOKEN_SCORES and kind is not TokenScore.RECENCY:
            raise ValueError(f"token score {kind.value!r} is not supported inside vLLM; "
                             f"use one of {', '.join(k.value for k in (*SCORED_TOKEN_SCORES, TokenScore.RECENCY))}")
        if window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {window_steps}")
        self.kind = kind
        self.decay = 1.0 - 1.0 / window_steps if kind is TokenScore.WINDOW else 1.0
        self.pool_kernel = pool_kernel
        self.prompt_prior_steps = prompt_prior_steps
        self._requests: dict[str, _RequestScores] = {}

    @property
    def scored(self) -> bool:
        """False for ``RECENCY``: observations are not kept and compactions keep the newest."""
        return self.kind is not TokenScore.RECENCY

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add(self, request_id: str, attention: torch.Tensor) -> None:
        """Fold one observation in: the request's first is its prompt's, the rest are decode steps'."""
        if not self.scored:
            return
        attention = attention.float()
        entry = self._requests.get(request_id)
        if entry is None:
            self._requests[request_id] = _RequestScores(prompt=attention.clone())
            return
        length = attention.shape[-1]
        decoded = _grown(entry.decoded, length, attention)
        if self.decay < 1.0:
            decoded.mul_(self.decay)
        decoded[..., :length] += attention
        entry.decoded = decoded
        entry.steps += 1

    def ranking(self, request_id: str, positions: torch.Tensor) -> torch.Tensor | None:
        """``[P]`` (per KV head ``[kv_heads, P]``) host scores of the request's physical slots
        (higher: kept first), or None when nothing was observed (or the kind keeps none): the
        compactor then keeps the newest.

        Args:
            positions: ``[P]`` or ``[kv_heads, P]`` logical position of each physical slot (for
                max-pooling neighbours).
        """
        entry = self._requests.get(request_id)
        if entry is None or not self.scored:
            return None
        length = positions.shape[-1]
        heads = tuple(entry.prompt.shape[:-1])
        prompt, decoded = _padded(entry.prompt, length), _padded(entry.decoded, length, heads)
        if self.kind is TokenScore.PROMPT_ANCHORED:
            prior = self.prompt_prior_steps
            combined = (prior * prompt + decoded) / (prior + entry.steps)
        elif self.kind is TokenScore.WINDOW:
            combined = prompt * self.decay ** entry.steps + decoded
        else:
            combined = prompt + decoded
        return max_pool_scores(positions, combined, self.pool_kernel)

    def tokens_for_coverage(self, request_id: str, coverage: float, protected_head: int = 0,
                            protected_tail: int = 0) -> int:
        """How many tokens the request's observed attention needs: its first ``protected_head`` and
        last ``protected_tail`` tokens (sinks and the recent window, always kept), plus the fewest
        others whose scores hold ``coverage`` of the others' score mass (highest first). The
        protected tokens' mass is left out: a small model puts most of its attention on the first
        token, so a share of the total would count a handful of tokens as enough. 0 when nothing
        was observed. Per KV head, the neediest head's count (every head keeps as many tokens).

        After a compaction the survivors' shares are of what is left, so a caller that uses this as
        a floor keeps the highest value it has seen (the controller does)."""
        entry = self._requests.get(request_id)
        if entry is None or not self.scored:
            return 0
        length = max(entry.prompt.shape[-1], 0 if entry.decoded is None else entry.decoded.shape[-1])
        ranking = self.ranking(request_id, torch.arange(length))
        assert ranking is not None
        slots = torch.arange(length)
        protected = (slots < protected_head) | (slots >= length - protected_tail)
        return max(tokens_for_coverage(head, protected, coverage) for head in ranking.reshape(-1, length))

    def keep(self, request_id: str, keep_index: torch.Tensor, physical: int) -> None:
        """After a compaction: the survivors' scores move to slots ``[0, k)`` with them
        (``keep_index`` ``[k]``, or ``[kv_heads, k]``: each head's own survivors)."""
        entry = self._requests.get(request_id)
        if entry is None:
            return
        device = entry.prompt.device
        index = keep_index.long()
        entry.prompt = take_slots(_padded(entry.prompt, physical), index).to(device)
        if entry.decoded is not None:
            entry.decoded = take_slots(_padded(entry.decoded, physical), index).to(device)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)


def for_method(method: KVMethod) -> TokenScores:
    """The worker's scores for ``method``, as its :class:`~growpage.core.methods.TokenScore` says:
    the fixed caps rank as their papers do (H2O's sum, SnapKV's pooled window, StreamingLLM's
    recency), GrowPage's methods ``PROMPT_ANCHORED`` (as the reference engine's do)."""
    return TokenScores(method.token_score, method.score_window_steps, method.pool_kernel)
