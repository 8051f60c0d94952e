"""The newest queries of the steps the observation stride skips, scored at the next observed step.

With ``observe_every_steps`` N > 1 the observer scores one step in N, and a request's keep set and
attention need then rank tokens by the attention of one query in N. Most of an observation's cost
is the scoring (every observed request's keys gathered per observed layer, a softmax over them);
taking a step's newest queries is one small copy per observed layer. So with
``observe_skipped_steps`` (off by default: docs/VLLM_PLUGIN.md, the fidelity profile) on a skipped
step the observed layers still hand over each request's newest sampled query, kept here, and the next
observed step scores them with its own as one observation window
(:func:`~growpage.vllm_plugin.scoring.score_step`'s ``query_offsets``). A query taken ``o`` positions
before its request's newest sees only the keys before it: exactly the attention it had at its own
step, since nothing rewrote those keys in between. Where something did (a compaction moved the
request's survivors: its ``dropped`` count changed; a preemption recomputed it: it is tracked anew),
its kept queries are dropped, because their positions no longer hold the keys they saw.

Measured on the packaged model's geometry (3 observed layers, 4 sampled heads, 6 requests of 300-700
tokens, AVX-512 host, 2 threads): scoring one query per request took 4.8 ms, a window of four 6.2 ms,
so one step in four scored with its three skipped steps' queries costs about a third of scoring every
step. Under full CUDA graphs a skipped step runs no Python: nothing is taken there (the observed step
alone is dispatched eagerly, :mod:`~growpage.vllm_plugin.graph_steps`), and the window holds what
the eager steps gave.

Pure Python and torch (no vLLM, nothing else from GrowPage): the tests drive it directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class TakenQuery:
    """Where a skipped step left one request's newest query.

    Attributes:
        owner: whom it was taken for (the worker's tracked request, compared by identity: a request
            resumed after a preemption is tracked anew and its old queries are not its own).
        logical: the request's logical length then (its newest query's position + 1).
        dropped: tokens compacted away from it then.
        row: its row in that step's query tensors.
    """

    owner: object
    logical: int
    dropped: int
    row: int


@dataclasses.dataclass
class _SkippedStep:
    taken: dict[str, TakenQuery]  # request id -> its query's row
    queries: dict[Hashable, torch.Tensor] = dataclasses.field(default_factory=dict)  # layer -> [R, H, hd]


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """How the observed step's queries and the kept ones form each request's window.

    Attributes:
        sources: ``[R * W]`` rows of the pool (the step's own window queries first, ``[R * Wc]``, then
            each kept step's ``[R_s]`` in the order :meth:`SkippedQueries.pool` concatenates them),
            each request's newest last.
        offsets: ``[R][W]`` positions each window query lies before its request's newest.
        kept: kept queries the window scores (0: the step's own window, unchanged).
        queries: ``[R]`` distinct queries in each request's window (the steps a decoding
            request's observation stands for).
    """

    sources: list[int]
    offsets: list[list[int]]
    kept: int
    queries: list[int]


class SkippedQueries:
    """The newest sampled queries of the skipped steps since the last observed one.

    Args:
        max_steps: skipped steps kept at most (the stride less one: older ones are never asked for).
    """

    def __init__(self, max_steps: int):
        self.max_steps = max(0, max_steps)
        self._steps: list[_SkippedStep] = []
        self._current: _SkippedStep | None = None
        self._pooled: list[_SkippedStep] = []  # the steps the last plan numbered, in pool order

    @property
    def steps(self) -> int:
        """Skipped steps that took queries since the last observed step."""
        return len(self._steps)

    def clear(self) -> None:
        """Forget every kept query (scored at an observed step, or never to be)."""
        self._steps, self._current, self._pooled = [], None, []

    def begin_skipped_step(self, taken: dict[str, TakenQuery]) -> None:
        """A skipped step that will hand over the queries of ``taken``'s requests (one per observed
        layer, through :meth:`take`); the oldest kept step goes beyond ``max_steps``."""
        if self.max_steps == 0 or not taken:
            self._current = None
            return
        self._current = _SkippedStep(taken)
        self._steps.append(self._current)
        del self._steps[:-self.max_steps]

    def take(self, layer: Hashable, newest: torch.Tensor) -> None:
        """Keep one layer's ``[R, H, hd]`` newest queries of the skipped step begun last (a copy:
        vLLM reuses its buffers)."""
        if self._current is not None:
            self._current.queries[layer] = newest

    def plan(self, owners: Sequence[object], request_ids: Sequence[str], logical: Sequence[int],
             dropped: Sequence[int], own_offsets: Sequence[Sequence[int]]) -> WindowPlan:
        """Each observed request's window: its kept queries that still see the keys they saw, oldest
        first, then the step's own (``own_offsets``, :func:`~growpage.vllm_plugin.observer.query_window`'s:
        a request's pads are leading offset-0 repeats of its newest), padded in front with its newest.

        Args:
            owners: ``[R]`` each observed request's tracked object (see :class:`TakenQuery`).
            request_ids, logical, dropped: ``[R]`` its id, logical length and tokens compacted away now.
            own_offsets: ``[R][Wc]`` the step's own window offsets.
        """
        if not self._steps:  # nothing kept (the setting's default): the step's own window, at no cost
            self._pooled = []
            return WindowPlan([], [list(offsets) for offsets in own_offsets], 0, [1] * len(request_ids))
        own_width = len(own_offsets[0]) if own_offsets else 1
        # a step cut short (a fault, a graph replay mid-step) lacks layers: the pool must be the same
        # in every layer, so only the steps that handed over every layer the fullest one did are pooled
        layers = max((len(step.queries) for step in self._steps), default=0)
        self._pooled = [step for step in self._steps if layers and len(step.queries) == layers]
        bases, base = [], len(request_ids) * own_width
        for step in self._pooled:
            bases.append(base)
            base += len(step.taken)
        per_row: list[list[tuple[int, int]]] = []  # (pool row, offset), oldest first
        kept = 0
        for r, request_id in enumerate(request_ids):
            entries: list[tuple[int, int]] = []
            for base, step in zip(bases, self._pooled, strict=True):
                taken = step.taken.get(request_id)
                if taken is None or taken.owner is not owners[r]:
                    continue
                offset = logical[r] - taken.logical
                if taken.dropped == dropped[r] and offset > 0:
                    entries.append((base + taken.row, offset))
            kept += len(entries)
            offsets = own_offsets[r]
            own = [(r * own_width + j, offset) for j, offset in enumerate(offsets)
                   if j == len(offsets) - 1 or offset != 0]  # leading offset-0 entries are pads
            entries.sort(key=lambda entry: -entry[1])
            per_row.append(entries + own)
        window = max(len(entries) for entries in per_row) if per_row else 1
        sources: list[int] = []
        window_offsets: list[list[int]] = []
        for entries in per_row:
            newest = entries[-1]
            padded = [newest] * (window - len(entries)) + entries
            sources += [source for source, _ in padded]
            window_offsets.append([0 if (source, offset) == newest else offset for source, offset in padded])
        return WindowPlan(sources, window_offsets, kept, [len(entries) for entries in per_row])

    def pool(self, layer: Hashable, own: torch.Tensor) -> torch.Tensor:
        """``own`` (``[R * Wc, H, hd]``, the observed step's window queries) and the queries of
        ``layer`` of every step the last :meth:`plan` numbered, in its order.

        Raises:
            KeyError: a pooled step never saw ``layer`` (the observed step reads a layer the skipped
                ones did not; the caller counts it as a fault and the step goes unscored).
        """
        kept = [step.queries[layer].to(own.dtype) for step in self._pooled]
        return torch.cat([own, *kept]) if kept else own
