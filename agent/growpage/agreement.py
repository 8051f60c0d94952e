"""How closely one run's greedy answers follow another's, token by token."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Agreement of candidate answers with reference answers (paired by position).

    Attributes:
        identical_share: answers identical token for token.
        mean_prefix_tokens: tokens before the first divergence, mean over answers.
        mean_matched_share: that prefix as a share of the reference answer, mean over answers.
    """

    identical_share: float
    mean_prefix_tokens: float
    mean_matched_share: float


def token_agreement(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> Agreement:
    """Compare paired token sequences; both lists must have the same length."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference answers but {len(candidate)} candidates")
    identical, prefixes, shares = 0, [], []
    for ref, cand in zip(reference, candidate, strict=True):
        ref, cand = list(ref), list(cand)
        matched = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), min(len(ref), len(cand)))
        identical += ref == cand
        prefixes.append(matched)
        shares.append(matched / max(len(ref), 1))
    count = max(len(reference), 1)
    return Agreement(identical / count, statistics.fmean(prefixes or [0]), statistics.fmean(shares or [0]))
