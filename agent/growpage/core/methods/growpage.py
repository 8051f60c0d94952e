"""GrowPage's growth contract as a method, and its ablations.

=====================  =========================================================================
growpage               the growth contract (:func:`growpage.core.policy.decide`), admitted on
                       demand like vLLM: compression under pool pressure, not preemption, catches
                       a full pool, and ``base_pages`` is the floor that protects a request
growpage_reserving     the same with reserving admission (``base_pages`` reserved per request)
growpage_when_it_pays  the contract, compressing only when it pays (a waiting request or pressure)
ablations              without STS (density read as 0), without LTS (entropy read as the grow
                       threshold), without quantization, a random feasible action, without the
                       pressure input, with the published thresholds instead of calibrated ones,
                       and with scores from 10 observed layers, not 3
=====================  =========================================================================

GrowPage ranks tokens *prompt-anchored*: the observation that ends the prompt (its last query is
where the question sits) counts as :data:`PROMPT_PRIOR_STEPS` decode steps, earlier prompt chunks
not at all, every decode step once. Summed as H2O does, the prompt's row is one among every decode
step's, and a compaction a few decode steps after the prefill ranks by what the preamble of the
answer looked at: measured inside vLLM on retrieval under pressure, a digit of the needle then fell
out of the kept set in most requests. Anchored, the question decides while few decode steps have
been seen, and a long decode is ranked by its own attention as evidence accumulates; among
generated tokens (no prompt mass) the order is H2O's.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from growpage.config import GrowPageConfig
from growpage.core.methods.base import KVMethod, grow_or_preempt, register
from growpage.core.policy import Action, BoundaryState, Decision, Reason, allocation_refusal, decide

# the prompt's observation counts as this many decode steps' (the prior's strength)
PROMPT_PRIOR_STEPS = 32


@dataclasses.dataclass(frozen=True)
class GrowPage(KVMethod):
    """The growth contract, prompt-anchored scores, and a floor that follows attention."""

    family: str = "growpage"
    prompt_weight: float = float(PROMPT_PRIOR_STEPS)
    prompt_chunk_weight: float = 0.0
    compress_prompt_for_admission: bool = True
    relieves_pressure: bool = True
    follows_attention: bool = True
    idles_unpaid: bool = True

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        return grow_while_idle(state, grow_with_room_for_all(state, decide(state, config)))


def grow_while_idle(state: BoundaryState, decision: Decision) -> Decision:
    """A compression turned into growth while decode-time compression is idle
    (``state.compression_idle``, :mod:`growpage.core.compression_gate`): it has bought neither a
    wider batch nor a dear recompute lately, so the request grows; with no page free the home
    leaves it to the engine's own preemption, as vLLM alone would."""
    if not state.compression_idle or decision.action not in (Action.EVICT, Action.QUANTIZE):
        return decision
    return Decision(Action.ALLOCATE, Reason.WOULD_NOT_PAY, allocation_refusal(state))


def grow_with_room_for_all(state: BoundaryState, decision: Decision) -> Decision:
    """A compression turned into growth where the pool holds every request at its full length
    (``state.room_for_all``): nothing it frees could buy a preemption avoided or a wider batch, so
    the request keeps full KV's quality at no cost (unless growth is refused: then the contract's
    compression stands)."""
    if (not state.room_for_all or decision.action not in (Action.EVICT, Action.QUANTIZE)
            or allocation_refusal(state) is not None):
        return decision
    return Decision(Action.ALLOCATE, Reason.ROOM_FOR_ALL)


@dataclasses.dataclass(frozen=True)
class WhenItPays(GrowPage):
    """With nothing waiting for admission and room in the pool a request grows (full KV's quality
    while memory is free); under pressure, or with a request waiting, the contract's compression
    applies (it avoids a preemption or widens the batch)."""

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        decision = grow_while_idle(state, grow_with_room_for_all(state, decide(state, config)))
        if (state.compression_pays or decision.action not in (Action.EVICT, Action.QUANTIZE)
                or allocation_refusal(state) is not None):
            return decision
        return Decision(Action.ALLOCATE, Reason.NO_PRESSURE)


