"""Growth-aware admission: start a waiting request only when the batch's KV still fits at its end.

vLLM admits a waiting request whenever its prompt fits the free pages now. Decoding requests keep
growing, so a batch admitted on prompts alone outgrows the pool and vLLM preempts (recomputes) the
newest requests, again and again: the thrash a smaller ``max_num_seqs`` avoids on one trace and
not on the next. Admission here looks ahead instead: each running request is projected to the
pages it will hold when it ends, each waiting request likewise, and waiting requests start in
queue order while the projected total fits the pool.

A projection is the request's tokens now plus the tokens still to come: ``output_share`` of what
its ``max_tokens`` still allows. Under enforce a request's KV is held below full KV, so its peak
is ``kept_share`` of full KV's, never below what it holds now: the room GrowPage's compression
makes is what admits the wider batch. Both shares are learned from requests that finished
(:class:`CompletionHistory`): a high quantile of recent ones, so a few short answers do not
over-admit; until enough have finished both are 1 (every request may use its ``max_tokens``,
no compression assumed), which is what a preemption-free ``max_num_seqs`` plans for.

Pure arithmetic and one small history; the vLLM home (:mod:`growpage.vllm_plugin.admission`)
reads its scheduler into :class:`KVDemand` records and carries the answer out.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

from growpage.core.quantiles import percentile

HISTORY_REQUESTS = 64  # finished requests the shares are learned from (the newest)
MIN_FINISHED = 4  # finished requests before a learned share replaces the prior of 1
SHARE_QUANTILE = 0.9  # a high quantile: an over-admitted batch preempts, an under-admitted one only waits


@dataclasses.dataclass(frozen=True)
class KVDemand:
    """One request's KV as admission projects it.

    Attributes:
        request_id: the request.
        pages_now: pages it holds now (0 for a waiting request that holds none).
        peak_pages: pages it is projected to hold when it ends (at least ``pages_now``).
    """

    request_id: str
    pages_now: int
    peak_pages: int


def full_peak_tokens(tokens_now: int, output_tokens: int, max_tokens: int, output_share: float) -> int:
    """Tokens a request will hold under full KV when it ends: its tokens now plus ``output_share``
    of the output its ``max_tokens`` still allows."""
    to_come = max(0, max_tokens - output_tokens) * output_share
    return tokens_now + math.ceil(to_come - 1e-9)


def projected_demand(request_id: str, *, pages_now: int, peak_tokens: int, block_size: int,
                     kept_share: float = 1.0) -> KVDemand:
    """A request's demand: its full-KV peak in pages, times ``kept_share`` where it is compressed
    (enforced), never below what it holds now."""
    full_pages = math.ceil(peak_tokens / block_size)
    kept_pages = math.ceil(full_pages * kept_share - 1e-9)
    return KVDemand(request_id, pages_now, max(pages_now, kept_pages))


def admissible(running: Sequence[KVDemand], waiting: Sequence[KVDemand], total_pages: int) -> int:
    """How many of ``waiting`` (in queue order) may start now: while the running requests' projected
    peaks and theirs fit ``total_pages``. An empty batch always takes its first request (a request
    larger than the pool is vLLM's to refuse, not admission's to starve)."""
    committed = sum(demand.peak_pages for demand in running)
    admitted = 0
    for demand in waiting:
        if committed + demand.peak_pages > total_pages and (running or admitted):
            break
        committed += demand.peak_pages
        admitted += 1
    return admitted


@dataclasses.dataclass(frozen=True)
class Shares:
    """The learned shares (1.0 until :data:`MIN_FINISHED` requests finished)."""

    output_share: float = 1.0
    kept_share: float = 1.0
    finished: int = 0


class CompletionHistory:
    """What finished requests used: output against ``max_tokens``, peak pages against full KV's.

    Bounded (the newest :data:`HISTORY_REQUESTS`), so the shares follow the traffic as it changes.
    """

    def __init__(self, history: int = HISTORY_REQUESTS) -> None:
        self._output: collections.deque[float] = collections.deque(maxlen=history)
        self._kept: collections.deque[float] = collections.deque(maxlen=history)
        self.finished = 0

    def record(self, *, output_tokens: int, max_tokens: int, peak_pages: int | None = None,
               full_pages: int | None = None) -> None:
        """A request finished with ``output_tokens`` of its ``max_tokens``; an enforced one also gives
        the most pages it held (``peak_pages``) against the pages full KV would have needed."""
        if max_tokens <= 0:
            return
        self.finished += 1
        self._output.append(min(1.0, max(0.0, output_tokens / max_tokens)))
        if peak_pages is not None and full_pages:
            self._kept.append(min(1.0, max(0.0, peak_pages / full_pages)))

    def shares(self) -> Shares:
        return Shares(_learned(self._output), _learned(self._kept), self.finished)


def _learned(samples: Sequence[float]) -> float:
    if len(samples) < MIN_FINISHED:
        return 1.0
    value = percentile(samples, SHARE_QUANTILE)
    return 1.0 if value is None else value
