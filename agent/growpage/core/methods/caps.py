"""The fixed caps GrowPage is compared against: a per-request budget of ``base_pages``, and at it
an eviction of the lowest-ranked tokens.

=================  =============================================================================
streaming_llm      evict the oldest tokens (attention sinks and the recent window kept)
h2o                evict the lowest accumulated attention (heavy hitters kept)
snapkv             evict the lowest attention of a recent observation window (~32 steps,
                   exponential), max-pooled over 7 neighbours (SnapKV's clustering)
zipage             cap in pages; at the cap compress a quarter of it in one event (amortised,
                   Zipage's Compressed PagedAttention) with SnapKV-style scores
=================  =============================================================================

Each gets GrowPage's admission and pressure relief (lowest LTS first, down to the floor), so a
comparison measures the boundary policy, not a missing relief valve; they relieve by eviction, as
their papers compress, and compress a cached prompt to the cap (SnapKV's prefill compression).

Simplifications, stated: scores come from GrowPage's observed layers (3 of 30, newest query), not
every layer's full attention; R-KV's redundancy term is the plugin's ``redundancy_weight`` setting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from growpage.config import GrowPageConfig
from growpage.core.methods.base import KVMethod, grow_or_preempt, register
from growpage.core.policy import Action, BoundaryState, Decision, Reason


@dataclasses.dataclass(frozen=True)
class FixedCap(KVMethod):
    """Grow below the budget; at it, evict (H2O's ranking: accumulated attention)."""

    family: str = "fixed_budget"
    evict_to_budget: bool = True
    compress_prompt: bool = True
    relieves_pressure: bool = True
    quantizes_under_pressure: bool = False

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        """A request with nothing evictable (everything protected) grows rather than stalls."""
        unthrottled = dataclasses.replace(state, growth_budget_pages=1.0)
        if state.pages_held < state.base_pages:
            return grow_or_preempt(unthrottled, Reason.WITHIN_BOUNDARY)
        if state.can_evict:
            return Decision(Action.EVICT, Reason.BUDGET_REACHED)
        return grow_or_preempt(unthrottled, Reason.NOTHING_TO_COMPRESS)


@dataclasses.dataclass(frozen=True)
class StreamingLLM(FixedCap):
    """Attention sinks plus the most recent tokens: ranks by position, observes nothing."""

    @property
    def uses_attention(self) -> bool:
        return False

    def rank(self, positions: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return positions.float()


# SnapKV's observation window (about this many steps, exponential) and its clustering (max-pool width)
SNAPKV_WINDOW_STEPS = 32
SNAPKV_POOL_KERNEL = 7


def windowed(name: str, **fields: Any) -> FixedCap:
    """A cap that ranks by SnapKV's pooled window of recent attention."""
    return FixedCap(name, step_decay=1.0 - 1.0 / SNAPKV_WINDOW_STEPS, pool_kernel=SNAPKV_POOL_KERNEL, **fields)


register("streaming_llm", lambda seed: StreamingLLM("streaming_llm", in_vllm=True))
register("h2o", lambda seed: FixedCap("h2o", in_vllm=True))
register("snapkv", lambda seed: windowed("snapkv", in_vllm=True))
register("zipage", lambda seed: windowed("zipage", evict_fraction=0.25))