@dataclasses.dataclass(frozen=True)
class WithoutSTS(GrowPage):
    """Ablation: no short-term histogram; density reads as 0 so LTS alone picks grow vs evict."""

    family: str = "ablation"
    idles_unpaid: bool = False

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        return decide(dataclasses.replace(state, sts_density=0.0), config)


@dataclasses.dataclass(frozen=True)
class WithoutLTS(GrowPage):
    """Ablation: no long-term entropy; it reads as the grow threshold for every request, so the
    capacity boundary is the same for all and past it STS picks quantize vs evict."""

    family: str = "ablation"
    idles_unpaid: bool = False

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        return decide(dataclasses.replace(state, lts_entropy=config.lts_grow_threshold), config)


@dataclasses.dataclass(frozen=True)
class WithoutQuantization(GrowPage):
    """Ablation: the contract with quantization unavailable (evict or grow only), relief included."""

    family: str = "ablation"
    idles_unpaid: bool = False
    quantizes_under_pressure: bool = False

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        return decide(dataclasses.replace(state, can_quantize=False), config)


@dataclasses.dataclass(frozen=True)
class RandomChoice(GrowPage):
    """Ablation: a feasible action drawn uniformly (the contract's fallbacks when none is), tokens
    ranked by H2O's accumulated attention, no prompt compression for admission."""

    family: str = "ablation"
    idles_unpaid: bool = False
    prompt_weight: float = 1.0
    prompt_chunk_weight: float = 1.0
    compress_prompt_for_admission: bool = False
    rng: random.Random = dataclasses.field(default_factory=random.Random, compare=False, repr=False)

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        feasible = []
        if allocation_refusal(state, use_reserve=True) is None:
            feasible.append(Action.ALLOCATE)
        if state.can_quantize:
            feasible.append(Action.QUANTIZE)
        if state.can_evict:
            feasible.append(Action.EVICT)
        if feasible:
            return Decision(self.rng.choice(feasible), Reason.RANDOM_CHOICE)
        return grow_or_preempt(state, Reason.RANDOM_CHOICE)


# The contract's thresholds as published (for another model): GrowPageConfig's defaults.
PUBLISHED_THRESHOLDS: Mapping[str, Any] = {
    name: GrowPageConfig.__dataclass_fields__[name].default
    for name in ("density_threshold", "lts_grow_threshold", "rollout_entropy_threshold")}

register("growpage", lambda seed: GrowPage("growpage", in_vllm=True))
register("growpage_when_it_pays", lambda seed: WhenItPays("growpage_when_it_pays", in_vllm=True))
register("growpage_reserving", lambda seed: GrowPage("growpage_reserving", reserve_base_pages=True))
register("growpage_no_sts", lambda seed: WithoutSTS("growpage_no_sts"))
register("growpage_no_lts", lambda seed: WithoutLTS("growpage_no_lts"))
register("growpage_no_quant", lambda seed: WithoutQuantization("growpage_no_quant"))
register("growpage_random", lambda seed: RandomChoice("growpage_random", rng=random.Random(seed)))
register("growpage_no_pressure", lambda seed: GrowPage("growpage_no_pressure", family="ablation",
                                                       relieves_pressure=False))
# the published defaults, whatever a calibrated config says (benchmarks run calibrated)
register("growpage_uncalibrated", lambda seed: GrowPage("growpage_uncalibrated", family="ablation",
                                                        config_overrides=PUBLISHED_THRESHOLDS))
# scores from 10 observed layers instead of 3: whether more layers pay for their cost
register("growpage_10_layers", lambda seed: GrowPage("growpage_10_layers", family="ablation",
                                                     config_overrides={"observed_layers": 10}))
