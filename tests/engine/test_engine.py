"""The reference engine on the packaged model: what a user relies on.

Greedy with GrowPage off equals Hugging Face transformers token for token (continuous batching,
chunked prefill, preemption and prefix caching included); monitor equals off; enforce on a tight
budget stays coherent and honours its caps.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from growpage.config import GrowPageConfig
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.sampling import InvalidRequest, SamplingParams

PROMPTS = (
    "What is 12 + 7? Answer step by step.",
    "Write one sentence about the moon.",
    "List three colours of the rainbow.",
    "Explain in two sentences why the sky is blue.",
)
MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def chat_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "input_ids") else ids)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [chat_ids(tokenizer, text) for text in PROMPTS]


@pytest.fixture(scope="module")
def hf_greedy(prepared_model_dir, prompt_ids):
    """Transformers' own greedy continuations (float32, CPU), stopping at EOS like the engine."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(prepared_model_dir, dtype=torch.float32, local_files_only=True)
    outputs = []
    for ids in prompt_ids:
        generated = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        outputs.append(generated[0, len(ids):].tolist())
    return outputs


def make_engine(model, tokenizer, model_dir, mode="off", engine_overrides=None, **growpage) -> LLMEngine:
    settings = dict(mode=mode, base_pages=4, recent_window_tokens=16, sink_tokens=4, kv_dtype="float32")
    settings.update(growpage)
    engine_settings = dict(model_dir=str(model_dir), num_pages=256, max_num_seqs=8)
    engine_settings.update(engine_overrides or {})
    return LLMEngine(EngineConfig(**engine_settings), GrowPageConfig(**settings), model=model, tokenizer=tokenizer)


def outputs_of(engine, prompt_ids, params=GREEDY):
    return [r.output_token_ids for r in engine.generate(prompt_ids, params)]


def assert_same_tokens(expected, actual):
    for index, (a, b) in enumerate(zip(expected, actual, strict=False)):
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        assert a == b, f"prompt {index}: first difference at token {first}: {a} vs {b}"


def test_greedy_with_growpage_off_equals_transformers(llama_model, tokenizer, prepared_model_dir, prompt_ids,
                                                       hf_greedy):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    assert_same_tokens(hf_greedy, outputs_of(engine, prompt_ids))
    assert engine.manager.pool.num_free == engine.manager.pool.num_pages  # every page came back


def test_chunked_prefill_preemption_and_prefix_caching_do_not_change_tokens(
        llama_model, tokenizer, prepared_model_dir, prompt_ids, hf_greedy):
    # Chunks of 8 tokens, a pool so small requests preempt each other, and a shared system prompt.
    engine = make_engine(llama_model, tokenizer, prepared_model_dir, base_pages=2, recent_window_tokens=8,
                         engine_overrides=dict(max_num_batched_tokens=8, num_pages=10))
    assert_same_tokens(hf_greedy, outputs_of(engine, prompt_ids))
    assert engine.scheduler.num_preemptions > 0
    assert engine.manager.pool.num_free == 10

    cached = make_engine(llama_model, tokenizer, prepared_model_dir)
    first = cached.generate(prompt_ids[:1], GREEDY)[0]
    again_id = cached.add_request(prompt_ids[0], GREEDY)
    again = cached.requests[again_id]
    while cached.has_unfinished_requests():
        cached.step()
    assert again.output_token_ids == first.output_token_ids == hf_greedy[0]


def test_prefix_pages_are_shared_between_concurrent_requests(llama_model, tokenizer, prepared_model_dir, prompt_ids):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    long_prefix = prompt_ids[3] + prompt_ids[3]
    engine.generate([long_prefix], SamplingParams(max_tokens=1, temperature=0.0))  # publishes its pages
    rid = engine.add_request(long_prefix + [42], SamplingParams(max_tokens=2, temperature=0.0))
    engine.step()
    assert engine.requests[rid].num_computed_tokens > len(long_prefix) // 2  # most of it came cached


def test_monitor_mode_output_is_identical_to_off(llama_model, tokenizer, prepared_model_dir, prompt_ids):
    off = outputs_of(make_engine(llama_model, tokenizer, prepared_model_dir, mode="off"), prompt_ids)
    monitor_engine = make_engine(llama_model, tokenizer, prepared_model_dir, mode="monitor", base_pages=2,
                                 recent_window_tokens=8, density_threshold=0.0)
    assert outputs_of(monitor_engine, prompt_ids) == off
    stats = monitor_engine.manager.make_stats()
    assert sum(stats.decisions_total.values()) > 0  # decisions were computed, nothing enforced
    assert stats.compress_input_bytes_total == 0


