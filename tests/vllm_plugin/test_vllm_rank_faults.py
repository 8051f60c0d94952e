"""The tensor-parallel fault board: a fault caught on a rank whose report never reaches the scheduler
is still counted there. Real files and real processes (one per rank), as vLLM's workers are."""

from __future__ import annotations

import logging
import multiprocessing
import types
from pathlib import Path

import pytest

from growpage.vllm_plugin import rank_faults
from growpage.vllm_plugin.observer import _Counts
from growpage.vllm_plugin.rank_faults import (
    RankFaultBoard,
    RankFaultPublisher,
    RankFaultReader,
    board_for,
    board_path,
    open_board,
)

RANKS = 3


def _worker(path: str, rank: int, faults: int) -> None:
    """A worker process: opens the board (before the scheduler, as vLLM's workers start first) and
    publishes its faults one at a time."""
    publisher = RankFaultPublisher(RankFaultBoard(Path(path), RANKS), rank)
    for _ in range(faults):
        publisher()


def _run_workers(path: Path, faults_by_rank: dict[int, int]) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_worker, args=(str(path), rank, faults))
               for rank, faults in faults_by_rank.items()]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0


def test_the_scheduler_counts_what_other_ranks_caught_since_its_last_read(tmp_path, caplog):
    path = board_path("1733400000000000000", 0, directory=tmp_path)
    _run_workers(path, {1: 2, 2: 5})  # the workers write before the scheduler opens the board
    reader = RankFaultReader(RankFaultBoard(path, RANKS))  # opening never clears what they wrote
    with caplog.at_level(logging.WARNING, logger="vllm.growpage"):
        assert reader.new_faults() == {1: 2, 2: 5}
        assert reader.new_faults() == {}  # counted once
        _run_workers(path, {0: 4})  # the output rank's faults ride on its report: not counted twice
        assert reader.new_faults() == {}
        publisher = RankFaultPublisher(RankFaultBoard(path, RANKS), 2)
        publisher.total = 5  # the same worker, still running
        publisher(3)
        assert reader.new_faults() == {2: 3}
    named = [record.getMessage() for record in caplog.records if "caught a fault" in record.getMessage()]
    assert len(named) == 2 and "rank 1 " in named[0] and "rank 2 " in named[1]  # once per rank, never again
    reader.close()
    assert not path.exists()
    reader.board.close(remove=True)  # closing again changes nothing


def test_each_engine_has_its_own_board_and_one_rank_needs_none(tmp_path):
    assert board_path("123", 0, tmp_path) != board_path("124", 0, tmp_path) != board_path("123", 1, tmp_path)
    assert board_path("../etc/x", 0, tmp_path).parent == tmp_path  # the engine's id cannot leave the directory
    one_rank = types.SimpleNamespace(instance_id="9", parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
    assert board_for(one_rank) is None


def test_a_board_that_cannot_open_is_logged_and_changes_nothing_else(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(rank_faults, "board_path", lambda *args: tmp_path / "missing" / "board")
    with caplog.at_level(logging.WARNING, logger="vllm.growpage"):
        assert open_board("7", 0, RANKS) is None
    assert "cannot open the tensor-parallel fault board" in caplog.text


def test_a_worker_publishes_every_fault_and_a_failing_board_costs_only_the_count():
    published: list[int] = []
    counts = _Counts(publish=published.append)
    counts.count_error()
    counts.count_error()
    assert counts.errors == 2 and published == [1, 1]

    def broken(_faults: int) -> None:
        raise OSError("no space left on device")

    counts = _Counts(publish=broken)
    counts.count_error()  # never raised into the worker
    assert counts.errors == 1


@pytest.mark.parametrize(("injection", "rank", "fails"), [
    ("report@rank2", 2, True), ("report@rank2", 0, False), ("report", 1, True), ("observe@rank2", 2, False)])
def test_a_reports_fault_can_be_injected_on_one_rank(injection, rank, fails):
    from test_vllm_plugin_units import _observer

    observer = _observer(fault_injection=injection)
    observer.rank = rank
    assert (observer.guarded("report", observer.take_report) is None) == fails
    assert observer.errors_total == int(fails)
