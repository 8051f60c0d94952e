"""What sampled observation costs in decisions: the boundary decisions of two monitor runs compared.

Monitor mode changes nothing vLLM does, so two monitor runs of one greedy trace schedule the same
steps and meet the same page boundaries; only what GrowPage *would* decide at each can differ, by
what its summaries saw. :func:`decision_agreement` lines up the two runs' decision traces
(``[request index, pages before, kind]``, :class:`growpage.tooling.vllm_child.DecisionTrace`) boundary
by boundary and reports how often the sampled run decides as the fully observing one.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

# Monitor with nothing sampled: every step, every request of the batch, every query head (the
# observed layers stay the shipped ones).
FULL_OBSERVATION = {"observe_every_steps": 1, "observe_max_requests": 1024, "observed_heads": 1024}
# Monitor observing what enforce observes: every step and request, the shipped sampled heads. Against
# it, the shipped monitor's agreement is the cost of the step and request sampling alone.
ENFORCE_OBSERVATION = {"observe_every_steps": 1, "observe_max_requests": 1024}

Decision = Sequence[Any]  # [request index, pages before, kind]


def _by_boundary(trace: Sequence[Decision]) -> dict[tuple[int, int, int], str]:
    """Each decision keyed by its boundary: request, pages before and the how-manyth time that
    request met those pages (a preempted request recomputes and meets them again)."""
    met: collections.Counter[tuple[int, int]] = collections.Counter()
    keyed = {}
    for index, pages_before, kind in trace:
        boundary = (int(index), int(pages_before))
        keyed[(*boundary, met[boundary])] = str(kind)
        met[boundary] += 1
    return keyed


def decision_agreement(full: Sequence[Decision], sampled: Sequence[Decision]) -> dict:
    """How often ``sampled`` decides as ``full`` at the boundaries both met.

    Returns:
        ``boundaries`` (full's), ``matched`` (met by both: all of them when the runs scheduled
        alike), ``agreement`` (share of matched boundaries decided alike; None when none matched),
        the decisions by kind in each run, and the disagreements as ``"full->sampled"`` counts.
    """
    reference, candidate = _by_boundary(full), _by_boundary(sampled)
    matched = sorted(reference.keys() & candidate.keys())
    alike = sum(reference[key] == candidate[key] for key in matched)
    changed = collections.Counter(f"{reference[key]}->{candidate[key]}" for key in matched
                                  if reference[key] != candidate[key])
    return {"boundaries": len(reference), "matched": len(matched),
            "agreement": round(alike / len(matched), 4) if matched else None,
            "by_kind_full": dict(collections.Counter(reference.values())),
            "by_kind_sampled": dict(collections.Counter(candidate.values())),
            "disagreements": dict(changed)}
