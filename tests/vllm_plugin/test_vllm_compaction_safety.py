"""Compactions that are safe at GPU scale, checked on CPU in every cache layout vLLM can give.

Moves in chunks under a memory cap must equal the one-chunk move (in place, every layout, one keep
set per request or per KV head); a move whose gather or scatter fails part-way must still leave
exactly the chosen tokens; and a compaction that fails before moving must leave the request its
sinks and most recent tokens, never its first ``keep_tokens``, counted. The caches are vLLM's own
views (``test_vllm_backend_layouts``'s), four layers in one allocation.
"""

from __future__ import annotations

import types

import pytest
import torch
from test_vllm_backend_layouts import BLOCK, CASES, HEAD_DIM, HEADS, IDS, _observer, _request

from growpage.vllm_plugin import compactor as compactor_module
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin.compaction import choose_keep, recency_keep, slot_positions
from growpage.vllm_plugin.compactor import CompactionError, WorkerCompactor
from growpage.vllm_plugin.keys import move_bytes_per_token
from growpage.vllm_plugin.settings import split_settings
from growpage.vllm_plugin.wire import CompactionPlan, StepPayload

TOKENS = 70  # _request's: three blocks of 32, (4, 1, 3)
SINKS, RECENT = 4, 8


def _compactor(**kwargs) -> WorkerCompactor:
    config, _ = split_settings({"mode": "enforce", "base_pages": 2, "sink_tokens": SINKS,
                                "recent_window_tokens": RECENT}, env={}, block_size=BLOCK)
    return WorkerCompactor(config, **kwargs)


def _random_keep(generator: torch.Generator, keep: int, per_head: bool) -> torch.Tensor:
    """``[keep]`` (or ``[HEADS, keep]``) random survivors, ascending, as a compaction's keep sets are."""
    rows = [torch.randperm(TOKENS, generator=generator)[:keep].sort().values for _ in range(HEADS if per_head else 1)]
    return torch.stack(rows) if per_head else rows[0]


