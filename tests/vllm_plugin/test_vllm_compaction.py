"""What a compaction inside vLLM ranks tokens by, per method: the keep set a user's answer depends on.

Pure torch: no vLLM needed (:class:`growpage.vllm_plugin.compaction.TokenScores`; the keep sets themselves, and the
physical accounting, are also tested in ``test_vllm_enforce_units.py`` and ``test_vllm_compaction_safety.py``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from growpage.core.methods import build_method
from growpage.vllm_plugin.compaction import TokenScores, choose_keep

PROMPT = 12
NEEDLE = 5  # a prompt token the question looks at, and the answer's preamble does not


def _scores(name: str, **fields) -> TokenScores:
    """A worker's scores under the method ``name``, with ``fields`` changed."""
    return TokenScores(dataclasses.replace(build_method(name), **fields))


def _prompt_then_decodes(scores: TokenScores, decode_steps: int) -> None:
    """A prompt whose last query looks at the needle, then decode steps that spread their attention
    over the other prompt tokens (the preamble of an answer), each observation summing to 1."""
    prompt = torch.full((PROMPT,), 0.2 / (PROMPT - 1))
    prompt[NEEDLE] = 0.8
    scores.add("r", prompt)
    for step in range(decode_steps):
        length = PROMPT + step + 1
        decode = torch.full((length,), 1.0 / (length - 1))
        decode[NEEDLE] = 0.0
        scores.add("r", decode)


def _kept(scores: TokenScores, keep: int) -> list[int]:
    length = PROMPT + 20
    positions = torch.arange(length)
    index = choose_keep(positions, scores.ranking("r", positions), keep, length, shared_prefix_tokens=0,
                        sink_tokens=1, recent_window_tokens=4)
    assert index is not None
    return index.tolist()


def test_growpage_keeps_what_the_question_looked_at_after_many_decode_steps():
    anchored, summed = _scores("growpage"), _scores("h2o")
    for scores in (anchored, summed):
        _prompt_then_decodes(scores, decode_steps=20)
    assert NEEDLE in _kept(anchored, keep=8)
    assert NEEDLE not in _kept(summed, keep=8)  # H2O: twenty preamble steps outweigh the question


def test_prompt_anchored_ranks_generated_tokens_as_the_decode_sum_does():
    anchored, summed = _scores("growpage"), _scores("h2o")
    generated = torch.rand(3, 10)
    for scores in (anchored, summed):
        scores.add("r", torch.zeros(4))  # a 4-token prompt nobody attends
        for row in generated:
            scores.add("r", row)
    positions = torch.arange(10)
    assert torch.equal(anchored.ranking("r", positions).argsort(), summed.ranking("r", positions).argsort())


def test_window_scores_forget_old_attention_and_pool_neighbours():
    window = _scores("snapkv", step_decay=0.5, pool_kernel=3)
    window.add("r", torch.tensor([0.0, 0.0, 8.0, 0.0, 0.0, 0.0]))  # the prompt's heavy hitter, at 2
    for _ in range(6):
        window.add("r", torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0]))
    ranking = window.ranking("r", torch.arange(6))
    assert ranking[2] == pytest.approx(8.0 * 0.5 ** 6)  # faded by half a step, six times
    assert ranking[4] == ranking[5] > ranking[2]  # the newest attention wins, and 4 pools 5's score
    assert ranking[1] == ranking[2]  # 1 pools its neighbour 2's


def test_scores_follow_their_tokens_through_a_compaction():
    scores = _scores("h2o")
    scores.add("r", torch.tensor([1.0, 2.0, 3.0, 4.0]))
    scores.add("r", torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0]))
    scores.keep("r", torch.tensor([0, 3, 4]), physical=5)
    assert scores.ranking("r", torch.arange(4)).tolist() == [2.0, 4.0, 5.0, 0.0]  # slot 3: written since


def test_nothing_observed_or_recency_ranks_nothing():
    assert _scores("h2o").ranking("r", torch.arange(3)) is None
    recency = _scores("streaming_llm")
    recency.add("r", torch.ones(3))
    assert recency.ranking("r", torch.arange(3)) is None and "r" not in recency