def test_enforce_on_a_tight_budget_compresses_and_stays_coherent(llama_model, tokenizer, prepared_model_dir,
                                                                  prompt_ids):
    prompt = chat_ids(tokenizer, "Count from one to twenty in words, separated by commas.")
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    full = make_engine(llama_model, tokenizer, prepared_model_dir).generate([prompt], params)[0]
    engine = make_engine(llama_model, tokenizer, prepared_model_dir, mode="enforce", base_pages=4,
                         growth_coefficient=0.0, density_threshold=1.0, lts_grow_threshold=100.0)
    request = engine.generate([prompt], params)[0]
    stats = engine.manager.make_stats()
    assert stats.decisions_total["evict"] > 0
    events = [e for e in stats.decision_events if e.kind == "evict"]
    assert max(e.pages_after for e in events) <= 4  # never grew past its grant
    # Identical until the first compression, then still fluent text.
    first_compression_at = engine.growpage_config.base_pages * 16 - len(prompt)
    assert request.output_token_ids[:first_compression_at] == full.output_token_ids[:first_compression_at]
    words = request.output_text.replace(",", " ").split()
    assert len(words) >= 10 and len(set(words)) >= 5, request.output_text


def test_stop_strings_eos_and_max_tokens(llama_model, tokenizer, prepared_model_dir, prompt_ids):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    full = engine.generate([prompt_ids[2]], GREEDY)[0]
    stop_at = full.output_text.split()[2]
    stopped = engine.generate([prompt_ids[2]], dataclasses.replace(GREEDY, stop=(stop_at,)))[0]
    assert stopped.finish_reason.value == "stop" and stop_at not in stopped.output_text
    assert full.output_text.startswith(stopped.output_text)
    short = engine.generate([prompt_ids[0]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert len(short.output_token_ids) == 3 and short.finish_reason.value == "length"
    natural = engine.generate([prompt_ids[1]], SamplingParams(max_tokens=200, temperature=0.0))[0]
    assert natural.finish_reason.value == "stop" and natural.output_token_ids[-1] in engine.eos_token_ids


def test_seeded_sampling_is_reproducible_whatever_the_batch(llama_model, tokenizer, prepared_model_dir, prompt_ids):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=1234)
    alone = engine.generate([prompt_ids[1]], params)[0].output_token_ids
    batched = engine.generate([prompt_ids[0], prompt_ids[1]],
                              [SamplingParams(max_tokens=12, temperature=1.0, seed=7), params])[1].output_token_ids
    assert alone == batched


def test_abort_frees_pages_and_bad_requests_are_refused(llama_model, tokenizer, prepared_model_dir, prompt_ids):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    rid = engine.add_request(prompt_ids[0], GREEDY)
    engine.step()
    assert engine.manager.pool.num_free < engine.manager.pool.num_pages
    assert engine.abort(rid)
    assert engine.manager.pool.num_free == engine.manager.pool.num_pages and not engine.has_unfinished_requests()
    with pytest.raises(InvalidRequest, match="prompt is empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(InvalidRequest, match="context is"):
        engine.add_request([1] * engine.max_model_len, GREEDY)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(InvalidRequest, match="top_p"):
        SamplingParams(top_p=0.0)


def test_teacher_forcing_scores_the_forced_tokens_and_follows_them(llama_model, tokenizer, prepared_model_dir,
                                                                   prompt_ids, hf_greedy):
    engine = make_engine(llama_model, tokenizer, prepared_model_dir)
    reference = hf_greedy[0]
    # Force greedy's own continuation: greedy agrees at every step and every log-prob is finite.
    forced = engine.generate([prompt_ids[0]], SamplingParams(max_tokens=len(reference), temperature=0.0),
                             teacher_token_ids=reference)[0]
    assert forced.output_token_ids == reference
    assert all(forced.teacher_greedy_matches) and len(forced.teacher_logprobs) == len(reference)
    assert all(-30.0 < lp <= 0.0 for lp in forced.teacher_logprobs)
    # Force another prompt's continuation: the output follows the teacher, greedy disagrees somewhere,
    # and the teacher's tokens are less likely than greedy's own were.
    other = hf_greedy[1][:len(reference)]
    mismatched = make_engine(llama_model, tokenizer, prepared_model_dir).generate(
        [prompt_ids[0]], SamplingParams(max_tokens=len(other), temperature=0.0), teacher_token_ids=other)[0]
    assert mismatched.output_token_ids == other
    assert not all(mismatched.teacher_greedy_matches)
    assert sum(mismatched.teacher_logprobs) < sum(forced.teacher_logprobs)
    with pytest.raises(InvalidRequest, match="teacher_token_ids is empty"):
        engine.add_request(prompt_ids[0], GREEDY, teacher_token_ids=[])
