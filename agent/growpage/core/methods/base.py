"""A KV method as one object: the hooks both homes call, and the registry that names them.

A method answers three questions, and both homes (the reference engine's manager, and the vLLM
plugin's scheduler and workers) ask them through the same hooks:

- **What it scores.** Each observed step folds the newest query's attention into per-token scores:
  ``scores <- step_decay * scores + observation_weight(kind) * attention``. ``kind`` says whether
  the step ended the prompt, was an earlier prompt chunk, or decoded a token; :meth:`rank` turns the
  scores into the ranking a compaction keeps the highest of (max-pooled over neighbours for SnapKV,
  positions for StreamingLLM).
- **What it keeps at a budget.** :meth:`survivors` picks the slots that stay from one ranking with
  the protected tokens (sinks, the recent window, a shared prefix) always kept;
  :meth:`attention_need` is how many tokens the ranking says the request needs (GrowPage's floor).
- **What it decides at a boundary.** :meth:`decide`, a pure function of :class:`BoundaryState`,
  and :meth:`pages_to_free` when it evicts.

The fields say how the method meets the engine around it (admission, pressure relief, prompt
compression). A new method is a subclass, or an instance with other fields, in one file, plus one
:func:`register` call (NVIDIA kvpress's presses are the model).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from growpage.config import GrowPageConfig
from growpage.core.evict import max_pool_scores, select_keep, tokens_for_coverage
from growpage.core.policy import Action, BoundaryState, Decision, Reason, Refusal, allocation_refusal


class Observation(str, enum.Enum):
    """Which step an attention observation came from (its weight in the scores is the method's)."""

    PROMPT_CHUNK = "prompt_chunk"  # a prefill chunk that does not end the prompt
    PROMPT_END = "prompt_end"  # the step that ends the prompt: its last query is the question's
    DECODE = "decode"  # a generated token's step


def observation_kind(prompt_tokens: int, length_before: int, num_tokens: int) -> Observation:
    """The kind of a step that took a request from ``length_before`` to ``length_before + num_tokens``."""
    if length_before + num_tokens < prompt_tokens:
        return Observation.PROMPT_CHUNK
    return Observation.PROMPT_END if length_before < prompt_tokens else Observation.DECODE


@dataclasses.dataclass(frozen=True)
class Protection:
    """The tokens no compaction drops: the first ``sink_tokens`` positions (attention sinks), the
    newest ``recent_window_tokens`` of ``logical_length``, and ``shared_prefix_tokens`` leading
    slots in blocks other requests share (kept in place)."""

    logical_length: int
    sink_tokens: int
    recent_window_tokens: int
    shared_prefix_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class KVMethod:
    """One way of managing a request's KV at its page boundaries (see the module docstring).

    Attributes:
        name: identifier used by settings, benchmarks and plots.
        family: full | fixed_budget | quantization | growpage | ablation.
        prompt_weight: what the observation that ends the prompt weighs in the scores.
        prompt_chunk_weight: what an earlier prompt chunk's observation weighs.
        step_decay: the factor every score fades by per observed step (1: plain accumulation; SnapKV's
            window of ~32 steps is ``1 - 1/32``; 0 keeps only the newest observation).
        pool_kernel: max-pool width over neighbouring positions before ranking (1 = none).
        evict_to_budget: an eviction frees pages down to ``base_pages - 1`` (so the new page is the
            budget's last), rather than the fewest pages that make room.
        evict_fraction: with ``evict_to_budget``, free at least this fraction of the budget per
            event (Zipage's amortised compression); 0 frees just enough.
        compress_prompt: once the prompt is cached, evict it down to the budget (SnapKV compresses
            after prefill; without this a long prompt would stay whole until its first boundary).
        compress_prompt_for_admission: once the prompt is cached, evict it down to its floor (its
            attention need included) only when a waiting request cannot be admitted this step.
        reserve_base_pages: admission reserves ``base_pages`` per request; False allocates on demand
            from the prompt's pages, as vLLM does.
        config_overrides: GrowPageConfig fields the method fixes (e.g. quantization bits).
        relieves_pressure: before the engine preempts, compress other running requests (lowest LTS
            first, never below their floor).
        quantizes_under_pressure: relief quantizes a request's oldest full pages before it evicts.
        follows_attention: the method's floor keeps ``attention_coverage`` of the observed attention
            (GrowPage and its ablations); a fixed cap is a cap.
        idles_unpaid: the method's boundaries honour ``BoundaryState.compression_idle`` (GrowPage's
            own methods): a home may leave decode-time compression idle while it buys nothing
            (:mod:`growpage.core.compression_gate`); baselines and ablations always compress as decided.
        in_vllm: the vLLM plugin runs it (``method`` setting); the rest need the reference engine's
            quantized pages or reservations.
    """

    name: str
    family: str = "full"
    prompt_weight: float = 1.0
    prompt_chunk_weight: float = 1.0
    step_decay: float = 1.0
    pool_kernel: int = 1
    evict_to_budget: bool = False
    evict_fraction: float = 0.0
    compress_prompt: bool = False
    compress_prompt_for_admission: bool = False
    reserve_base_pages: bool = False
    config_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    relieves_pressure: bool = False
    quantizes_under_pressure: bool = True
    follows_attention: bool = False
    idles_unpaid: bool = False
    in_vllm: bool = False

    # ---- what it scores ---------------------------------------------------------------------------
    @property
    def uses_attention(self) -> bool:
        """Whether :meth:`rank` reads the scores (False: observations need not be kept)."""
        return True

    def observation_weight(self, kind: Observation) -> float:
        """What an observation of ``kind`` weighs in the scores."""
        if kind is Observation.PROMPT_END:
            return self.prompt_weight
        return self.prompt_chunk_weight if kind is Observation.PROMPT_CHUNK else 1.0

    def rank(self, positions: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The ranking a compaction keeps the highest of, from ``[N]`` (or ``[heads, N]``) scores."""
        return max_pool_scores(positions, scores, self.pool_kernel)

    # ---- what it keeps at a budget ----------------------------------------------------------------
    def survivors(self, positions: torch.Tensor, ranking: torch.Tensor | None, num_keep: int,
                  protection: Protection) -> torch.Tensor | None:
        """``[num_keep]`` ascending slot indices that stay, of ``[P]`` slots at ``positions``: the
        protected ones and the highest-ranked of the rest (ties: the newer stays); with no ranking
        (nothing observed), the newest. None when the protected tokens alone exceed ``num_keep``."""
        physical = positions.numel()
        if ranking is None or ranking.numel() < physical:
            ranked = positions.float()
        else:
            ranked = ranking[:physical].float().clone()
        if protection.shared_prefix_tokens:
            ranked[:protection.shared_prefix_tokens] = math.inf
        keep = select_keep(positions, ranked, physical - num_keep, protection.logical_length,
                           protection.sink_tokens, protection.recent_window_tokens)
        return None if keep is None else keep.nonzero().flatten()

    def attention_need(self, ranking: torch.Tensor, protected: torch.Tensor, coverage: float) -> int:
        """How many of ``[N]`` ranked tokens the request's attention needs at ``coverage``."""
        return tokens_for_coverage(ranking, protected, coverage)

    def attention_coverage(self, config: GrowPageConfig) -> float:
        """The share of observed attention this method's floors keep (0: none, a cap is a cap)."""
        return config.attention_coverage if self.follows_attention and self.uses_attention else 0.0

    # ---- what it decides at a boundary ------------------------------------------------------------
    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        """vLLM's paging: always grow; preempt when the pool is empty (no growth throttle)."""
        if state.pool_free_pages < 1:
            return Decision(Action.PREEMPT, Reason.NO_BUDGET, Refusal.DENIED)
        return Decision(Action.ALLOCATE, Reason.NO_BUDGET)

    def pages_to_free(self, pages_held: int, base_pages: int, evict_min_pages: int) -> int:
        """Pages one eviction must free at a boundary."""
        if not self.evict_to_budget:
            return evict_min_pages
        to_budget = pages_held - base_pages + 1
        amortised = round(self.evict_fraction * base_pages)
        return max(evict_min_pages, to_budget, amortised)

    def configure(self, config: GrowPageConfig) -> GrowPageConfig:
        """``config`` with this method's fixed fields applied."""
        return dataclasses.replace(config, **self.config_overrides) if self.config_overrides else config


def grow_or_preempt(state: BoundaryState, reason: Reason) -> Decision:
    """Grow, or preempt when the pool cannot give a page (baselines do not yield to admission)."""
    refusal = allocation_refusal(state, use_reserve=True)
    if refusal is None:
        return Decision(Action.ALLOCATE, reason)
    if refusal is Refusal.THROTTLED:
        return Decision(Action.DEFER, reason, refusal)
    return Decision(Action.PREEMPT, reason, refusal)


# ---- the registry ---------------------------------------------------------------------------------
MethodFactory = Callable[[int], KVMethod]
_REGISTRY: dict[str, MethodFactory] = {}


def register(name: str, factory: MethodFactory) -> None:
    """Name a method: ``factory(seed)`` builds it (``seed`` drives a method's random choices)."""
    if name in _REGISTRY:
        raise ValueError(f"KV method {name!r} is registered twice")
    _REGISTRY[name] = factory


# how listings order the methods: vLLM's paging, then the baselines, then GrowPage and its ablations
FAMILIES = ("full", "fixed_budget", "quantization", "growpage", "ablation")


def registered() -> tuple[str, ...]:
    """Every registered method's name, by family (:data:`FAMILIES`), then in registration order."""
    return tuple(sorted(_REGISTRY, key=lambda name: FAMILIES.index(build_method(name).family)))


def build_method(name: str, seed: int = 0) -> KVMethod:
    """The method called ``name``; ``seed`` drives random choices."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown KV method {name!r}; choose one of: {', '.join(_REGISTRY)}")
    method = factory(seed)
    assert method.name == name, f"{name!r} builds a method named {method.name!r}"
    return method
