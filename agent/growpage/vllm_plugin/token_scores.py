"""What a worker ranks a request's tokens by when it compacts them inside vLLM.

The observer hands over one observation per observed step and enforced request: ``[P]`` attention
mass per physical slot (the mean over sampled heads, summed over observed layers), or with per-head
keep sets ``[kv_heads, P]`` (each KV head's own; every tensor here then carries that head axis). The first one
after a request is admitted (or restarted) is its prompt's: the step that ends the prompt, scored by
the prompt's last query (or its observation window); the rest are decode steps'.

How observations combine, and what ranks the tokens, is the method's, through the hooks the
reference engine calls too (:class:`~growpage.core.methods.KVMethod`): each observation folds in as
``scores <- step_decay * scores + observation_weight(kind) * attention`` and a compaction ranks by
``method.rank`` (H2O's sum, SnapKV's pooled window, TOVA's newest observation, GrowPage's
prompt-anchored sum; StreamingLLM observes nothing and keeps the newest).

Scores stay on the attention's device (no host copy per step); a compaction reads them once.
Pure torch over small tensors, so tests run it without vLLM.
"""

from __future__ import annotations

import dataclasses

import torch

from growpage.core.methods import KVMethod, Observation
from growpage.vllm_plugin.compaction import take_slots


@dataclasses.dataclass
class _RequestScores:
    folded: torch.Tensor  # [(kv_heads,) P] every observation so far, weighted and faded as the method says


def _grown(current: torch.Tensor, length: int) -> torch.Tensor:
    """``current`` zero-padded to ``length`` slots on its last axis (a new tensor when it must grow)."""
    if current.shape[-1] >= length:
        return current
    grown = torch.zeros(*current.shape[:-1], length, dtype=torch.float32, device=current.device)
    grown[..., :current.shape[-1]] = current
    return grown


def _padded(scores: torch.Tensor, length: int) -> torch.Tensor:
    """``scores[..., :length]`` on the host, zero-padded to ``length``."""
    out = torch.zeros(*scores.shape[:-1], length, dtype=torch.float32)
    count = min(length, scores.shape[-1])
    out[..., :count] = scores[..., :count].float().cpu()
    return out


class TokenScores:
    """Per-request compaction scores of one worker, as ``method`` folds and ranks them (see the
    module docstring)."""

    def __init__(self, method: KVMethod):
        self.method = method
        self._requests: dict[str, _RequestScores] = {}

    @property
    def scored(self) -> bool:
        """False for a method that ranks without attention: observations are not kept and
        compactions keep the newest."""
        return self.method.uses_attention

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add(self, request_id: str, attention: torch.Tensor) -> None:
        """Fold one observation in: the request's first is its prompt's, the rest are decode steps'."""
        if not self.scored:
            return
        attention = attention.float()
        entry = self._requests.get(request_id)
        if entry is None:
            weight = self.method.observation_weight(Observation.PROMPT_END)
            self._requests[request_id] = _RequestScores(folded=attention * weight)
            return
        length = attention.shape[-1]
        folded = _grown(entry.folded, length)
        if self.method.step_decay < 1.0:
            folded.mul_(self.method.step_decay)
        folded[..., :length] += attention * self.method.observation_weight(Observation.DECODE)
        entry.folded = folded

    def ranking(self, request_id: str, positions: torch.Tensor) -> torch.Tensor | None:
        """``[P]`` (per KV head ``[kv_heads, P]``) host scores of the request's physical slots
        (higher: kept first), or None when nothing was observed (or the method observes nothing):
        the compactor then keeps the newest.

        Args:
            positions: ``[P]`` or ``[kv_heads, P]`` logical position of each physical slot (for
                max-pooling neighbours).
        """
        entry = self._requests.get(request_id)
        if entry is None or not self.scored:
            return None
        return self.method.rank(positions, _padded(entry.folded, positions.shape[-1]))

    def tokens_for_coverage(self, request_id: str, coverage: float, protected_head: int = 0,
                            protected_tail: int = 0) -> int:
        """How many tokens the request's observed attention needs (``method.attention_need``): its
        first ``protected_head`` and last ``protected_tail`` tokens (sinks and the recent window,
        always kept), plus the fewest others whose scores hold ``coverage`` of the others' score
        mass. 0 when nothing was observed. Per KV head, the neediest head's count (every head
        keeps as many tokens).

        After a compaction the survivors' shares are of what is left, so a caller that uses this as
        a floor keeps the highest value it has seen (the controller does)."""
        entry = self._requests.get(request_id)
        if entry is None or not self.scored:
            return 0
        length = entry.folded.shape[-1]
        slots = torch.arange(length)
        ranking = self.method.rank(slots, _padded(entry.folded, length))
        protected = (slots < protected_head) | (slots >= length - protected_tail)
        return max(self.method.attention_need(head, protected, coverage) for head in ranking.reshape(-1, length))

    def keep(self, request_id: str, keep_index: torch.Tensor, physical: int) -> None:
        """After a compaction: the survivors' scores move to slots ``[0, k)`` with them
        (``keep_index`` ``[k]``, or ``[kv_heads, k]``: each head's own survivors)."""
        entry = self._requests.get(request_id)
        if entry is None:
            return
        device = entry.folded.device
        entry.folded = take_slots(_padded(entry.folded, physical), keep_index.long()).to(device)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
