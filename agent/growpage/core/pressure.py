"""Pool pressure: does the pool hold this step's growth and the next admission, and if not, whom to compress.

Pure arithmetic over small frozen records (no engine, no tensors), used by the homes before their
engine's own preemption can run:

- :func:`measure_pressure`: the pool's headroom against the pages the running requests need this
  step and the pages the oldest waiting request needs to be admitted (admission only while every
  running request's floor still fits: ``base_pages`` protects a running request, so GrowPage never
  admits a request whose floor would push another below its own);
- :func:`plan_reclaim`: which running requests compress, and to how many pages, to cover a
  deficit. Requests with the lowest LTS entropy go first (attention concentrated on few tokens:
  evicting the unattended ones costs least), then those holding the most pages above their floor.
  No request goes below its floor; what cannot be covered is left to the engine's preemption.

Page counts follow the compaction contract of the homes: a request compacted to ``pages_after``
pages keeps ``pages_after - 1`` full pages and takes one fresh page for its next token, so it
frees ``pages_held - pages_after + 1`` pages now and needs one page this step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def protected_tokens(physical_tokens: int, shared_prefix_tokens: int, sink_tokens: int,
                     recent_window_tokens: int) -> int:
    """How many of a request's physical tokens a compaction must keep.

    Sinks and shared-prefix tokens sit at the start (they were never dropped), the recent window at
    the end (its tokens were always inside the window when earlier compactions ran).
    """
    head = max(shared_prefix_tokens, sink_tokens)
    return min(physical_tokens, head + recent_window_tokens)


def floor_pages(base_pages: int, protected: int, block_size: int, attention_tokens: int = 0) -> int:
    """The fewest pages a running request may be compressed to: its ``base_pages``, and never fewer
    than its protected tokens (or the tokens its observed attention needs, ``attention_coverage``,
    if more) plus the page its next token takes. The one floor both homes use (pressure relief,
    boundary evictions, the headroom a router sees)."""
    return max(base_pages, -(-max(protected, attention_tokens) // block_size) + 1)


@dataclasses.dataclass(frozen=True)
class PoolPressure:
    """The pool at the start of a step.

    Attributes:
        free_pages: pages no request holds.
        growth_pages: pages running requests need this step (those whose last page is full).
        admission_pages: pages the oldest waiting request needs to be admitted (0: none waits, the
            batch is full, or admitting it would break a running request's floor).
    """

    free_pages: int
    growth_pages: int
    admission_pages: int

    @property
    def deficit_pages(self) -> int:
        """Pages missing to grow everyone this step and admit the next request (0: no pressure)."""
        return max(0, self.growth_pages + self.admission_pages - self.free_pages)

    @property
    def under_pressure(self) -> bool:
        return self.deficit_pages > 0


def measure_pressure(*, free_pages: int, total_pages: int, growth_pages: int, running_floor_pages: int,
                     waiting_prompt_pages: int | None, waiting_floor_pages: int, batch_full: bool) -> PoolPressure:
    """The pressure a step starts under.

    Args:
        free_pages, total_pages: the pool now, and its size.
        growth_pages: pages running requests need this step.
        running_floor_pages: the sum of the running requests' floors (``max(base_pages, prompt)``).
        waiting_prompt_pages: pages the oldest waiting request's prompt needs, or None if none waits.
        waiting_floor_pages: that request's floor once running.
        batch_full: the engine runs as many requests as it may (``max_num_seqs``).
    """
    admission = 0
    if (waiting_prompt_pages is not None and not batch_full
            and running_floor_pages + waiting_floor_pages <= total_pages):
        admission = waiting_prompt_pages
    return PoolPressure(free_pages=free_pages, growth_pages=growth_pages, admission_pages=admission)


@dataclasses.dataclass(frozen=True)
class ReclaimCandidate:
    """A running request that could be compacted now.

    Attributes:
        request_id: the request.
        pages_held: pages it holds.
        floor_pages: the fewest pages it may be left with (its floor, and enough for its protected
            tokens plus the page its next token takes).
        lts_entropy: its long-term attention entropy (nats).
        needs_page: whether it needs a fresh page this step anyway (its last page is full).
    """

    request_id: str
    pages_held: int
    floor_pages: int
    lts_entropy: float
    needs_page: bool


@dataclasses.dataclass(frozen=True)
class Reclaim:
    """Compact ``request_id`` to ``pages_after`` pages (see the module docstring); frees ``pages_gained``
    net of the page it then needs."""

    request_id: str
    pages_after: int
    pages_gained: int


def plan_reclaim(deficit_pages: int, candidates: Sequence[ReclaimCandidate]) -> list[Reclaim]:
    """Compactions that cover ``deficit_pages`` (or as much of it as the floors allow)."""
    order = sorted(candidates, key=lambda c: (c.lts_entropy, -(c.pages_held - c.floor_pages), c.request_id))
    plan: list[Reclaim] = []
    remaining = deficit_pages
    for candidate in order:
        if remaining <= 0:
            break
        already_needed = 1 if candidate.needs_page else 0
        pages_after = max(candidate.floor_pages, candidate.pages_held + already_needed - remaining)
        gained = candidate.pages_held - pages_after + already_needed
        if gained <= 0:
            continue
        plan.append(Reclaim(candidate.request_id, pages_after, gained))
        remaining -= gained
    return plan
