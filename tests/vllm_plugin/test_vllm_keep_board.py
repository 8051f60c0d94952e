"""One keep set for every tensor-parallel rank: each rank ranks a request's tokens from its own heads,
and the keep board makes every rank keep the same ones. Real files and real processes (one per
rank, forked, as vLLM's workers are), each with its own compactor and its own cache."""

from __future__ import annotations

import logging
import multiprocessing
import types
from pathlib import Path

import pytest
import torch
from test_vllm_backend_layouts import HEADS
from test_vllm_compaction_safety import SINKS, TOKENS, _compactor, _filled, _output, _runner

from growpage.vllm_plugin import keep_board as keep_board_module
from growpage.vllm_plugin.compaction import choose_keep
from growpage.vllm_plugin.compactor import KeepSetsNotShared
from growpage.vllm_plugin.keep_board import (
    KeepBoard,
    Ranking,
    decode,
    encode,
    keep_board_for,
    positions_digest,
    step_key,
    sum_rankings,
)
from growpage.vllm_plugin.wire import CompactionPlan

RANKS = 3
KEEP = 14  # 4 sinks + 8 recent + 2 chosen by attention
HEAVY = {0: (10, 5.0), 1: (15, 4.0), 2: (20, 3.0)}  # each rank's heads attend to a different token


def _rank_scores(rank: int) -> torch.Tensor:
    scores = torch.zeros(TOKENS)
    token, weight = HEAVY[rank]
    scores[token] = weight
    return scores


def _compact_on_rank(prefix: str | None, rank: int, ranks: int, wait_s: float, results) -> None:
    """One rank: its own cache, its own heads' scores, the step's plan; sends back what it kept."""
    # a forked child has none of the parent's OpenMP threads: once the parent has run a parallel
    # region (any earlier test in this process), the child's first one waits for them forever
    torch.set_num_threads(1)
    caches, _, _, row, layout = _filled()
    board = KeepBoard(Path(prefix), rank, ranks, wait_s=wait_s) if prefix else None
    compactor = _compactor(rank=rank, keep_board=board)
    compactor.add_scores("r", _rank_scores(rank))
    error = None
    try:
        compactor.begin_step(_runner(caches, row), _output(compactor, keep=KEEP), layout)
    except KeepSetsNotShared as caught:
        error = str(caught)
    results.put((rank, compactor.kept_positions["r"].tolist(), compactor.compactions, error))


def _run_ranks(prefix: Path | None, ranks_running: list[int], ranks: int = RANKS, wait_s: float = 30.0) -> dict:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_compact_on_rank, args=(str(prefix) if prefix else None, rank, ranks, wait_s,
                                                               results))
               for rank in ranks_running]
    for worker in workers:
        worker.start()
    found = {}
    for _ in workers:
        rank, kept, compactions, error = results.get(timeout=120)
        found[rank] = {"kept": kept, "compactions": compactions, "error": error}
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    return found


def _expected(scores: torch.Tensor) -> list[int]:
    keep_index = choose_keep(torch.arange(TOKENS), scores, KEEP, TOKENS, 0, SINKS, 8)
    assert keep_index is not None
    return keep_index.tolist()


def test_every_rank_keeps_the_tokens_all_ranks_heads_attend_to(tmp_path):
    found = _run_ranks(tmp_path / "growpage-keep-sets-engine-dp0", list(range(RANKS)))
    summed = sum(_rank_scores(rank) for rank in range(RANKS))
    assert all(found[rank]["kept"] == found[0]["kept"] for rank in range(RANKS)), found
    assert found[0]["kept"] == _expected(summed)
    assert {10, 15} <= set(found[0]["kept"]) and 20 not in found[0]["kept"]  # the two heaviest over all heads
    assert all(found[rank]["compactions"] == 1 and found[rank]["error"] is None for rank in range(RANKS))
    # without the board each rank keeps what its own heads attend to: the sets differ
    alone = _run_ranks(None, list(range(RANKS)))
    assert HEAVY[1][0] in alone[1]["kept"] and HEAVY[1][0] not in alone[0]["kept"], alone
    assert alone[0]["kept"] != alone[1]["kept"]


def test_a_rank_that_never_publishes_costs_one_wait_and_is_reported(tmp_path, monkeypatch, caplog):
    prefix = tmp_path / "growpage-keep-sets-engine-dp0"
    # rank 1 published (and, waiting on the others, went on alone); a forked worker leaves by
    # os._exit, which runs no atexit, so its file stays for rank 0 to read
    _run_ranks(prefix, [1], wait_s=0.5)
    sleeps = []
    monkeypatch.setattr(keep_board_module.time, "sleep", lambda seconds: sleeps.append(seconds))
    clock = iter(range(1000))
    board = KeepBoard(prefix, 0, RANKS, wait_s=5, clock=lambda: float(next(clock)))
    caches, _, _, row, layout = _filled()
    compactor = _compactor(keep_board=board)
    compactor.add_scores("r", _rank_scores(0))
    with caplog.at_level(logging.WARNING, logger="vllm.growpage"), \
            pytest.raises(KeepSetsNotShared, match=r"late ranks \[2\]"):
        compactor.begin_step(_runner(caches, row), _output(compactor, keep=KEEP), layout)
    # rank 1's rankings of the same step arrived and were summed; rank 2's never did
    assert compactor.kept_positions["r"].tolist() == _expected(_rank_scores(0) + _rank_scores(1))
    assert compactor.compactions == 1 and 0 < len(sleeps) <= 5
    assert [r.getMessage() for r in caplog.records if "rank 2 did not publish" in r.getMessage()]
    sleeps.clear()
    KeepBoard(prefix, 1, RANKS).publish(b"nextstep", {})  # rank 1 keeps up; rank 2 still never publishes
    assert board.exchange(b"nextstep", {}, {}).late == (2,)
    assert sleeps == []  # rank 2 is not waited for again (beyond a short grace)
    for rank in (1, 2):  # once it keeps up, it is read again
        KeepBoard(prefix, rank, RANKS).publish(b"stepnum3", {})
    assert board.exchange(b"stepnum3", {}, {}).late == ()


