"""Renders the subset of Prometheus alert templates our annotations use, as Prometheus does.

The promtool unit tests pin every annotation exactly; rendering the expected text here (rather than
copying Prometheus' output) keeps the expectations independent of the thing they test. Functions
mirror ``template.go`` in Prometheus 2.x: ``humanize``, ``humanizeDuration``, ``humanizePercentage``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_SMALL_PREFIXES = ("m", "u", "n", "p", "f", "a", "z", "y")
_LARGE_PREFIXES = ("k", "M", "G", "T", "P", "E", "Z", "Y")


def _go_g4(value: float) -> str:
    # Go's %.4g and Python's agree on the digits and exponent form we produce.
    return f"{value:.4g}"


def humanize(value: float) -> str:
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _go_g4(value)
    prefix = ""
    if abs(value) >= 1:
        for candidate in _LARGE_PREFIXES:
            if abs(value) < 1000:
                break
            prefix, value = candidate, value / 1000
    else:
        value, prefix = _below_one(value)
    return f"{_go_g4(value)}{prefix}"


def _below_one(value: float) -> tuple[float, str]:
    """A value under 1 scaled by 1000 until it is not, with its SI prefix (m, u, n, ...)."""
    prefix = ""
    for candidate in _SMALL_PREFIXES:
        if abs(value) >= 1:
            break
        prefix, value = candidate, value * 1000
    return value, prefix


def humanize_duration(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return _go_g4(value)
    if value == 0:
        return f"{_go_g4(value)}s"
    if abs(value) >= 1:
        sign, value = ("-", -value) if value < 0 else ("", value)
        whole = int(value)
        seconds, minutes, hours, days = whole % 60, whole // 60 % 60, whole // 3600 % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_go_g4(value)}s"
    value, prefix = _below_one(value)
    return f"{_go_g4(value)}{prefix}s"


def humanize_percentage(value: float) -> str:
    return f"{_go_g4(value * 100)}%"


_FUNCTIONS = {"humanize": humanize, "humanizeDuration": humanize_duration,
              "humanizePercentage": humanize_percentage}


def render(template: str, labels: Mapping[str, str], value: float, external_url: str = "") -> str:
    """Expand ``{{ $labels.x }}``, ``{{ $value | fn }}`` and ``{{ $externalURL }}``.

    Raises:
        ValueError: for any other template action (extend this renderer first).
    """
    def expand(match: re.Match) -> str:
        action = match.group(1)
        if action.startswith("$labels."):
            return labels.get(action.removeprefix("$labels."), "")
        if action == "$externalURL":
            return external_url
        pipeline = [part.strip() for part in action.split("|")]
        if pipeline[0] == "$value" and len(pipeline) == 2 and pipeline[1] in _FUNCTIONS:
            return _FUNCTIONS[pipeline[1]](value)
        raise ValueError(f"template action not supported by the test renderer: {{{{ {action} }}}}")

    return _ACTION.sub(expand, template)
