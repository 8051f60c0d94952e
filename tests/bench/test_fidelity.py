"""Fidelity: NLL increase and KL of full KV's continuation under a method's cache, and forced decoding."""

from __future__ import annotations

import math

import pytest
import torch

from growpage.bench.fidelity import FidelitySettings, coarse_kl, forced_spec, nll_increase, run_fidelity


def test_nll_increase_weights_every_token_alike_and_reports_each_request():
    reference = {"a": [-0.1, -0.2], "b": [-1.0, -1.0, -1.0, -1.0]}
    candidate = {"a": [-0.1, -0.2], "b": [-2.0, -2.0, -1.0, -1.0]}
    result = nll_increase(reference, candidate)
    assert result["mean"] == pytest.approx(2.0 / 6, abs=1e-5)
    assert result["per_request"] == {"a": 0.0, "b": 0.5}
    assert result["range"] == [0.0, 0.5] and result["tokens"] == 6
    assert result["reference_nll"] == pytest.approx(4.3 / 6, abs=1e-5)
    assert nll_increase(reference, reference)["mean"] == 0.0


def test_nll_increase_refuses_runs_forced_through_different_continuations():
    with pytest.raises(ValueError, match="same continuation"):
        nll_increase({"a": [-0.1, -0.2]}, {"a": [-0.1]})


def test_coarse_kl_is_zero_for_the_same_distribution_and_a_lower_bound_of_the_full_kl():
    generator = torch.Generator().manual_seed(0)
    p = torch.log_softmax(torch.randn(100, generator=generator) * 3, dim=-1)
    q = torch.log_softmax(torch.randn(100, generator=generator) * 3, dim=-1)
    top_values, top_ids = p.topk(8)
    assert coarse_kl(top_ids, top_values, p) == pytest.approx(0.0, abs=1e-9)
    full = float((p.exp() * (p - q)).sum())
    coarse = coarse_kl(top_ids, top_values, q)
    assert 0.0 < coarse <= full + 1e-9
    everything_values, everything_ids = p.topk(100)
    assert coarse_kl(everything_ids, everything_values, q) == pytest.approx(full, rel=1e-6)


def test_forced_spec_forces_each_prompt_through_its_reference():
    spec = {"prompts": ["x", "y"], "max_tokens": 192, "variant": "growpage"}
    forced = forced_spec(spec, [[1, 2, 3], [4, 5]])
    assert forced["forced"] == [[1, 2, 3], [4, 5]] and forced["logprobs"] is True and forced["max_tokens"] == 3
    assert spec.get("forced") is None  # the caller's spec is left alone
    with pytest.raises(ValueError, match="2 prompts"):
        forced_spec(spec, [[1]])


def test_force_row_leaves_only_the_reference_token_and_stops_at_its_end():
    pytest.importorskip("vllm")
    from growpage.tooling.forced_decoding import force_row

    logits = torch.zeros(6)
    forced = force_row([4, 2], [], logits.clone())
    assert int(forced.argmax()) == 4 and math.isinf(float(forced[0]))
    assert int(force_row([4, 2], [4], logits.clone()).argmax()) == 2
    assert torch.equal(force_row([4, 2], [4, 2], logits.clone()), logits)


def test_fidelity_on_the_reference_engine_full_kv_is_its_own_zero(prepared_model_dir, llama_model, tokenizer):
    from growpage.bench import harness

    loaded = harness.Loaded(str(prepared_model_dir), llama_model, tokenizer)
    settings = FidelitySettings(methods=("streaming_llm",), budgets=(6,), prompts=1, max_tokens=40, block_size=16)
    result = run_fidelity(loaded.model_dir, settings, loaded=loaded)
    full, capped = result["results"]
    assert full["method"] == "full_kv" and full["nll_increase"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert full["kl_lower_bound"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert capped["nll_increase"]["tokens"] == 40 and capped["decisions"].get("evict", 0) >= 1
    # 6 pages of 16 tokens cannot hold a ~100-token prompt and 40 more: the cap must cost something
    assert capped["nll_increase"]["mean"] > 0 and capped["kl_lower_bound"]["mean"] > 0
