"""One keep set for every tensor-parallel rank, ranked by every rank's attention.

Under tensor parallelism each rank observes only its own heads, so each rank's ranking of a
request's tokens differs, and so would its survivors: the block tables agree (the plan fixes how
many tokens survive and in which slots), but rank 0 would keep the tokens its heads attend to and
rank 1 others. A *keep board* makes them agree without a collective (a rank that never reaches an
all-reduce inside a plugin hook hangs every other rank, which GrowPage must never cause).

When a step's plans arrive, every rank

1. ranks each planned request's tokens from its own observations (``{request_id: scores}``);
2. publishes those rankings in its own file of the board (shared memory: ``/dev/shm``, else the
   temporary directory; named by the engine's ``instance_id``, its local data-parallel rank and
   the rank), written whole and renamed into place, so a reader sees one step's file or another's,
   never half of one;
3. reads every other rank's file for the same step (the *step key*: a digest of the step's plans,
   which every rank receives identically) and ranks each request by the sum of every rank's scores,
   in rank order, so every rank computes the same sum and :func:`choose_keep` the same survivors.

Step 3 waits at most :data:`WAIT_S` for a rank whose file does not show this step yet (ranks run
a step's forward in lockstep, so a rank lags by its last step's bookkeeping: milliseconds). A rank
that misses the wait is *late*: this step goes on with the rankings that arrived, its keep sets may
differ from that rank's (the slots still agree), it is reported (:class:`Shared.late`), and later
steps wait for that rank only :data:`LATE_GRACE_S` until its file shows their step again, so a rank
that never publishes (its observer never started) costs one full wait, not one per compaction,
and a rank that was late once is read again as soon as it keeps up. A request whose positions
differ between ranks (after such a step) sums only the rankings over the same positions, for the
rest of its life (reported as unaligned).

Why a file can be overwritten safely: a rank writes step ``t+1``'s file only after step ``t``'s
forward, whose collectives every rank enters only after reading step ``t``'s files.

Only one-dimensional rankings (one keep set per request) are shared: per-KV-head keep sets
(``keep_sets: kv_head``) are each head's own by design. Limits: ranks on another host (multi-node
tensor parallelism) see no one's file and keep their own sets, counted as late.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from growpage.vllm_plugin.rank_faults import board_path, engine_identity

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

WAIT_S = 2.0  # the longest a rank waits for another's rankings of one step (they lag by milliseconds)
# how long a rank still waits for one that was late before: long enough for a rank a few
# milliseconds behind to catch up (else it would never be read again), short enough to cost nothing
LATE_GRACE_S = 0.05
POLL_S = 0.0005
_HEADER = struct.Struct("<8sI")  # step key, requests
_ENTRY = struct.Struct("<H8sI")  # request id bytes, positions digest, scores


def step_key(plans: Mapping[str, object]) -> bytes:
    """A digest of one step's plans, the same on every rank (they receive the same payload)."""
    digest = hashlib.blake2b(digest_size=8)
    for request_id in sorted(plans):
        digest.update(f"{request_id}\0{plans[request_id]!r}\0".encode())
    return digest.digest()


def positions_digest(positions: torch.Tensor) -> bytes:
    """What a ranking is over: the logical position of each physical slot."""
    return hashlib.blake2b(positions.to(torch.int64).numpy().tobytes(), digest_size=8).digest()


@dataclass(frozen=True)
class Ranking:
    """One rank's ranking of one request: ``scores[i]`` is slot ``i``'s, over ``positions``."""

    positions: bytes  # :func:`positions_digest`
    scores: torch.Tensor  # [P] float32, on the host


@dataclass(frozen=True)
class Shared:
    """The step's rankings as every rank sums them.

    Attributes:
        scores: ``{request_id: summed scores}`` for every request some rank ranked over this
            rank's positions (a request no rank observed is absent: recency ranks it everywhere).
        late: ranks whose rankings of this step did not arrive (their keep sets may differ).
        unaligned: requests some other rank ranked over other positions (left out of the sum).
    """

    scores: dict[str, torch.Tensor]
    late: tuple[int, ...] = ()
    unaligned: tuple[str, ...] = field(default=())


def encode(key: bytes, rankings: Mapping[str, Ranking]) -> bytes:
    parts = [_HEADER.pack(key, len(rankings))]
    for request_id, ranking in rankings.items():
        name = request_id.encode()
        values = ranking.scores.to(torch.float32).contiguous()
        parts += [_ENTRY.pack(len(name), ranking.positions, values.numel()), name, values.numpy().tobytes()]
    return b"".join(parts)


def decode(data: bytes) -> tuple[bytes, dict[str, Ranking]]:
    """``(step key, rankings)`` of one rank's file (raises on a malformed one)."""
    key, count = _HEADER.unpack_from(data, 0)
    offset, rankings = _HEADER.size, {}
    for _ in range(count):
        length, positions, numel = _ENTRY.unpack_from(data, offset)
        offset += _ENTRY.size
        request_id = data[offset:offset + length].decode()
        offset += length
        end = offset + 4 * numel
        if end > len(data):
            raise ValueError("truncated keep-board file")
        scores = torch.frombuffer(bytearray(data[offset:end]), dtype=torch.float32) if numel else torch.zeros(0)
        rankings[request_id] = Ranking(positions, scores)
        offset = end
    return key, rankings