def _assert_holds(caches, keys, values, row, layout, kept: torch.Tensor, layers=None) -> None:
    """Physical slot ``j`` of every layer (and head) holds K and V of token ``kept[.., j]``."""
    per_head = kept.expand(HEADS, -1)  # [H, n]
    count, heads = per_head.shape[1], torch.arange(HEADS)
    slots = torch.arange(count)
    bases = row[slots // BLOCK] * layout.block_stride  # [n]
    for layer in layers if layers is not None else range(len(caches)):
        storage = kv_keys.storage_of(caches[layer])[caches[layer].storage_offset():]
        for index, tokens in ((layout.key_index, keys[layer]), (layout.value_index, values[layer])):
            stored = storage[bases[:, None, None] + index[:, slots % BLOCK].transpose(0, 1)]  # [n, H, hd]
            expected = tokens[per_head.T, heads[None, :]]  # [n, H, hd]
            assert torch.equal(stored, expected), f"layer {layer}"


def _groups(caches, layout):
    """The caches as one evenly spaced group (strided views where the layout has strides, as every
    layout vLLM writes does) and as an uneven one (long offsets)."""
    strided = layout.key_tiles is not None and layout.value_tiles is not None
    return {"strided": (list(range(len(caches))), strided), "offsets": ([0, 1, 3], False)}


@pytest.mark.parametrize("per_head", [False, True], ids=["request", "kv_head"])
@pytest.mark.parametrize(("backend", "layout_name", "write", "dtype", "tag"), CASES, ids=IDS)
def test_chunked_moves_equal_the_one_chunk_move(backend, layout_name, write, dtype, tag, per_head):
    caches, keys, values, row, _ = _request(write, layout_name, dtype)
    layout = kv_keys.probe_layout(write, caches[0], HEADS, BLOCK, HEAD_DIM)
    assert layout is not None
    storage = kv_keys.storage_of(caches[0])
    original = storage.clone()
    generator = torch.Generator().manual_seed(7)
    compactor = _compactor()
    for name, (layers, strided) in _groups(caches, layout).items():
        for keep in (1, 5, 37, TOKENS - 1):
            keep_index = _random_keep(generator, keep, per_head)
            src, dst = compactor._moves(row, keep_index, keep)
            group = [caches[layer] for layer in layers]
            kv_keys.move_tokens_chunked(group, src, dst, layout)  # one chunk: the reference
            _assert_holds(caches, keys, values, row, layout, keep_index, layers)
            expected = storage.clone()
            per_token = move_bytes_per_token(len(layers), HEADS, HEAD_DIM, caches[0].element_size(),
                                             per_head=per_head, strided=strided)
            for cap_tokens in (1, 2, 7, TOKENS):
                storage.copy_(original)
                outcome = kv_keys.move_tokens_chunked(group, src, dst, layout, cap_tokens * per_token)
                assert torch.equal(storage, expected), f"{name}, keep {keep}, {cap_tokens} tokens a chunk"
                assert outcome.chunks == -(-int(src.shape[-1]) // cap_tokens)
                assert outcome.peak_bytes_planned <= cap_tokens * per_token
                assert outcome.tokens_copied_one_by_one == 0
            storage.copy_(original)
            outcome = kv_keys.move_tokens_chunked(group, src, dst, layout, 1)  # under one token: one a chunk
            assert torch.equal(storage, expected) and outcome.chunks == src.shape[-1]
            storage.copy_(original)


def _failing(real, fail_on: int, partial: bool = False):
    """``real`` that raises on its ``fail_on``-th call (a scatter first writes garbage where it was
    to write, as a fault part-way through would)."""
    calls = {"n": 0}

    def call(group, slots, *rest):
        calls["n"] += 1
        if calls["n"] == fail_on:
            if partial:
                real(group, slots, [torch.full_like(tokens, 3.0) for tokens in rest[0]])
            raise torch.OutOfMemoryError("injected")
        return real(group, slots, *rest)

    return call


@pytest.mark.parametrize("per_head", [False, True], ids=["request", "kv_head"])
@pytest.mark.parametrize("step", ["gather", "scatter"])
@pytest.mark.parametrize(("backend", "layout_name", "write", "dtype", "tag"), CASES[:1] + CASES[-10:],
                         ids=IDS[:1] + IDS[-10:])
def test_a_move_that_fails_part_way_still_leaves_exactly_the_chosen_tokens(
        backend, layout_name, write, dtype, tag, step, per_head, monkeypatch):
    caches, keys, values, row, _ = _request(write, layout_name, dtype)
    layout = kv_keys.probe_layout(write, caches[0], HEADS, BLOCK, HEAD_DIM)
    storage = kv_keys.storage_of(caches[0])
    original = storage.clone()
    keep = 30  # dense survivors: a chunk's destinations are often its own sources
    keep_index = torch.cat([torch.arange(SINKS), torch.arange(TOKENS - keep + SINKS, TOKENS)])
    if per_head:
        keep_index = torch.cat([keep_index[None], _random_keep(torch.Generator().manual_seed(3), keep, True)[1:]])
    src, dst = _compactor()._moves(row, keep_index, keep)
    moved = int(src.shape[-1])
    for name, (layers, strided) in _groups(caches, layout).items():
        per_token = move_bytes_per_token(len(layers), HEADS, HEAD_DIM, caches[0].element_size(),
                                         per_head=per_head, strided=strided)
        for fail_on in (1, 2, -(-moved // 4)):  # the first chunk, the second, the last (4 tokens a chunk)
            storage.copy_(original)
            with monkeypatch.context() as patch:
                real = getattr(kv_keys, f"_{step}")
                patch.setattr(kv_keys, f"_{step}", _failing(real, fail_on, partial=step == "scatter"))
                outcome = kv_keys.move_tokens_chunked([caches[layer] for layer in layers], src, dst, layout,
                                                      4 * per_token)
            _assert_holds(caches, keys, values, row, layout, keep_index, layers)
            assert outcome.chunks == fail_on - 1, name
            assert outcome.tokens_copied_one_by_one == moved - 4 * (fail_on - 1)


def _runner(caches, row: torch.Tensor):
    """A runner stand-in whose one request ``r`` holds ``TOKENS`` tokens in ``row``'s blocks of ``caches``."""
    table = types.SimpleNamespace(num_blocks_per_row=[len(row)])
    return types.SimpleNamespace(requests={"r": types.SimpleNamespace(block_ids=(row.tolist(),))}, kv_caches=caches,
                                 input_batch=types.SimpleNamespace(
                                     req_id_to_index={"r": 0}, block_table=types.SimpleNamespace(block_tables=[table])))


def _output(compactor: WorkerCompactor, keep: int, physical: int = TOKENS):
    dropped = compactor.dropped.get("r", 0) + physical - keep
    plan = CompactionPlan(physical_tokens=physical, keep_tokens=keep, logical_length=dropped + keep,
                          shared_prefix_tokens=0, dropped=dropped, prompt_tokens=0)
    return types.SimpleNamespace(growpage=StepPayload({"r": plan}, {"r": dropped}))


def _filled(dtype=torch.bfloat16):
    backend, layout_name, write, _, _ = CASES[-1]
    caches, keys, values, row, _ = _request(write, layout_name, dtype)
    return caches, keys, values, row, kv_keys.probe_layout(write, caches[0], HEADS, BLOCK, HEAD_DIM)


def _raise(*_args, **_kwargs):
    raise RuntimeError("injected")


@pytest.mark.parametrize("fails", ["choose_keep", "ranking", "redundancy"])
def test_a_compaction_that_fails_before_moving_keeps_sinks_and_recent_tokens_never_the_first(fails, monkeypatch):
    caches, keys, values, row, layout = _filled()
    compactor = _compactor(redundancy_weight=0.5 if fails == "redundancy" else 0.0)
    scores = torch.zeros(TOKENS)
    scores[10] = 5.0  # a heavy hitter the failed compaction would have kept
    compactor.add_scores("r", scores)
    if fails == "choose_keep":
        monkeypatch.setattr(compactor_module, "choose_keep", _raise)
    elif fails == "ranking":
        monkeypatch.setattr(compactor.scores, "ranking", _raise)
    else:
        compactor.key_caches = caches[:1]
        monkeypatch.setattr(compactor_module, "key_redundancy", _raise)
    runner = _runner(caches, row)
    with pytest.raises(CompactionError, match="sinks_and_recent"):
        compactor.begin_step(runner, _output(compactor, keep=40), layout)
    fallback = recency_keep(TOKENS, 40, SINKS)
    assert fallback.tolist() == list(range(SINKS)) + list(range(TOKENS - 36, TOKENS))
    assert compactor.kept_positions["r"].tolist() == fallback.tolist()  # not range(40)
    _assert_holds(caches, keys, values, row, layout, fallback)
    assert compactor.failed_compactions == 1 and compactor.recoveries == {"sinks_and_recent": 1}
    assert compactor.tokens_copied_one_by_one == 40 - SINKS and compactor.compactions == 0  # one slot at a time
    assert runner.requests["r"].block_ids == (row[:2].tolist(),) and compactor.dropped == {"r": 30}
    monkeypatch.undo()
    assert compactor.scores.ranking("r", torch.arange(40)) is None  # forgotten: recency until observed again


def test_a_per_head_request_falls_back_in_every_head_to_what_its_slots_hold(monkeypatch):
    caches, keys, values, row, layout = _filled()
    compactor = _compactor()
    scores = torch.zeros(HEADS, TOKENS)
    scores[0, 10], scores[1, 20] = 5.0, 5.0
    compactor.add_scores("r", scores)
    runner = _runner(caches, row)
    compactor.begin_step(runner, _output(compactor, keep=50), layout)  # per head: heads keep their own
    first = compactor.kept_positions["r"].clone()
    assert first.shape == (HEADS, 50) and 10 in first[0].tolist() and 20 in first[1].tolist()
    _assert_holds(caches, keys, values, row, layout, first)
    monkeypatch.setattr(compactor_module, "choose_keep", _raise)
    with pytest.raises(CompactionError):
        compactor.begin_step(runner, _output(compactor, keep=30, physical=50), layout)
    kept = compactor.kept_positions["r"]
    assert kept.tolist() == first[:, recency_keep(50, 30, SINKS)].tolist()
    _assert_holds(caches, keys, values, row, layout, kept)


def test_a_failure_after_the_move_records_the_chosen_tokens(monkeypatch):
    caches, keys, values, row, layout = _filled()
    compactor = _compactor()
    scores = torch.zeros(TOKENS)
    scores[10] = 5.0
    compactor.add_scores("r", scores)
    monkeypatch.setattr(compactor.scores, "keep", _raise)
    with pytest.raises(CompactionError, match="chosen"):
        compactor.begin_step(_runner(caches, row), _output(compactor, keep=40), layout)
    kept = compactor.kept_positions["r"]
    assert 10 in kept.tolist() and compactor.recoveries == {"chosen": 1}
    _assert_holds(caches, keys, values, row, layout, kept)


def test_only_a_fallback_that_cannot_move_leaves_the_first_tokens_and_says_so():
    caches, keys, values, row, layout = _filled()
    compactor = _compactor()
    runner = _runner(caches, row)
    runner.requests["r"].block_ids[0].pop()  # the worker lost a block: nothing can move
    with pytest.raises(CompactionError, match="first_tokens"):
        compactor.begin_step(runner, _output(compactor, keep=40), layout)
    assert compactor.kept_positions["r"].tolist() == list(range(40))  # what the cache really holds
    assert compactor.recoveries == {"first_tokens": 1} and compactor.tokens_moved == 0
    _assert_holds(caches, keys, values, row, layout, torch.arange(40))


def test_the_compactor_moves_in_chunks_and_counts_a_chunk_that_fell_back(monkeypatch):
    caches, keys, values, row, layout = _filled()
    per_token = move_bytes_per_token(len(caches), HEADS, HEAD_DIM, caches[0].element_size(), per_head=False,
                                     strided=True)
    compactor = _compactor(max_chunk_bytes=8 * per_token)
    monkeypatch.setattr(kv_keys, "_gather", _failing(kv_keys._gather, 3))
    compactor.begin_step(_runner(caches, row), _output(compactor, keep=40), layout)  # no error: it finished
    kept = compactor.kept_positions["r"]
    assert kept.tolist() == recency_keep(TOKENS, 40, SINKS).tolist()  # nothing observed: recency
    _assert_holds(caches, keys, values, row, layout, kept)
    moved = 40 - SINKS
    assert compactor.move_chunks == 2 and compactor.fallback_moves == 1
    assert compactor.tokens_copied_one_by_one == moved - 16 and compactor.failed_compactions == 0


def test_the_observer_passes_the_cap_and_counts_a_failed_compaction_as_a_fault(monkeypatch):
    observer = _observer()
    assert observer.compactor is not None
    assert observer.compactor.max_chunk_bytes == observer.settings.compaction_chunk_mib * 2 ** 20
    caches, _, _, row, layout = _filled()
    observer._layout = layout
    monkeypatch.setattr(compactor_module, "choose_keep", _raise)
    observer.guarded("compaction", observer.begin_compaction, _runner(caches, row), _output(observer.compactor, 40))
    assert observer.errors_total == 1 and observer.compactor.recoveries == {"sinks_and_recent": 1}


@pytest.mark.parametrize("shared_prefix", [0, 8])
@pytest.mark.parametrize("previous", [None, "request", "kv_head"])
def test_the_fallback_keep_set_is_choose_keeps_recency(previous, shared_prefix):
    """Without scores, choose_keep keeps the leading protected tokens and the newest: the fallback
    computes the same set without choose_keep (which may be what failed)."""
    generator = torch.Generator().manual_seed(1)
    kept = None
    if previous is not None:
        kept = torch.cat([torch.arange(SINKS), 10 + torch.randperm(50, generator=generator)[:36].sort().values])
        if previous == "kv_head":
            kept = torch.stack([kept, torch.cat([torch.arange(SINKS), torch.arange(24, 60)])])
    positions = slot_positions(kept, 60, 0 if kept is None else 20)
    logical = 60 if kept is None else 80
    for keep in (SINKS + RECENT + shared_prefix, 30, 59):
        expected = choose_keep(positions, None, keep, logical, shared_prefix, SINKS, RECENT)
        fallback = recency_keep(60, keep, max(SINKS, shared_prefix))
        assert expected is not None
        assert torch.equal(expected, fallback.expand_as(expected)), (previous, keep)
