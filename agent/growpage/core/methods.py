"""KV methods: GrowPage, the fixed-budget methods it is compared against, and its ablations.

A method is what happens at a page boundary (a pure decision over :class:`BoundaryState`) plus how
an eviction ranks tokens. Every method runs in the same manager over the same pages, so a benchmark
compares policies and nothing else. ``base_pages`` is the per-request budget of the fixed-budget
methods (their cap) and GrowPage's admission grant.

=================  =============================================================================
full_kv            vLLM paging: grow while the pool has a page, else preempt; no reservation
streaming_llm      cap; evict the oldest tokens (attention sinks and the recent window kept)
h2o                cap; evict the lowest accumulated attention (heavy hitters kept)
snapkv             cap; evict the lowest attention of a recent observation window (~32 steps,
                   exponential), max-pooled over 7 neighbours (SnapKV's clustering)
zipage             cap in pages; at the cap compress a quarter of it in one event (amortised,
                   Zipage's Compressed PagedAttention) with SnapKV-style scores
uniform_int8/int4  no cap; quantize every full page outside the sinks and the recent window as
                   soon as there are enough (KIVI-style FP16 residual window), else grow
growpage           the growth contract (:func:`growpage.core.policy.decide`), admitted on demand like
                   vLLM: compression under pool pressure, not preemption, catches a full pool, and
                   ``base_pages`` is the floor that protects a running request
growpage_reserving the same contract with reserving admission (``base_pages`` reserved per request
                   at admission: never over-committed, fewer requests running)
ablations          growpage without STS (density read as 0), without LTS (entropy read as the
                   grow threshold), without quantization, a random feasible action (all of them
                   still relieve pool pressure), without the pressure input (no compression of
                   other requests before the engine preempts), with the published thresholds
                   instead of calibrated ones, and with scores from 10 observed layers, not 3
=================  =============================================================================

Simplifications, stated: scores come from GrowPage's observed layers (3 of 30, newest query), not
every layer's full attention; R-KV's redundancy term is not modelled; quantization is GrowPage's
per-token-group scheme, not KIVI's per-channel keys.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Callable, Mapping
from typing import Any

from growpage.config import GrowPageConfig
from growpage.core.policy import Action, BoundaryState, Decision, Reason, Refusal, allocation_refusal, decide

DecideFn = Callable[[BoundaryState, GrowPageConfig], Decision]


# PROMPT_ANCHORED: the prompt's observation (its last query's attention) counts as this many decode
# steps' (see growpage.vllm_plugin.token_scores)
PROMPT_PRIOR_STEPS = 32


class TokenScore(str, enum.Enum):
    """What an eviction ranks tokens by (lowest goes first)."""

    ACCUMULATED = "accumulated"  # attention mass summed over the request's life (H2O)
    WINDOW = "window"  # attention mass of the last ~``score_window_steps`` steps (SnapKV)
    RECENCY = "recency"  # position: the oldest goes first (StreamingLLM)
    # the prompt's observation weighted as a prior of PROMPT_PRIOR_STEPS decode steps' (GrowPage's,
    # in both homes: growpage.vllm_plugin.token_scores says why)
    PROMPT_ANCHORED = "prompt_anchored"
    RANDOM = "random"


# the kinds that rank by observed attention (what an attention need can be counted from)
SCORED_TOKEN_SCORES = (TokenScore.ACCUMULATED, TokenScore.WINDOW, TokenScore.PROMPT_ANCHORED)


@dataclasses.dataclass(frozen=True)
class KVMethod:
    """One way of managing a request's KV at its page boundaries.

    Attributes:
        name: identifier used by benchmarks and plots.
        family: full | fixed_budget | quantization | growpage | ablation.
        decide: pure decision at a boundary.
        token_score: how eviction ranks tokens.
        score_window_steps: for WINDOW scores, the time constant of the exponential window.
        pool_kernel: max-pool width over neighbouring positions before ranking (1 = none).
        evict_to_budget: an eviction frees pages down to ``base_pages - 1`` (so the new page is the
            budget's last), rather than the fewest pages that make room.
        evict_fraction: with ``evict_to_budget``, free at least this fraction of the budget per
            event (Zipage's amortised compression); 0 frees just enough.
        compress_prompt: once the prompt is cached, evict it down to the budget (SnapKV compresses
            after prefill; without this a long prompt would stay whole until its first boundary).
        compress_prompt_for_admission: once the prompt is cached, evict it down to its floor (its
            attention need included) only when a waiting request cannot be admitted this step
            (GrowPage: compress when it widens the batch, else keep the prompt whole).
        reserve_base_pages: admission reserves ``base_pages`` per request (the reserving variant);
            False allocates on demand from the prompt's pages, as vLLM does (GrowPage's default
            and every baseline: the systems they model run on vLLM's allocator).
        config_overrides: GrowPageConfig fields the method fixes (e.g. quantization bits).
        relieves_pressure: before the engine preempts, compress other running requests (lowest LTS
            first, never below their floor); GrowPage and its ablations do, baselines do not.
        quantizes_under_pressure: relief quantizes a request's oldest full pages before it evicts
            (no token lost); False for the no-quantization ablation.
    """

    name: str
    family: str
    decide: DecideFn
    token_score: TokenScore = TokenScore.ACCUMULATED
    score_window_steps: int = 32
    pool_kernel: int = 1
    evict_to_budget: bool = False
    evict_fraction: float = 0.0
    compress_prompt: bool = False
    compress_prompt_for_admission: bool = False
    reserve_base_pages: bool = False
    config_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    relieves_pressure: bool = False
    quantizes_under_pressure: bool = True

    @property
    def score_decay(self) -> float:
        """Per-step decay of token scores (1.0 = plain accumulation)."""
        if self.token_score is TokenScore.WINDOW:
            return 1.0 - 1.0 / self.score_window_steps
        return 1.0

    def attention_coverage(self, config: GrowPageConfig) -> float:
        """The share of observed attention this method's floors keep: ``config``'s for GrowPage's
        scored methods and its ablations (each removes one other piece, not the floor), 0 for the
        rest (a fixed cap is a cap)."""
        follows = self.family in ("growpage", "ablation") and self.token_score in SCORED_TOKEN_SCORES
        return config.attention_coverage if follows else 0.0

    def configure(self, config: GrowPageConfig) -> GrowPageConfig:
        """``config`` with this method's fixed fields applied."""
        return dataclasses.replace(config, **self.config_overrides) if self.config_overrides else config

    def pages_to_free(self, pages_held: int, base_pages: int, evict_min_pages: int) -> int:
        """Pages one eviction must free at a boundary."""
        if not self.evict_to_budget:
            return evict_min_pages
        to_budget = pages_held - base_pages + 1
        amortised = round(self.evict_fraction * base_pages)
        return max(evict_min_pages, to_budget, amortised)


# ---- pure decisions -------------------------------------------------------------------------------
def _grow_or_preempt(state: BoundaryState, reason: Reason) -> Decision:
    refusal = allocation_refusal(state, use_reserve=True)  # baselines do not yield to admission
    if refusal is None:
        return Decision(Action.ALLOCATE, reason)
    if refusal is Refusal.THROTTLED:
        return Decision(Action.DEFER, reason, refusal)
    return Decision(Action.PREEMPT, reason, refusal)


def full_kv_decide(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Always grow; preempt when the pool is empty (the growth throttle does not apply)."""
    if state.pool_free_pages < 1:
        return Decision(Action.PREEMPT, Reason.NO_BUDGET, Refusal.DENIED)
    return Decision(Action.ALLOCATE, Reason.NO_BUDGET)


def fixed_budget_decide(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Grow below the budget; at it, evict. A request with nothing evictable (everything
    protected) grows rather than stalls."""
    if state.pages_held < state.base_pages:
        return _grow_or_preempt(dataclasses.replace(state, growth_budget_pages=1.0), Reason.WITHIN_BOUNDARY)
    if state.can_evict:
        return Decision(Action.EVICT, Reason.BUDGET_REACHED)
    return _grow_or_preempt(dataclasses.replace(state, growth_budget_pages=1.0), Reason.NOTHING_TO_COMPRESS)


def uniform_quantization_decide(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Quantize whenever enough full pages have left the recent window; else grow."""
    if state.can_quantize:
        return Decision(Action.QUANTIZE, Reason.UNIFORM_QUANTIZATION)
    return _grow_or_preempt(dataclasses.replace(state, growth_budget_pages=1.0), Reason.UNIFORM_QUANTIZATION)


def without_sts(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Ablation: no short-term histogram; density reads as 0 so LTS alone picks grow vs evict."""
    return decide(dataclasses.replace(state, sts_density=0.0), config)


def without_lts(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Ablation: no long-term entropy; it reads as the grow threshold for every request, so the
    capacity boundary is the same for all and past it STS picks quantize vs evict."""
    return decide(dataclasses.replace(state, lts_entropy=config.lts_grow_threshold), config)


def without_quantization(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """Ablation: the contract with quantization unavailable (evict or grow only)."""
    return decide(dataclasses.replace(state, can_quantize=False), config)


def when_it_pays(state: BoundaryState, config: GrowPageConfig) -> Decision:
    """The contract, compressing only when it pays: with nothing waiting for admission and room in
    the pool, a request grows (full KV's quality while memory is free); under pressure, or with a
    request waiting, the contract's compression applies (it avoids a preemption or widens the batch)."""
    decision = decide(state, config)
    if (state.compression_pays or decision.action not in (Action.EVICT, Action.QUANTIZE)
            or allocation_refusal(state) is not None):
        return decision
    return Decision(Action.ALLOCATE, Reason.NO_PRESSURE)


def random_decide(rng: random.Random) -> DecideFn:
    """Ablation: a feasible action drawn uniformly; the same fallbacks as the contract when none is."""

    def choose(state: BoundaryState, config: GrowPageConfig) -> Decision:
        feasible = []
        if allocation_refusal(state, use_reserve=True) is None:
            feasible.append(Action.ALLOCATE)
        if state.can_quantize:
            feasible.append(Action.QUANTIZE)
        if state.can_evict:
            feasible.append(Action.EVICT)
        if feasible:
            return Decision(rng.choice(feasible), Reason.RANDOM_CHOICE)
        return _grow_or_preempt(state, Reason.RANDOM_CHOICE)

    return choose


def _growpage(name: str, family: str, decide_fn: DecideFn, relieves_pressure: bool = True, **fields: Any) -> KVMethod:
    """GrowPage's contract (or an ablation of it), ranking tokens as GrowPage does."""
    return KVMethod(name=name, family=family, decide=decide_fn, relieves_pressure=relieves_pressure,
                    token_score=TokenScore.PROMPT_ANCHORED, compress_prompt_for_admission=True, **fields)


def build_method(name: str, seed: int = 0) -> KVMethod:
    """The method called ``name`` (see :data:`METHOD_NAMES`); ``seed`` drives random choices."""
    window: dict[str, Any] = dict(token_score=TokenScore.WINDOW, pool_kernel=7)
    # fixed caps get GrowPage's admission and pressure relief (lowest LTS first, down to the floor),
    # so a comparison measures the boundary policy, not a missing relief valve; they relieve by
    # eviction, as their papers compress
    capped: dict[str, Any] = dict(evict_to_budget=True, compress_prompt=True, relieves_pressure=True,
                                  quantizes_under_pressure=False)
    builders: dict[str, Callable[[], KVMethod]] = {
        "full_kv": lambda: KVMethod("full_kv", "full", full_kv_decide),
        "streaming_llm": lambda: KVMethod("streaming_llm", "fixed_budget", fixed_budget_decide,
                                          token_score=TokenScore.RECENCY, **capped),
        "h2o": lambda: KVMethod("h2o", "fixed_budget", fixed_budget_decide, **capped),
        "snapkv": lambda: KVMethod("snapkv", "fixed_budget", fixed_budget_decide, **window, **capped),
        "zipage": lambda: KVMethod("zipage", "fixed_budget", fixed_budget_decide, evict_fraction=0.25,
                                   **window, **capped),
        "uniform_int8": lambda: KVMethod("uniform_int8", "quantization", uniform_quantization_decide,
                                         config_overrides={"quantization_bits": 8}),
        "uniform_int4": lambda: KVMethod("uniform_int4", "quantization", uniform_quantization_decide,
                                         config_overrides={"quantization_bits": 4}),
        "growpage": lambda: _growpage("growpage", "growpage", decide),
        "growpage_reserving": lambda: _growpage("growpage_reserving", "growpage", decide, reserve_base_pages=True),
        "growpage_when_it_pays": lambda: _growpage("growpage_when_it_pays", "growpage", when_it_pays),
        "growpage_no_sts": lambda: _growpage("growpage_no_sts", "ablation", without_sts),
        "growpage_no_lts": lambda: _growpage("growpage_no_lts", "ablation", without_lts),
        "growpage_no_quant": lambda: dataclasses.replace(
            _growpage("growpage_no_quant", "ablation", without_quantization), quantizes_under_pressure=False),
        "growpage_random": lambda: KVMethod("growpage_random", "ablation", random_decide(random.Random(seed)),
                                            token_score=TokenScore.ACCUMULATED, relieves_pressure=True),
        "growpage_no_pressure": lambda: _growpage("growpage_no_pressure", "ablation", decide, relieves_pressure=False),
        # scores from 10 observed layers instead of 3: measures whether more layers pay for their cost
        "growpage_10_layers": lambda: _growpage("growpage_10_layers", "ablation", decide,
                                                config_overrides={"observed_layers": 10}),
        # the published defaults, whatever a calibrated config says (benchmarks run calibrated)
        "growpage_uncalibrated": lambda: _growpage("growpage_uncalibrated", "ablation", decide,
                                                   config_overrides=PUBLISHED_THRESHOLDS),
    }
    if name not in builders:
        raise ValueError(f"unknown KV method {name!r}; choose one of: {', '.join(METHOD_NAMES)}")
    return builders[name]()


METHOD_NAMES = ("full_kv", "streaming_llm", "h2o", "snapkv", "zipage", "uniform_int8", "uniform_int4",
                "growpage", "growpage_when_it_pays", "growpage_reserving", "growpage_no_sts", "growpage_no_lts",
                "growpage_no_quant", "growpage_random", "growpage_no_pressure", "growpage_uncalibrated",
                "growpage_10_layers")

# The contract's thresholds as published (for another model): GrowPageConfig's defaults.
PUBLISHED_THRESHOLDS: Mapping[str, Any] = {
    name: GrowPageConfig.__dataclass_fields__[name].default
    for name in ("density_threshold", "lts_grow_threshold", "rollout_entropy_threshold")}

GROWPAGE = build_method("growpage")
