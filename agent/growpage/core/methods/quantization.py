"""Uniform quantization (KIVI-style FP16 residual window): no cap; every full page outside the
sinks and the recent window is quantized as soon as there are enough, else the request grows.
Reference engine only (vLLM's cache holds one dtype). Quantization is GrowPage's per-token-group
scheme, not KIVI's per-channel keys."""

from __future__ import annotations

import dataclasses

from growpage.config import GrowPageConfig
from growpage.core.methods.base import KVMethod, grow_or_preempt, register
from growpage.core.policy import Action, BoundaryState, Decision, Reason


@dataclasses.dataclass(frozen=True)
class UniformQuantization(KVMethod):
    """Quantize whenever enough full pages have left the recent window; else grow."""

    family: str = "quantization"

    def decide(self, state: BoundaryState, config: GrowPageConfig) -> Decision:
        if state.can_quantize:
            return Decision(Action.QUANTIZE, Reason.UNIFORM_QUANTIZATION)
        return grow_or_preempt(dataclasses.replace(state, growth_budget_pages=1.0), Reason.UNIFORM_QUANTIZATION)


register("uniform_int8", lambda seed: UniformQuantization("uniform_int8", config_overrides={"quantization_bits": 8}))
register("uniform_int4", lambda seed: UniformQuantization("uniform_int4", config_overrides={"quantization_bits": 4}))
