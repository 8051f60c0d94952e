"""One request's trouble stays that request's: a sampling fault fails it alone, a pool that cannot
hold it says "truncated" (never a silent "length"), and sampling parameters are checked as vLLM
checks them."""

from __future__ import annotations

import dataclasses

import pytest

from growpage.config import GrowPageConfig
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.sampling import InvalidRequest, SamplingParams


def make_engine(model, tokenizer, model_dir, num_pages=256, mode="off") -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=str(model_dir), num_pages=num_pages, max_num_seqs=8),
                     GrowPageConfig(mode=mode, base_pages=2, recent_window_tokens=8, sink_tokens=4,
                                    kv_dtype="float32"),
                     model=model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.encode("Tell me about the sea.")


def test_a_tiny_temperature_is_raised_to_vllms_floor_and_samples(llama_model, tokenizer, prepared_model_dir, prompt):
    params = SamplingParams(max_tokens=6, temperature=1e-50, seed=3)
    assert params.temperature == 0.01
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    tiny, greedy = engine.generate([prompt, prompt], [params, SamplingParams(max_tokens=6, temperature=0.0)])
    assert tiny.finish_reason.value == "length" and len(tiny.output_token_ids) == 6
    # At T = 0.01 the top token dominates: the sample is the greedy continuation.
    assert tiny.output_token_ids == greedy.output_token_ids


def test_a_sampling_fault_fails_that_request_alone(llama_model, tokenizer, prepared_model_dir, prompt):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    broken = SamplingParams(max_tokens=8, temperature=1.0, seed=1)
    object.__setattr__(broken, "temperature", float("nan"))  # what validation lets through no more
    healthy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    bad_id = engine.add_request(prompt, broken)
    good_id = engine.add_request(prompt, healthy)
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    bad = [o for o in outputs if o.request_id == bad_id]
    good = [o for o in outputs if o.request_id == good_id]
    assert len(bad) == 1 and bad[0].finished and bad[0].finish_reason == "error" and "nan" in bad[0].error
    assert good[-1].finish_reason == "length" and good[-1].num_output_tokens == 8
    assert all(o.error is None for o in good)
    assert engine.num_failed_requests == 1
    assert engine.manager.pool.num_free == engine.manager.pool.num_pages  # its pages came back


def test_a_request_the_pool_cannot_hold_ends_truncated_and_is_counted(llama_model, tokenizer, prepared_model_dir,
                                                                      prompt):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir, num_pages=3, mode="off")
    request = engine.generate([prompt], SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True))[0]
    assert request.finish_reason.value == "truncated"
    assert 0 < len(request.output_token_ids) < 128
    assert engine.num_truncated_requests == 1


@pytest.mark.parametrize("changes, fragment", [
    ({"seed": 2**70}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
])
def test_out_of_range_sampling_parameters_are_refused(changes, fragment):
    with pytest.raises(InvalidRequest, match=fragment):
        dataclasses.replace(SamplingParams(), **changes)


def test_the_whole_signed_64_bit_seed_range_is_accepted():
    for seed in (-(2**63), -1, 0, 2**63 - 1):
        assert SamplingParams(temperature=1.0, seed=seed).seed == seed
