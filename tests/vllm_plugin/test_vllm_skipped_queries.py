"""Which skipped steps' queries join an observed step's window, and at what offsets."""

from __future__ import annotations

import pytest
import torch

from growpage.vllm_plugin.skipped_queries import SkippedQueries, TakenQuery

LAYERS = ("layer8", "layer15")


def _skip(kept: SkippedQueries, taken: dict[str, TakenQuery], rows: int, layers=LAYERS, fill: float = 0.0) -> None:
    """A skipped step handing over ``rows`` queries per layer, each row's value its row + ``fill``."""
    kept.begin_skipped_step(taken)
    for layer in layers:
        kept.take(layer, (torch.arange(rows, dtype=torch.float32) + fill)[:, None, None].expand(rows, 1, 2))


def test_a_request_window_holds_its_skipped_queries_oldest_first_at_their_offsets():
    a, b = object(), object()
    kept = SkippedQueries(max_steps=3)
    _skip(kept, {"a": TakenQuery(a, 20, 0, 0), "b": TakenQuery(b, 30, 0, 1)}, rows=2, fill=10)
    _skip(kept, {"b": TakenQuery(b, 31, 0, 0), "a": TakenQuery(a, 21, 0, 1)}, rows=2, fill=20)
    # the observed step: a at 22 tokens, b at 32, one own query each (rows 0 and 1 of the pool)
    plan = kept.plan([a, b], ["a", "b"], [22, 32], [0, 0], [[0], [0]])
    assert plan.kept == 4
    assert plan.offsets == [[2, 1, 0], [2, 1, 0]]
    pool = kept.pool("layer8", torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]]))
    windows = pool.index_select(0, torch.tensor(plan.sources))[:, 0, 0].view(2, 3)
    assert windows.tolist() == [[10.0, 21.0, 1.0], [11.0, 20.0, 2.0]]  # each request's own rows, newest last


def test_a_query_whose_keys_moved_or_whose_request_restarted_is_left_out():
    a, resumed, b = object(), object(), object()
    kept = SkippedQueries(max_steps=3)
    _skip(kept, {"a": TakenQuery(a, 20, 0, 0), "b": TakenQuery(b, 30, 0, 1)}, rows=2)
    # a was compacted since (4 tokens dropped): its positions no longer hold what it saw; b was
    # preempted and resumed (tracked anew); a shorter-or-equal length is no earlier step at all
    plan = kept.plan([a, resumed], ["a", "b"], [21, 31], [4, 0], [[0], [0]])
    assert plan.kept == 0 and plan.offsets == [[0], [0]]
    plan = kept.plan([a, b], ["a", "b"], [20, 31], [0, 0], [[0], [0]])
    assert plan.kept == 1 and plan.offsets == [[0, 0], [1, 0]]  # a pads with its newest (offset 0)


def test_only_the_newest_skipped_steps_are_kept_and_a_step_cut_short_is_not_pooled():
    a = object()
    kept = SkippedQueries(max_steps=2)
    for n in range(3):
        _skip(kept, {"a": TakenQuery(a, 10 + n, 0, 0)}, rows=1)
    assert kept.steps == 2
    assert kept.plan([a], ["a"], [13], [0], [[0]]).offsets == [[2, 1, 0]]  # the step at 10 fell out
    _skip(kept, {"a": TakenQuery(a, 13, 0, 0)}, rows=1, layers=LAYERS[:1])  # a graph replay after one layer
    plan = kept.plan([a], ["a"], [14], [0], [[0]])
    assert plan.offsets == [[2, 0]]  # 12 kept; 11 fell out; 13 lacks a layer, so is not pooled
    with pytest.raises(KeyError):
        kept.pool("layer22", torch.zeros(1, 1, 2))  # a layer no skipped step saw: a counted fault
    kept.clear()
    assert kept.steps == 0 and kept.plan([a], ["a"], [15], [0], [[0]]).kept == 0


def test_a_prompts_own_window_keeps_its_queries_beside_the_skipped_ones():
    a, b = object(), object()
    kept = SkippedQueries(max_steps=3)
    _skip(kept, {"b": TakenQuery(b, 40, 0, 0)}, rows=1)
    # a's prompt ends this step with a window of three queries; b decodes (one query, two pads)
    plan = kept.plan([a, b], ["a", "b"], [30, 42], [0, 0], [[2, 1, 0], [0, 0, 0]])
    assert plan.offsets == [[2, 1, 0], [0, 2, 0]]
    assert plan.sources == [0, 1, 2, 5, 6, 5]  # b: its newest (row 5) pads, then the kept query (row 6)


def test_nothing_is_kept_when_every_step_is_observed():
    kept = SkippedQueries(max_steps=0)
    _skip(kept, {"a": TakenQuery(object(), 20, 0, 0)}, rows=1)
    assert kept.steps == 0
