"""What GrowPage costs vLLM, measured where it runs: seconds of GrowPage's own code against vLLM's step.

Every piece of GrowPage work in vLLM's loop runs through one ``guarded`` call (the worker's observer,
the scheduler's agent), so each side times its outermost guarded calls (a guarded call inside
another is already inside its time) and the vLLM methods it wraps (the step it hooks into, its own
part included). Exported as ``growpage_vllm_own_seconds_total`` and ``growpage_vllm_step_seconds_total``
by ``side``; their rates' ratio is GrowPage's share of vLLM's step time, the price an operator
weighs against the preemptions it avoids (a wall-clock share: on a GPU, host time, the kernels
GrowPage launches run asynchronously and are not in it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from growpage import catalog

SCHEDULER_SIDE, WORKER_SIDE = catalog.OWN_TIME_SIDES  # the ``side`` label's values
OWN, STEP = "own", "step"


class OwnTime:
    """Seconds of GrowPage's own work and of the vLLM calls it wraps, on one side of vLLM.

    Only the outermost of nested measurements counts, per thread (the agent's guarded calls nest;
    a scrape thread never adds to the engine thread's depth).

    Args:
        clock: monotonic seconds with sub-microsecond resolution.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._depth = threading.local()
        self._seconds = {OWN: 0.0, STEP: 0.0}
        self._reported = (0.0, 0.0)

    @property
    def own_seconds(self) -> float:
        """GrowPage's own code, in total."""
        return self._seconds[OWN]

    @property
    def step_seconds(self) -> float:
        """The vLLM calls GrowPage hooks, GrowPage's part in them included, in total."""
        return self._seconds[STEP]

    def own(self) -> contextlib.AbstractContextManager[None]:
        """Time the body as GrowPage's own work, unless an outer measurement already does."""
        return self._measure(OWN)

    def step(self) -> contextlib.AbstractContextManager[None]:
        """Time the body as a vLLM call GrowPage hooks (the guarded work inside it counts as own too)."""
        return self._measure(STEP)

    def since_report(self) -> tuple[float, float]:
        """(own, step) seconds since the last call, which becomes the new last report."""
        now = (self.own_seconds, self.step_seconds)
        last, self._reported = self._reported, now
        return now[0] - last[0], now[1] - last[1]

    @contextlib.contextmanager
    def _measure(self, kind: str) -> Iterator[None]:
        depth = getattr(self._depth, kind, 0)
        setattr(self._depth, kind, depth + 1)
        started = self._clock() if depth == 0 else None
        try:
            yield
        finally:
            setattr(self._depth, kind, depth)
            if started is not None:
                self._seconds[kind] += self._clock() - started