def test_per_kv_head_rankings_stay_each_heads_own(tmp_path):
    """keep_sets: kv_head: a request's first compaction has one row of positions but a head axis of
    scores; nothing of it goes on the board, and each head keeps its own heavy hitter."""
    caches, _, _, row, layout = _filled()
    board = KeepBoard(tmp_path / "growpage-keep-sets-engine-dp0", 0, 2, wait_s=0)
    compactor = _compactor(keep_board=board)
    scores = torch.zeros(HEADS, TOKENS)
    scores[0, 10], scores[1, 20] = 5.0, 5.0
    compactor.add_scores("r", scores)
    with pytest.raises(KeepSetsNotShared, match=r"late ranks \[1\]"):  # rank 1 never runs here
        compactor.begin_step(_runner(caches, row), _output(compactor, keep=KEEP), layout)
    assert decode(board.path(0).read_bytes())[1] == {}
    kept = compactor.kept_positions["r"]
    assert kept.dim() == 2 and 10 in kept[0].tolist() and 20 in kept[1].tolist()


def test_an_exchange_that_fails_leaves_each_rank_its_own_heads_choice_and_is_counted(tmp_path):
    caches, _, _, row, layout = _filled()
    board = KeepBoard(tmp_path / "missing-directory" / "growpage-keep-sets", 0, RANKS, wait_s=0)
    compactor = _compactor(keep_board=board)
    compactor.add_scores("r", _rank_scores(0))
    with pytest.raises(KeepSetsNotShared, match="FileNotFoundError"):
        compactor.begin_step(_runner(caches, row), _output(compactor, keep=KEEP), layout)
    assert compactor.kept_positions["r"].tolist() == _expected(_rank_scores(0))
    assert compactor.compactions == 1 and compactor.failed_compactions == 0  # compacted all the same


def test_rankings_over_other_positions_are_left_out_of_the_sum():
    here, there = positions_digest(torch.arange(8)), positions_digest(torch.arange(1, 9))
    by_rank = {0: {"a": Ranking(here, torch.ones(8))}, 1: {"a": Ranking(there, torch.full((8,), 2.0))},
               2: {"a": Ranking(here, torch.full((8,), 3.0)), "b": Ranking(here, torch.ones(8))}}
    shared = sum_rankings({"a": here, "b": here, "c": here}, by_rank)
    assert shared.scores["a"].tolist() == [4.0] * 8 and shared.unaligned == ("a",)
    assert shared.scores["b"].tolist() == [1.0] * 8  # only rank 2 observed it: its ranking, everywhere
    assert "c" not in shared.scores  # no rank observed it: recency, everywhere


def test_a_file_round_trips_and_a_torn_or_foreign_one_is_not_read(tmp_path):
    rankings = {"req-1": Ranking(positions_digest(torch.arange(3)), torch.tensor([0.5, 0.25, 1.0])),
                "req-2": Ranking(positions_digest(torch.arange(0)), torch.zeros(0))}
    key, back = decode(encode(b"stepkey1", rankings))
    assert key == b"stepkey1" and back.keys() == rankings.keys()
    assert back["req-1"].scores.tolist() == [0.5, 0.25, 1.0] and back["req-1"].positions == rankings["req-1"].positions
    with pytest.raises(ValueError, match="truncated"):
        decode(encode(b"stepkey1", rankings)[:-4])
    board = KeepBoard(tmp_path / "growpage-keep-sets-x-dp0", 1, 2)
    board.publish(b"stepkey1", rankings)
    reader = KeepBoard(tmp_path / "growpage-keep-sets-x-dp0", 0, 2)
    assert reader._read(1, b"stepkey1") is not None and reader._read(1, b"otherkey") is None
    board.path(1).write_bytes(encode(b"stepkey1", rankings)[:-4])
    assert reader._read(1, b"stepkey1") is None
    board.close()
    assert not board.path(1).exists()


def test_the_step_key_is_the_plans_and_the_board_is_per_engine_and_rank():
    plan = CompactionPlan(physical_tokens=70, keep_tokens=40, logical_length=70, shared_prefix_tokens=0,
                          dropped=30, prompt_tokens=5)
    other = CompactionPlan(physical_tokens=70, keep_tokens=41, logical_length=70, shared_prefix_tokens=0,
                           dropped=29, prompt_tokens=5)
    assert step_key({"a": plan, "b": other}) == step_key({"b": other, "a": plan})
    assert step_key({"a": plan}) != step_key({"a": other}) != step_key({"b": other})
    config = types.SimpleNamespace(instance_id="abc", parallel_config=types.SimpleNamespace(
        tensor_parallel_size=3, data_parallel_rank_local=1))
    board = keep_board_for(config, 2)
    assert board is not None and board.path(2).name == "growpage-keep-sets-abc-dp1-rank2"
    assert keep_board_for(types.SimpleNamespace(instance_id="abc", parallel_config=types.SimpleNamespace(
        tensor_parallel_size=1)), 0) is None  # one rank: nothing to share
