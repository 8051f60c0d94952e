"""What every source returns: the observations, and the raw material for an incident bundle."""

from __future__ import annotations

import dataclasses

from growpage.diagnose.observations import Observations


@dataclasses.dataclass(frozen=True)
class SourceResult:
    """Observations plus ``raw_files``: ``(name inside the bundle, text)`` of what was read."""

    observations: Observations
    raw_files: tuple[tuple[str, str], ...] = ()
