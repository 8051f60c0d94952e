"""The mixed part without engines: what it sends, how each prompt is bounded, how its rows read."""

from __future__ import annotations

import dataclasses

from growpage.bench.goodput import blocks_needed, goodput_rows
from growpage.bench.mixed import mixed_trace
from growpage.bench.tasks import RETRIEVAL_MAX_TOKENS
from growpage.bench.vllm_settings import PARTS, VllmBenchSettings


def test_questions_and_long_generations_alternate_each_with_its_own_length():
    settings = dataclasses.replace(VllmBenchSettings(), mixed_reasoning=3, max_tokens=160)
    prompts, tasks, max_tokens = mixed_trace(settings)
    assert len(prompts) == len(tasks) == len(max_tokens) == 16 + 3 and "mixed" in PARTS
    assert max_tokens[:6] == [RETRIEVAL_MAX_TOKENS, 160] * 3 and set(max_tokens[6:]) == {RETRIEVAL_MAX_TOKENS}
    families = [task.family if task else None for task in tasks]
    assert families[0] in ("code", "multikey") and families[1] in ("reasoning", None)
    assert all(task is not None for task, limit in zip(tasks, max_tokens, strict=True)
               if limit == RETRIEVAL_MAX_TOKENS)  # every question has its true answer
    assert len(set(prompts)) == len(prompts)


def test_each_request_is_sized_at_its_own_full_length():
    assert blocks_needed([30, 30, 100], [16, 160, 16], 32) == [2, 6, 4]
    assert blocks_needed([30, 100], 16, 32) == [2, 4]  # one limit for every prompt, as the retrieval part


def test_mixed_rows_carry_the_nll_increase_with_the_limit_as_reference():
    measure = {"median": 2.0, "range": [2.0, 2.0], "values": [2.0]}
    variants = {"vllm": {"tokens_per_s": measure, "accuracy": measure, "correct_per_s": measure},
                "growpage": {"tokens_per_s": measure, "nll_increase": 0.0123},
                "limit": {"tokens_per_s": measure}}
    rows = goodput_rows({"mixed": {"variants": variants}})
    assert [row[0] for row in rows] == ["mixed under KV pressure"] * 3
    assert [row[-1] for row in rows] == ["-", "+0.0123", "0 (ref)"]


def test_a_vllm_run_bounds_each_prompt_by_its_own_max_tokens():
    from growpage.tooling.vllm_child import _sampling

    spec = {"max_tokens": [16, 160], "ignore_eos": False}
    assert [_sampling(spec, index).max_tokens for index in (0, 1)] == [16, 160]
    assert _sampling({"max_tokens": 24}, 1).max_tokens == 24