def test_a_forgotten_request_starts_again_from_its_prompt():
    scores = _scores("growpage")
    scores.add("r", torch.tensor([1.0, 0.0]))
    scores.add("r", torch.tensor([0.0, 3.0, 0.0]))
    scores.forget("r")  # preempted: recomputed from its prompt
    scores.add("r", torch.tensor([0.0, 0.0, 2.0]))  # the prompt's observation again: 32 decode steps' worth
    assert scores.ranking("r", torch.arange(3)).tolist() == [0.0, 0.0, 64.0]


def test_tova_ranks_by_the_newest_observation_alone():
    tova = _scores("tova")
    tova.add("r", torch.tensor([9.0, 0.0, 0.0]))  # the prompt looked at token 0
    tova.add("r", torch.tensor([0.0, 1.0, 0.0, 2.0]))  # the current query looks at 1 and 3
    assert tova.ranking("r", torch.arange(4)).tolist() == [0.0, 1.0, 0.0, 2.0]


def test_the_tokens_attention_needs_are_the_fewest_holding_the_coverage():
    scores = _scores("growpage")
    assert scores.tokens_for_coverage("r", 0.9) == 0  # nothing observed
    scores.add("r", torch.tensor([0.5, 0.0, 0.3, 0.1, 0.1]))
    assert scores.tokens_for_coverage("r", 0.5) == 1
    assert scores.tokens_for_coverage("r", 0.8) == 2
    assert scores.tokens_for_coverage("r", 0.9) == 3
    assert scores.tokens_for_coverage("r", 0.95) == 4  # the token with no mass is never needed
    # the sink and the recent window are kept anyway, and their mass is left out of the shares
    assert scores.tokens_for_coverage("r", 0.5, protected_head=1, protected_tail=1) == 2 + 1
    assert scores.tokens_for_coverage("r", 0.9, protected_head=1, protected_tail=1) == 2 + 2


@pytest.mark.parametrize("method", ["growpage", "h2o", "snapkv", "tova"])
def test_per_kv_head_scores_rank_each_head_by_its_own_attention(method):
    # unpooled: pooling reads new neighbours after a compaction (its own test below)
    per_head, first_head = _scores(method, pool_kernel=1), _scores(method, pool_kernel=1)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.rand(2, 6, generator=generator)
    decodes = [torch.rand(2, 6 + step, generator=generator) for step in range(1, 4)]
    per_head.add("r", prompt)
    first_head.add("r", prompt[0])
    for decode in decodes:
        per_head.add("r", decode)
        first_head.add("r", decode[0])
    positions = torch.arange(9)
    ranking = per_head.ranking("r", positions)
    assert ranking.shape == (2, 9)
    assert torch.allclose(ranking[0], first_head.ranking("r", positions))  # head 0 alone ranks as before
    per_head.keep("r", torch.tensor([[0, 2, 8], [1, 5, 8]]), physical=9)  # each head keeps its own
    moved = per_head.ranking("r", torch.arange(3))
    assert torch.allclose(moved[0], ranking[0, [0, 2, 8]]) and torch.allclose(moved[1], ranking[1, [1, 5, 8]])


def test_snapkv_pools_each_kv_heads_scores_among_its_own_neighbours():
    window = _scores("snapkv", pool_kernel=3)
    window.add("r", torch.tensor([[0.0, 0.0, 8.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 8.0]]))
    positions = torch.tensor([[0, 1, 2, 5, 6], [0, 1, 2, 3, 4]])  # head 0 was compacted: 2 and 5 are neighbours
    assert window.ranking("r", positions).tolist() == [[0.0, 8.0, 8.0, 8.0, 0.0], [0.0, 0.0, 0.0, 8.0, 8.0]]


def test_per_kv_head_attention_need_is_the_neediest_heads():
    scores = _scores("growpage")
    scores.add("r", torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.3, 0.3, 0.2, 0.2]]))
    assert scores.tokens_for_coverage("r", 0.85) == 4  # head 0 needs 1 token, head 1 all 4
