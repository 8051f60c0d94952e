"""Small PromQL helpers shared by the rule, dashboard and test generators.

Hand-written on purpose: we need only selectors, durations and metric names, and no maintained
Python PromQL parser ships for Python 3.11 without a native toolchain. Prometheus itself checks
every expression we generate (``promtool check rules`` and the panel-query tests).
"""

from __future__ import annotations

import re

_DURATION_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")

# Words that look like metric names but are PromQL syntax.
_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
    "unless", "atan2", "inf", "nan", "start", "end",
})
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'" + r"|`[^`]*`")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def duration_seconds(duration: str) -> float:
    """``"1h30m"`` -> 5400.0. Raises ValueError on anything that is not a Prometheus duration."""
    parts = _DURATION_PART.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return float(sum(int(number) * _DURATION_UNITS_S[unit] for number, unit in parts))


def format_duration(seconds: float) -> str:
    """The largest whole unit: 7200 -> ``"2h"``, 90 -> ``"90s"`` (Prometheus reads both)."""
    for unit in ("d", "h", "m", "s"):
        size = _DURATION_UNITS_S[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(round(seconds * 1000))}ms"


def le_value(bound: float) -> str:
    """A bucket bound as prometheus_client writes its ``le`` label (``0.015``, ``1.0``)."""
    return repr(float(bound))


def selector(metric: str, matchers: str = "", **equal: str) -> str:
    """``metric{a="x", <matchers>}``: ``equal`` become ``=`` matchers, ``matchers`` is appended raw."""
    parts = [f'{name}="{value}"' for name, value in equal.items()]
    if matchers:
        parts.append(matchers)
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (``foo``, ``foo{...}``, ``{__name__="foo"}``).

    Function names, keywords, label names in groupings, numbers and durations are skipped.
    """
    names = set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    text = _STRING.sub('""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations, $__rate_interval
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = _GROUPING.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*")
_SELECTOR_TOKEN = re.compile(
    r'(?P<string>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`)'
    r"|(?P<range>\[[^\]]*\])"
    r"|(?P<grouping>\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))"
    r"|(?<![\w:.$])(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<braces>\s*\{[^}]*\})?(?P<call>\s*\()?")


def is_matchers(text: str) -> bool:
    """``text`` is a comma-separated list of label matchers (``job="vllm", namespace=~"llm-.*"``)."""
    return bool(_MATCHERS.fullmatch(text))


def add_matchers(expr: str, matchers_by_metric: dict[str, str]) -> str:
    """``expr`` with ``matchers_by_metric[name]`` added to every selector of those metrics.

    ``foo`` becomes ``foo{m}`` and ``foo{a="b"}`` becomes ``foo{a="b", m}``; names inside strings,
    range durations, groupings and function calls are left alone.
    """
    def rewrite(match: re.Match[str]) -> str:
        name, call = match.group("name"), match.group("call")
        if name is None or call or name not in matchers_by_metric:
            return match.group(0)
        extra = matchers_by_metric[name].strip()
        braces = (match.group("braces") or "").strip()
        inner = braces[1:-1].strip() if braces else ""
        return f"{name}{{{inner + ', ' if inner else ''}{extra}}}"

    return _SELECTOR_TOKEN.sub(rewrite, expr)


_RANGE = re.compile(r"\[(?P<range>[0-9a-z]+)(?::(?P<step>[0-9a-z]*))?\]")
_OFFSET = re.compile(r"\boffset\s+(?P<offset>[0-9a-z]+)")


def scale_duration(duration: str, factor: float) -> str:
    """``duration`` times ``factor``, in whole seconds (at least one unless it is 0):
    ``scale_duration("1h", 1/60)`` is ``"1m"``."""
    seconds = duration_seconds(duration) * factor
    return "0s" if seconds == 0 else format_duration(max(1, round(seconds)))


def scale_durations(expr: str, factor: float) -> str:
    """``expr`` with every range (``[5m]``), subquery range and step (``[1h:1m]``) and ``offset`` times ``factor``.

    Strings are left alone (a duration inside a label value is not a duration).
    """
    if factor == 1:
        return expr

    def ranged(match: re.Match[str]) -> str:
        step = match.group("step")
        scaled = scale_duration(match.group("range"), factor)
        return f"[{scaled}:{scale_duration(step, factor) if step else ''}]" if step is not None else f"[{scaled}]"

    def offset(match: re.Match[str]) -> str:
        return f"offset {scale_duration(match.group('offset'), factor)}"

    pieces = re.split(f"({_STRING.pattern})", expr)
    return "".join(piece if index % 2 else _OFFSET.sub(offset, _RANGE.sub(ranged, piece))
                   for index, piece in enumerate(pieces))
