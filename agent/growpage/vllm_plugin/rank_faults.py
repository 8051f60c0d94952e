"""Every tensor-parallel rank's faults, where the scheduler can count them.

Under tensor parallelism every rank runs an observer and a compactor, but only the output rank's
``ModelRunnerOutput`` (rank 0, carrying its :class:`~growpage.vllm_plugin.wire.WorkerReport`) comes
back to the scheduler: a fault caught on another rank used to reach its log and no metric. vLLM's
executor gives a plugin no other channel, and a collective over the tensor-parallel group is ruled
out (a rank that does not reach it hangs every other one, which GrowPage must never cause).

The channel is a *fault board*: a file of one 8-byte slot per rank in shared memory
(``/dev/shm``, else the temporary directory), named by the engine's ``instance_id`` and its local
data-parallel rank so that no two engines on a host share one. Each rank writes its own running
total of caught faults into its own slot (one writer per slot, one aligned ``pwrite``: no lock);
the scheduler reads every slot once a step and counts what grew since its last read in
``growpage_agent_errors_total{component="plugin"}``, as it counts the output rank's report. Either
side may create the file first (workers start before the scheduler); opening never clears a slot.
The scheduler removes it when the engine closes.

Limits: ranks on another host (multi-node tensor parallelism) write their own host's board, which
no scheduler reads; their faults stay in their logs, as before. A board that cannot be opened is
logged once and changes nothing else: faults are still caught and logged.
"""

from __future__ import annotations

import atexit
import logging
import os
import struct
import tempfile
from pathlib import Path

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

SLOT = struct.Struct("<q")  # one rank's running total of caught faults
SHARED_MEMORY = Path("/dev/shm")
OUTPUT_RANK = 0  # its faults ride on its WorkerReport; the board counts the others


def board_path(instance_id: str, data_parallel_rank: int, directory: Path | None = None,
               kind: str = "rank-faults") -> Path:
    """Where one engine's (``VllmConfig.instance_id``, its local data-parallel rank) board of
    ``kind`` lives (this fault board; the keep board's files are named from its own kind)."""
    if directory is None:
        directory = SHARED_MEMORY if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK) \
            else Path(tempfile.gettempdir())
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in instance_id) or "engine"
    return directory / f"growpage-{kind}-{safe}-dp{data_parallel_rank}"


class RankFaultBoard:
    """One slot per rank in a file both the workers and the scheduler open.

    Args:
        path: the board's file (:func:`board_path`); created if absent, never cleared.
        ranks: the tensor-parallel size (slots).

    Raises:
        OSError: the file cannot be opened or sized.
    """

    def __init__(self, path: Path, ranks: int):
        self.path = path
        self.ranks = ranks
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < ranks * SLOT.size:
            os.ftruncate(self._fd, ranks * SLOT.size)  # extends with zeros; a slot already written stays

    def publish(self, rank: int, total: int) -> None:
        """Rank ``rank``'s running total of caught faults (only that rank writes its slot)."""
        os.pwrite(self._fd, SLOT.pack(total), rank * SLOT.size)

    def totals(self) -> list[int]:
        """Every rank's running total, rank order."""
        data = os.pread(self._fd, self.ranks * SLOT.size, 0).ljust(self.ranks * SLOT.size, b"\0")
        return [SLOT.unpack_from(data, rank * SLOT.size)[0] for rank in range(self.ranks)]

    def close(self, *, remove: bool = False) -> None:
        """Close the file (again: nothing); ``remove`` also deletes it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            self.path.unlink(missing_ok=True)


class RankFaultReader:
    """The scheduler's side: faults the other ranks caught since the last read.

    Args:
        board: the engine's board.
    """

    def __init__(self, board: RankFaultBoard):
        self.board = board
        self._seen = [0] * board.ranks
        # the engine core seldom closes its scheduler's agent: the board goes when the process ends
        atexit.register(self.close)

    def new_faults(self) -> dict[int, int]:
        """``{rank: faults}`` caught since the last call by every rank but the output rank (whose
        faults its report carries), only ranks with new ones. A rank's first faults are logged
        here, once, saying where their traceback is."""
        grown = {}
        for rank, total in enumerate(self.board.totals()):
            if rank != OUTPUT_RANK and total > self._seen[rank]:
                if self._seen[rank] == 0:
                    logger.warning("growpage: tensor-parallel rank %d caught a fault, counted in "
                                   "growpage_agent_errors_total{component=\"plugin\"}; that rank's worker log has "
                                   "its traceback (later ones are counted, not logged here)", rank)
                grown[rank] = total - self._seen[rank]
                self._seen[rank] = total
        return grown

    def close(self) -> None:
        atexit.unregister(self.close)
        self.board.close(remove=True)


class RankFaultPublisher:
    """A worker's side: its running total, published on every fault.

    Args:
        board: the engine's board.
        rank: this worker's tensor-parallel rank.
    """

    def __init__(self, board: RankFaultBoard, rank: int):
        self.board = board
        self.rank = rank
        self.total = 0

    def __call__(self, new_faults: int = 1) -> None:
        self.total += new_faults
        self.board.publish(self.rank, self.total)


def open_board(instance_id: str, data_parallel_rank: int, ranks: int) -> RankFaultBoard | None:
    """The engine's board, or None where there is nothing to carry (one rank) or it cannot be
    opened (logged once; the faults still reach this process's log)."""
    if ranks <= 1:
        return None
    path = board_path(instance_id, data_parallel_rank)
    try:
        return RankFaultBoard(path, ranks)
    except OSError:
        logger.warning("growpage: cannot open the tensor-parallel fault board %s; faults caught on ranks other "
                       "than 0 are logged there but not counted in growpage_agent_errors_total", path,
                       exc_info=True)
        return None


def engine_identity(vllm_config: object) -> tuple[str, int, int]:
    """``(instance_id, local data-parallel rank, tensor-parallel size)`` of the engine ``vllm_config``
    describes (read duck-typed): what names its boards and sizes them."""
    parallel = getattr(vllm_config, "parallel_config", None)
    return (str(getattr(vllm_config, "instance_id", "") or ""),
            int(getattr(parallel, "data_parallel_rank_local", 0) or 0),
            int(getattr(parallel, "tensor_parallel_size", 1) or 1))


def board_for(vllm_config: object) -> RankFaultBoard | None:
    """The fault board of the engine ``vllm_config`` describes, or None under one tensor-parallel rank."""
    return open_board(*engine_identity(vllm_config))
