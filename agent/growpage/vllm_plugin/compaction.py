"""A compaction's arithmetic without vLLM: physical/logical accounting, what tokens rank by, keep sets.

This module owns how a worker's compaction ranks a request's tokens (:class:`TokenScores`), chooses
the survivors (:func:`choose_keep`, or :func:`recency_keep` after a failure) and addresses them in
the cache (:func:`slot_positions`, :func:`physical_slots`). How the survivors' moves are cut into
chunks is :mod:`~growpage.vllm_plugin.keys`'s, beside the moves: it loads with torch alone (the
torch-only GPU checks run it), where this module reaches the configuration through the methods.

Enforcement inside vLLM keeps two lengths per request. The *logical* length is vLLM's own
``num_computed_tokens``: it drives RoPE positions, token ids, ``max_model_len`` and stop checks, and
GrowPage never changes it. The *physical* length is how many tokens the request's blocks hold:
``physical = logical - dropped``, where ``dropped`` counts the tokens evicted so far. Allocation,
``seq_lens`` and ``slot_mapping`` use the physical length (see :mod:`~growpage.vllm_plugin.scheduler_requests`).

After a compaction the request's physical slots ``[0, kept)`` hold the survivors in logical order,
and every token written since sits at ``physical = logical - dropped``. So the logical position of
each physical slot follows from ``kept_positions`` (the survivors' positions) and ``dropped``
(:func:`slot_positions`).

What tokens rank by: the observer hands over one observation per observed step and enforced
request: ``[P]`` attention mass per physical slot (the mean over sampled heads, summed over observed
layers), or with per-head keep sets ``[kv_heads, P]`` (each KV head's own). The first one after a
request is admitted (or restarted) is its prompt's: the step that ends the prompt, scored by the
prompt's last query (or its observation window); the rest are decode steps'. How observations
combine, and what ranks the tokens, is the method's, through the hooks the reference engine calls
too (:class:`~growpage.core.methods.KVMethod`): each observation folds in as
``scores <- step_decay * scores + observation_weight(kind) * attention`` and a compaction ranks by
``method.rank`` (H2O's sum, SnapKV's pooled window, TOVA's newest observation, GrowPage's
prompt-anchored sum; StreamingLLM observes nothing and keeps the newest). Scores stay on the
attention's device (no host copy per step); a compaction reads them once.

Keep sets are one per request (``[kept]``: every KV head keeps the same tokens) or one per KV head
(``[kv_heads, kept]``: H2O's and SnapKV's per-head selection). Per head, slot ``j`` of head ``h``
holds the token ``kept_positions[h, j]``: heads keep the same *number* of tokens (vLLM's block
table and ``seq_lens`` are per request) but not the same tokens. Attention reads each head's keys
with their RoPE already applied, so which slot a key sits in does not change its logit; the
protected tokens (sinks, the recent window, a shared prefix) are kept by every head, in the same
slots. Per head, a share of the budget can be held in common (``shared_fraction``): the tokens the
request as a whole ranks highest (its mean over KV heads) are kept by every head that still holds
them, so a token the answer needs is not lost because one head's few sampled readers missed it.

Protected tokens, never dropped: the request's first ``sink_tokens`` positions, its newest
``recent_window_tokens``, and every token in a leading block shared through the prefix cache
(``ref_cnt > 1``: other requests read it, so it is never rewritten).

Everything here is pure torch over small tensors (tests run it without vLLM).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from growpage.core.evict import protected_mask
from growpage.core.methods import KVMethod, Observation, Protection

# survivors as every method here picks them (the base class's hook), for callers with no method at hand
_ANY_METHOD = KVMethod("any")


def slot_positions(kept_positions: torch.Tensor | None, physical_tokens: int, dropped: int) -> torch.Tensor:
    """``[physical_tokens]`` (or ``[kv_heads, physical_tokens]``) long: the logical position of each
    physical slot.

    Args:
        kept_positions: positions of the survivors of the last compaction (slots ``[0, len)``),
            ``[kept]`` or per KV head ``[kv_heads, kept]``; None when the request was never compacted.
        physical_tokens: tokens in the request's blocks.
        dropped: tokens evicted so far.
    """
    if kept_positions is None or dropped == 0:
        return torch.arange(physical_tokens, dtype=torch.long)
    kept = kept_positions[..., :physical_tokens].long()
    tail = torch.arange(kept.shape[-1], physical_tokens, dtype=torch.long) + dropped
    return torch.cat([kept, tail.expand(*kept.shape[:-1], -1)], dim=-1)


def choose_keep(positions: torch.Tensor, scores: torch.Tensor | None, num_keep: int, logical_length: int,
                shared_prefix_tokens: int, sink_tokens: int, recent_window_tokens: int,
                shared_fraction: float = 0.0, method: KVMethod = _ANY_METHOD) -> torch.Tensor | None:
    """The physical slots that survive a compaction, ascending (so logical order is kept).

    Each kept set is ``method.survivors``: the highest score wins among unprotected tokens; with no
    scores (nothing observed yet) the newest win (StreamingLLM: sinks plus a recent window). Per KV
    head (``scores`` with a head axis), each head ranks its own slots by its own scores.

    Args:
        positions: ``[P]`` or ``[kv_heads, P]`` logical position of each physical slot
            (:func:`slot_positions`).
        scores: ``[P]`` or ``[kv_heads, P]`` ranking per slot, or None.
        num_keep: survivors wanted, ``<= P``.
        logical_length: the request's logical length (for the recent window).
        shared_prefix_tokens: leading physical slots in shared blocks (kept in place).
        shared_fraction: per KV head, the share of the unprotected survivors every head keeps in
            common: the request's highest-ranked tokens by the mean of the heads' scores (a head
            that no longer holds one of them fills its place by its own ranking). 0: each head
            ranks alone; 1: every head keeps the request's ranking where it can.

        method: the method whose ``survivors`` hook picks each kept set.

    Returns:
        ``[num_keep]`` long slot indices (``[kv_heads, num_keep]`` when ``positions`` or ``scores``
        has a head axis), or None when the protected tokens alone exceed ``num_keep``.
    """
    protection = Protection(logical_length, sink_tokens, recent_window_tokens, shared_prefix_tokens)
    per_head = positions.dim() == 2 or (scores is not None and scores.dim() == 2)
    if not per_head:
        return method.survivors(positions, scores, num_keep, protection)
    heads = (scores if scores is not None and scores.dim() == 2 else positions).shape[0]
    head_positions = positions.expand(heads, -1) if positions.dim() == 1 else positions
    head_scores = scores.expand(heads, -1) if scores is not None and scores.dim() == 1 else scores
    if head_scores is not None and shared_fraction > 0.0:
        head_scores = _with_common_tokens(head_positions, head_scores, num_keep, shared_fraction, logical_length,
                                          shared_prefix_tokens, sink_tokens, recent_window_tokens)
    kept = []
    for head in range(heads):
        keep = method.survivors(head_positions[head], None if head_scores is None else head_scores[head], num_keep,
                                protection)
        if keep is None:
            return None
        kept.append(keep)
    return torch.stack(kept)


def _with_common_tokens(positions: torch.Tensor, scores: torch.Tensor, num_keep: int, shared_fraction: float,
                        logical_length: int, shared_prefix_tokens: int, sink_tokens: int,
                        recent_window_tokens: int) -> torch.Tensor:
    """``[kv_heads, P]`` scores with the request's common tokens ranked first (``inf``) in every
    head that holds them (:func:`choose_keep`'s ``shared_fraction``).

    A token's request-level score is the mean over every KV head of its score there (0 where a head
    dropped it), so tokens all heads still hold and value come first. The common quota is a share of
    the survivors left after the protected tokens, which every head holds in the same slots: a head
    keeps at most that many common tokens, so exactly ``num_keep`` survivors stay possible."""
    heads, physical = positions.shape
    scores = scores[:, :physical].float()
    protected = protected_mask(positions[0], logical_length, sink_tokens, recent_window_tokens)
    protected[:shared_prefix_tokens] = True
    quota = int(shared_fraction * max(0, num_keep - int(protected.sum())))
    if quota == 0:
        return scores
    flat = positions.flatten().long()
    length = max(logical_length, int(flat.max()) + 1)
    request = torch.zeros(length, dtype=torch.float32).index_add_(0, flat, scores.flatten()) / heads
    request[positions[0][protected].long()] = -math.inf
    held = torch.zeros(length, dtype=torch.bool)
    held[flat] = True
    request[~held] = -math.inf
    # highest first; among equal scores the newer first, as select_keep drops the older first
    newest_first = torch.arange(length - 1, -1, -1)
    ranked = newest_first[torch.argsort(request.flip(0), descending=True, stable=True)]
    common = torch.zeros(length, dtype=torch.bool)
    common[ranked[:min(quota, int(torch.isfinite(request).sum()))]] = True
    return torch.where(common[positions.long()], torch.full_like(scores, math.inf), scores)


def recency_keep(physical_tokens: int, num_keep: int, leading_tokens: int) -> torch.Tensor:
    """``[num_keep]`` long: the leading ``leading_tokens`` slots, then the newest, ascending.

    The compactor's fallback after a failed compaction (:mod:`~growpage.vllm_plugin.compactor`):
    it needs no scores, no ranking and no :func:`choose_keep`, any of which may be what failed.
    Slots are in logical order in every head and the protected leading tokens (sinks, a shared
    prefix) sit in the same leading slots of every head, so with ``leading_tokens`` =
    ``max(sink_tokens, shared_prefix_tokens)`` this is :func:`choose_keep` without scores
    (StreamingLLM: sinks plus the most recent), whenever the protected tokens fit. Capped at
    ``num_keep``: a shared prefix longer than the survivors stays in place (those blocks are
    never rewritten).
    """
    if not 0 <= num_keep <= physical_tokens or leading_tokens < 0:
        raise ValueError(f"cannot keep {num_keep} of {physical_tokens} tokens, {leading_tokens} leading")
    leading = min(leading_tokens, num_keep)
    return torch.cat([torch.arange(leading, dtype=torch.long),
                      torch.arange(physical_tokens - (num_keep - leading), physical_tokens, dtype=torch.long)])


def take_slots(values: torch.Tensor, keep_index: torch.Tensor) -> torch.Tensor:
    """``values[..., keep_index]`` along the slot axis: ``[k]`` keeps the same slots of every row,
    ``[kv_heads, k]`` each head's own (``values`` ``[P]`` or ``[kv_heads, P]``)."""
    if keep_index.dim() == 1:
        return values[..., keep_index]
    return torch.gather(values.expand(keep_index.shape[0], -1), -1, keep_index)


def physical_slots(block_row: torch.Tensor, indices: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slot ids (``block_id * block_size + offset``) of a request's physical token indices
    (any shape: ``[N]``, or ``[kv_heads, N]`` for per-head keep sets)."""
    indices = indices.long()
    return block_row.long()[indices // block_size] * block_size + indices % block_size


def physical_slot_mapping(positions: torch.Tensor, dropped: int, block_row: torch.Tensor,
                          block_size: int) -> torch.Tensor:
    """Slots for this step's tokens of a compacted request: from ``positions - dropped``."""
    return physical_slots(block_row, positions.long() - dropped, block_size)


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

    def add(self, request_id: str, attention: torch.Tensor, steps: int = 1) -> None:
        """Fold one observation in: the request's first is its prompt's, the rest are decode steps'.

        ``steps``: decode steps the observation stands for (a window of that many steps' queries,
        ``attention`` their mean): it weighs, and its scores fade, as that many observations
        would, so the prompt's prior (``observation_weight``, counted in decode steps) keeps its
        strength whatever share of the steps is scored."""
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
            folded.mul_(self.method.step_decay ** steps)
        folded[..., :length] += attention * (self.method.observation_weight(Observation.DECODE) * steps)
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
