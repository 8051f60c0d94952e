"""Comparison methods: pure decisions at a boundary, and what each does to a request's pages."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from growpage.config import GrowPageConfig
from growpage.core.evict import max_pool_scores
from growpage.core.methods import METHOD_NAMES, VLLM_CAP_NAMES, VLLM_METHOD_NAMES, Observation, build_method
from growpage.core.methods.base import KVMethod, register
from growpage.core.policy import Action, BoundaryState, Reason, Refusal, decide

CONFIG = GrowPageConfig(mode="enforce", base_pages=8)
full_kv_decide = build_method("full_kv").decide
fixed_budget_decide = build_method("h2o").decide
uniform_quantization_decide = build_method("uniform_int8").decide
without_sts = build_method("growpage_no_sts").decide
without_lts = build_method("growpage_no_lts").decide


def state(**overrides) -> BoundaryState:
    base = dict(pages_held=8, base_pages=8, sts_density=0.2, lts_entropy=1.0, pool_free_pages=10,
                growth_budget_pages=5.0, can_quantize=True, can_evict=True)
    return BoundaryState(**{**base, **overrides})


def test_full_kv_grows_until_the_pool_is_empty_then_preempts():
    assert full_kv_decide(state(pages_held=100), CONFIG).action is Action.ALLOCATE
    assert full_kv_decide(state(pool_free_pages=0), CONFIG).action is Action.PREEMPT


def test_fixed_budget_grows_below_the_cap_and_evicts_at_it():
    assert fixed_budget_decide(state(pages_held=5), CONFIG).action is Action.ALLOCATE
    decision = fixed_budget_decide(state(pages_held=8), CONFIG)
    assert (decision.action, decision.reason) == (Action.EVICT, Reason.BUDGET_REACHED)
    # Nothing evictable (all tokens protected): it grows rather than stalls.
    assert fixed_budget_decide(state(pages_held=8, can_evict=False), CONFIG).action is Action.ALLOCATE


def test_uniform_quantization_quantizes_whenever_it_can():
    assert uniform_quantization_decide(state(pages_held=2), CONFIG).action is Action.QUANTIZE
    assert uniform_quantization_decide(state(can_quantize=False), CONFIG).action is Action.ALLOCATE


def test_ablations_replace_one_signal_with_a_constant():
    dense_broad = state(pages_held=20, sts_density=0.9, lts_entropy=3.0)
    assert decide(dense_broad, CONFIG).action is Action.QUANTIZE
    assert without_sts(dense_broad, CONFIG).action is Action.ALLOCATE  # density read as 0: LTS decides
    assert without_lts(dense_broad, CONFIG).action is Action.QUANTIZE  # STS still decides
    sparse_broad = state(pages_held=20, sts_density=0.1, lts_entropy=3.0)
    assert decide(sparse_broad, CONFIG).action is Action.ALLOCATE
    assert without_lts(sparse_broad, CONFIG).action is Action.EVICT  # entropy no longer high


def test_random_ablation_draws_only_feasible_actions_reproducibly():
    choose = build_method("growpage_random", seed=3)
    picks = [choose.decide(state(can_quantize=False), CONFIG).action for _ in range(50)]
    assert set(picks) == {Action.ALLOCATE, Action.EVICT}
    again = build_method("growpage_random", seed=3)
    assert picks == [again.decide(state(can_quantize=False), CONFIG).action for _ in range(50)]


def test_growth_yields_to_admission_but_never_preempts_over_it():
    waiting = state(pages_held=20, lts_entropy=3.0, pool_free_pages=4, admission_reserve_pages=4)
    decision = decide(waiting, CONFIG)
    assert (decision.action, decision.refusal) == (Action.EVICT, Refusal.DENIED)
    stuck = dataclasses.replace(waiting, can_evict=False, can_quantize=False)
    assert decide(stuck, CONFIG).action is Action.ALLOCATE  # takes a reserved page, not preempted


def test_every_named_method_builds_and_unknown_names_are_refused():
    assert [build_method(name).name for name in METHOD_NAMES] == list(METHOD_NAMES)
    with pytest.raises(ValueError, match="choose one of"):
        build_method("lru")


def test_zipage_frees_a_quarter_of_its_budget_per_event():
    zipage, h2o = build_method("zipage"), build_method("h2o")
    assert zipage.pages_to_free(pages_held=16, base_pages=16, evict_min_pages=1) == 4
    assert h2o.pages_to_free(pages_held=16, base_pages=16, evict_min_pages=1) == 1
    assert h2o.pages_to_free(pages_held=40, base_pages=16, evict_min_pages=1) == 25  # back to the budget


def test_max_pool_spreads_a_heavy_hitter_to_its_neighbours():
    positions = torch.tensor([4, 0, 1, 2, 3, 5, 6])
    scores = torch.tensor([0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0])  # position 2 is the heavy hitter
    pooled = max_pool_scores(positions, scores, kernel=3)
    by_position = dict(zip(positions.tolist(), pooled.tolist(), strict=True))
    assert by_position[1] == by_position[2] == by_position[3] == 9.0
    assert by_position[0] == by_position[4] == by_position[5] == 0.0


def test_growpage_and_its_ablations_keep_what_attention_needs_and_fixed_caps_do_not():
    config = dataclasses.replace(CONFIG, attention_coverage=0.95)
    follows = {name: build_method(name).attention_coverage(config) for name in METHOD_NAMES}
    # an ablation removes one piece of GrowPage (a signal, quantization, relief), never its floor
    for name in ("growpage", "growpage_no_quant", "growpage_no_sts", "growpage_uncalibrated", "growpage_random"):
        assert follows[name] == 0.95, name
    for name in ("full_kv", "streaming_llm", "h2o", "snapkv", "zipage", "uniform_int8"):
        assert follows[name] == 0.0, name


def test_each_method_weighs_its_observations_as_its_paper_does():
    growpage, h2o, snapkv, tova = (build_method(n) for n in ("growpage", "h2o", "snapkv", "tova"))
    assert [growpage.observation_weight(kind) for kind in Observation] == [0.0, 32.0, 1.0]  # prompt-anchored
    assert [h2o.observation_weight(kind) for kind in Observation] == [1.0, 1.0, 1.0]
    assert (h2o.step_decay, snapkv.step_decay, tova.step_decay) == (1.0, 1.0 - 1.0 / 32, 0.0)
    streaming = build_method("streaming_llm")
    positions = torch.tensor([3, 1, 2])
    assert not streaming.uses_attention and streaming.rank(positions, torch.ones(3)).tolist() == [3.0, 1.0, 2.0]


def test_the_lists_of_methods_follow_the_registry():
    assert VLLM_CAP_NAMES == ("streaming_llm", "h2o", "snapkv", "tova")
    assert set(VLLM_METHOD_NAMES) == {"growpage", "growpage_when_it_pays", *VLLM_CAP_NAMES}
    assert METHOD_NAMES[0] == "full_kv" and METHOD_NAMES.index("tova") < METHOD_NAMES.index("growpage")
    with pytest.raises(ValueError, match="registered twice"):
        register("h2o", lambda seed: KVMethod("h2o"))
