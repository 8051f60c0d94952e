"""KV headroom and the load a router compares replicas by: pure arithmetic over plain records.

A router in front of several replicas (vLLM's router with ``power_of_two`` polls ``GET /get_load``
and sends each request to the lower of two) should send work where it runs without preemption. A
GrowPage replica has two kinds of room for it:

- **free pages**: pages no request holds;
- **reclaimable pages**: pages GrowPage could free by compressing the running requests it
  enforces, each no lower than its floor (:func:`growpage.core.step_control.floor_pages`, over
  :func:`growpage.core.step_control.protected_tokens`: the floor pressure relief and boundary evictions
  use, so the router is never promised pages GrowPage would refuse to free). A request in
  ``monitor`` or ``off``, or one whose blocks are shared past its leading prefix run, is never
  compressed, so it adds nothing.

``headroom = free + reclaimable`` is what :func:`headroom` returns, in pages. The load turns it
into one integer a router can compare across replicas of different sizes:

``load = ceil(100 * (running + waiting) / max(1, running + headroom // pages_per_request))``

where ``pages_per_request`` is the mean pages a running request holds (``base_pages`` when none
runs). The denominator is how many requests the replica can hold without preempting: those it
runs plus those its headroom fits at today's size per request. The load is the percent of that
capacity taken by the requests it runs or queues: 0 idle, 100 full, above 100 it queues (and,
without room to reclaim, preempts). Why this shape:

- a replica with a small KV space fills its capacity sooner, so it reads higher with the same
  number of requests (a plain request count, the router's fallback, cannot tell the two apart);
- compression shows up twice, as reclaimable pages and as smaller requests, which is what makes
  GrowPage's room elastic;
- percent keeps integer resolution (the router parses an integer) and outweighs the router's own
  in-flight counter, which it adds to the polled load and which then only breaks ties.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from growpage.core.step_control import floor_pages, protected_tokens


@dataclasses.dataclass(frozen=True)
class RunningKV:
    """One running request's KV, as the home sees it.

    Attributes:
        pages_held: pages (blocks) it holds.
        physical_tokens: tokens its pages hold (its logical length less tokens already evicted).
        shared_prefix_pages: leading pages shared with other requests (prefix cache), never rewritten.
        compressible: GrowPage enforces it and may compact it now (its mode is ``enforce``, the
            enforcer runs, the request is past its prompt, and no page past its shared prefix run
            is shared).
    """

    pages_held: int
    physical_tokens: int
    shared_prefix_pages: int
    compressible: bool
    attention_tokens: int = 0  # tokens its observed attention needs (attention_coverage): kept too


@dataclasses.dataclass(frozen=True)
class Floors:
    """The settings the floor is made of (``GrowPageConfig``'s)."""

    base_pages: int
    block_size: int
    sink_tokens: int
    recent_window_tokens: int


def reclaimable_pages(requests: Iterable[RunningKV], floors: Floors) -> int:
    """Pages compressing every compressible request down to its floor would free (net of the page
    its next token then takes: a request compacted to ``floor`` pages holds ``floor`` pages after
    its next step)."""
    total = 0
    for request in requests:
        if not request.compressible:
            continue
        protected = protected_tokens(request.physical_tokens, request.shared_prefix_pages * floors.block_size,
                                     floors.sink_tokens, floors.recent_window_tokens)
        floor = floor_pages(floors.base_pages, protected, floors.block_size, request.attention_tokens)
        total += max(0, request.pages_held - floor)
    return total


@dataclasses.dataclass(frozen=True)
class Headroom:
    """A replica's KV room and the load derived from it (see the module docstring).

    Attributes:
        running: requests running.
        waiting: requests queued.
        free_pages: pages no request holds.
        used_pages: pages running requests hold.
        reclaimable_pages: pages compression to the floors would free.
        base_pages: the floor setting (pages per request when none runs).
    """

    running: int
    waiting: int
    free_pages: int
    used_pages: int
    reclaimable_pages: int
    base_pages: int

    @property
    def headroom_pages(self) -> int:
        """Free pages plus reclaimable pages."""
        return self.free_pages + self.reclaimable_pages

    @property
    def pages_per_request(self) -> int:
        """Mean pages a running request holds, rounded up; ``base_pages`` when none runs (at least 1)."""
        if self.running > 0:
            return max(1, -(-self.used_pages // self.running))
        return max(1, self.base_pages)

    @property
    def capacity_requests(self) -> int:
        """Requests the replica can hold without preempting: those running plus those its headroom fits."""
        return self.running + self.headroom_pages // self.pages_per_request

    @property
    def load(self) -> int:
        """Percent of :attr:`capacity_requests` taken by running and waiting requests (0 when idle)."""
        demand = self.running + self.waiting
        return -(-100 * demand // max(1, self.capacity_requests))


def headroom(*, running: int, waiting: int, free_pages: int, used_pages: int, requests: Iterable[RunningKV],
             floors: Floors) -> Headroom:
    """The replica's :class:`Headroom` from its pool and its running requests."""
    return Headroom(running=running, waiting=waiting, free_pages=max(0, free_pages), used_pages=max(0, used_pages),
                    reclaimable_pages=reclaimable_pages(requests, floors), base_pages=floors.base_pages)
