"""Which tokens an eviction drops: H2O-style accumulated attention, with protected tokens.

Pure functions over one request's token group (tokens of one storage format, in chronological
order). Protected, never dropped: the first ``sink_tokens`` positions of the request (attention
sinks, StreamingLLM) and the newest ``recent_window_tokens`` positions.
"""

from __future__ import annotations

import math

import torch


def tokens_to_drop(num_tokens: int, tokens_per_page: int, pages_to_free: int) -> int:
    """Fewest tokens to drop from a compacted group so it occupies ``pages_to_free`` fewer pages."""
    pages_now = math.ceil(num_tokens / tokens_per_page)
    target_pages = max(pages_now - pages_to_free, 0)
    return max(num_tokens - target_pages * tokens_per_page, 0)


def protected_mask(positions: torch.Tensor, logical_length: int, sink_tokens: int,
                   recent_window_tokens: int) -> torch.Tensor:
    """``[N]`` bool: tokens at sink positions or inside the recent window."""
    return (positions < sink_tokens) | (positions >= logical_length - recent_window_tokens)


def select_keep(positions: torch.Tensor, scores: torch.Tensor, num_to_drop: int, logical_length: int,
                sink_tokens: int, recent_window_tokens: int) -> torch.Tensor | None:
    """Choose the survivors of an eviction.

    Args:
        positions: ``[N]`` logical positions of the group's tokens.
        scores: ``[N]`` accumulated attention mass (higher = more useful).
        num_to_drop: tokens to drop.

    Returns:
        ``[N]`` bool keep-mask with exactly ``num_to_drop`` False entries, the lowest-scored
        unprotected tokens (ties: the older token goes first); None when fewer than
        ``num_to_drop`` tokens are unprotected.
    """
    protected = protected_mask(positions, logical_length, sink_tokens, recent_window_tokens)
    num_candidates = int((~protected).sum())
    if num_to_drop > num_candidates:
        return None
    keep = torch.ones_like(protected)
    if num_to_drop == 0:
        return keep
    # Protected tokens rank last; among equal scores the older (smaller position) is dropped first.
    ranked = torch.where(protected, torch.full_like(scores, math.inf), scores.float())
    order = torch.argsort(positions, stable=True)
    by_score = order[torch.argsort(ranked[order], stable=True)]
    keep[by_score[:num_to_drop]] = False
    return keep


def tokens_for_coverage(scores: torch.Tensor, protected: torch.Tensor, coverage: float) -> int:
    """How many of a request's tokens its observed attention needs: every protected token (sinks,
    the recent window: always kept), plus the fewest others whose scores hold ``coverage`` of the
    others' score mass, highest first. The protected tokens' mass is left out: a small model puts
    most of its attention on the first token, so a share of the total would count a handful of
    tokens as enough. The one rule both homes floor a request by (``attention_coverage``).

    Args:
        scores: ``[N]`` each token's ranking score (higher: kept first).
        protected: ``[N]`` bool, tokens a compaction never drops.
        coverage: the share of the unprotected tokens' score mass to keep, in ``[0, 1]``.
    """
    others = scores[~protected].float()
    kept = int(protected.sum())
    total = float(others.sum())
    if total <= 0.0 or others.numel() == 0:
        return kept
    cumulative = others.sort(descending=True).values.cumsum(0)
    return kept + min(others.numel(), int((cumulative < coverage * total).sum()) + 1)


def max_pool_scores(positions: torch.Tensor, scores: torch.Tensor, kernel: int) -> torch.Tensor:
    """SnapKV's clustering: each token takes the highest score among its ``kernel`` nearest
    neighbours in position order, so a kept heavy hitter keeps its context with it.

    Returns scores in the input order; ``kernel <= 1`` returns them unchanged. ``scores`` may be
    ``[heads, N]`` (each row pooled on its own, ``positions`` ``[N]`` or ``[heads, N]``).
    """
    if kernel <= 1 or scores.numel() == 0:
        return scores
    if scores.dim() == 2:
        rows = positions.expand_as(scores)
        return torch.stack([max_pool_scores(rows[row], scores[row], kernel) for row in range(scores.shape[0])])
    order = torch.argsort(positions, stable=True)
    in_order = scores.float()[order][None, None, :]
    pooled = torch.nn.functional.max_pool1d(in_order, kernel_size=kernel, stride=1, padding=kernel // 2)
    pooled = pooled[0, 0, :scores.numel()]
    result = torch.empty_like(pooled)
    result[order] = pooled
    return result