class KeepBoard:
    """One rank's view of the engine's keep board.

    Args:
        prefix: the board's files are ``<prefix>-rank<r>``.
        rank: this rank.
        ranks: the tensor-parallel size.
        wait_s: the longest :meth:`exchange` waits for another rank's file of the step.
        clock: seconds (tests pass their own).
    """

    def __init__(self, prefix: Path, rank: int, ranks: int, wait_s: float = WAIT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.prefix, self.rank, self.ranks = prefix, rank, ranks
        self.wait_s, self._clock = wait_s, clock
        self._late: set[int] = set()  # ranks not waited for, until their file shows the current step
        atexit.register(self.close)

    def path(self, rank: int) -> Path:
        return self.prefix.with_name(f"{self.prefix.name}-rank{rank}")

    def publish(self, key: bytes, rankings: Mapping[str, Ranking]) -> None:
        """This rank's rankings of the step ``key``, written whole, then renamed into place."""
        target = self.path(self.rank)
        staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            staging.write_bytes(encode(key, rankings))
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)  # a write that failed (shared memory full) leaves nothing

    def _read(self, rank: int, key: bytes) -> dict[str, Ranking] | None:
        """Rank ``rank``'s rankings of the step ``key``; None while its file shows another step (its
        header is read first: a poll of another step's file reads 12 bytes, not the rankings)."""
        try:
            with self.path(rank).open("rb") as handle:  # one file: a replacement does not change it
                header = handle.read(_HEADER.size)
                if header[:len(key)] != key:
                    return None
                found, rankings = decode(header + handle.read())
        except (OSError, ValueError, struct.error):  # not written yet, or torn
            return None
        return rankings if found == key else None

    def exchange(self, key: bytes, rankings: Mapping[str, Ranking], positions: Mapping[str, bytes]) -> Shared:
        """Publish ``rankings`` for the step ``key`` and sum every rank's over this rank's
        ``positions`` (``{request_id: positions_digest}`` of every request it can compact; see the
        module docstring)."""
        self.publish(key, rankings)
        # its own as the others read them (float32), so every rank sums exactly the same numbers
        own = {request_id: Ranking(r.positions, r.scores.to(torch.float32)) for request_id, r in rankings.items()}
        by_rank: dict[int, Mapping[str, Ranking]] = {self.rank: own}
        waiting = [rank for rank in range(self.ranks) if rank != self.rank]
        started = self._clock()
        while waiting:
            for rank in list(waiting):
                found = self._read(rank, key)
                if found is not None:
                    by_rank[rank] = found
                    waiting.remove(rank)
                    self._late.discard(rank)
            patience = LATE_GRACE_S if all(rank in self._late for rank in waiting) else self.wait_s
            if not waiting or self._clock() - started >= min(patience, self.wait_s):
                break
            time.sleep(POLL_S)
        for rank in waiting:
            if rank not in self._late:
                logger.warning("growpage: tensor-parallel rank %d did not publish its token rankings within %.1f s; "
                               "this rank keeps tokens by the rankings that arrived, so the ranks' keep sets may "
                               "differ (later steps wait for it only briefly until it catches up)", rank, self.wait_s)
            self._late.add(rank)
        return sum_rankings(positions, by_rank, tuple(waiting))

    def close(self) -> None:
        """Remove this rank's file (each rank removes its own)."""
        atexit.unregister(self.close)
        self.path(self.rank).unlink(missing_ok=True)


def sum_rankings(positions: Mapping[str, bytes], by_rank: Mapping[int, Mapping[str, Ranking]],
                 late: tuple[int, ...] = ()) -> Shared:
    """Each of ``positions``' requests' scores summed over the ranks that ranked it over the same
    positions, in rank order (every rank sums the same floats in the same order: the same result,
    and the same survivors). A request no rank ranked is left out (recency ranks it everywhere)."""
    scores: dict[str, torch.Tensor] = {}
    unaligned: list[str] = []
    for request_id in sorted(positions):
        entries = [by_rank[rank][request_id] for rank in sorted(by_rank) if request_id in by_rank[rank]]
        aligned = [ranking.scores for ranking in entries if ranking.positions == positions[request_id]]
        if len(aligned) < len(entries):
            unaligned.append(request_id)
        if not aligned:
            continue
        total = aligned[0].clone()
        for more in aligned[1:]:
            total += more
        scores[request_id] = total
    return Shared(scores, late, tuple(unaligned))


def open_keep_board(instance_id: str, data_parallel_rank: int, rank: int, ranks: int) -> KeepBoard | None:
    """This rank's keep board, or None under one rank or where shared memory cannot hold it (logged
    once: the ranks then keep their own sets, as without a board)."""
    if ranks <= 1:
        return None
    prefix = board_path(instance_id, data_parallel_rank, kind="keep-sets")
    try:
        probe = prefix.with_name(f"{prefix.name}-probe{rank}")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        logger.warning("growpage: cannot write the tensor-parallel keep board under %s; each rank keeps tokens by "
                       "the heads it observes", prefix.parent, exc_info=True)
        return None
    return KeepBoard(prefix, rank, ranks)


def keep_board_for(vllm_config: object, rank: int) -> KeepBoard | None:
    """The keep board of the engine ``vllm_config`` describes, for ``rank``."""
    instance_id, data_parallel_rank, ranks = engine_identity(vllm_config)
    return open_keep_board(instance_id, data_parallel_rank, rank, ranks)

