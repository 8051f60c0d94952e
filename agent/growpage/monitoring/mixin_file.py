"""A mixin config file (YAML or JSON) read into a :class:`~growpage.monitoring.mixin.MixinConfig`.

The file holds only what a deployment changes; every key left out keeps its default (the catalog's).
Keys mirror the dataclasses: the config's own fields at the top, ``thresholds`` as a mapping of
:class:`~growpage.catalog.MixinThresholds` fields, and ``thresholds.checklist`` as a mapping of
:class:`~growpage.catalog.ChecklistThresholds` fields::

    cluster_label: k8s_cluster
    vllm_selector: 'namespace=~"llm-.*"'
    thresholds:
      vllm_ttft_s: 5.0
      checklist:
        fragmentation_high: 0.6

``gpctl alerts build``, ``gpctl dashboards build`` and ``gpctl diagnose`` read it with
``--mixin-config FILE``; an unknown key or a bad value raises one :class:`ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from growpage.errors import ConfigError
from growpage.monitoring.mixin import MixinConfig

_T = TypeVar("_T")


def load_mixin_config(path: Path) -> MixinConfig:
    """The config in ``path``; an empty file is the default config.

    Raises:
        ConfigError: the file cannot be read, is not YAML or JSON, or holds an unknown key or a bad value.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ConfigError(f"cannot read the mixin config {path}: {reason}; pass a YAML or JSON file "
                          "(docs/MONITORING.md, 'Your installation')") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"the mixin config {path} is not valid YAML or JSON{where}: "
                          f"{getattr(error, 'problem', None) or error}; fix the syntax") from None
    return mixin_config_from(document, str(path))


def mixin_config_from(document: Any, source: str = "mixin config") -> MixinConfig:
    """``document`` (a mapping, as parsed from YAML or JSON) as a config; None is the default one.

    Raises:
        ConfigError: an unknown key or a bad value; the message names it, ``source`` and the fix.
    """
    try:
        return _build(MixinConfig, {} if document is None else document, "", source)
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{source}: {error}") from None


def _build(cls: type[_T], document: Any, prefix: str, source: str) -> _T:
    """An instance of the dataclass ``cls`` from ``document``, its defaults for keys left out."""
    names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'the file'} must be a mapping of keys to values "
                          f"({', '.join(names)})")
    unknown = sorted(str(key) for key in document if key not in names)
    if unknown:
        scope = f" of {prefix.rstrip('.')}" if prefix else ""
        raise ConfigError(f"{source}: unknown key {prefix}{unknown[0]}; the keys{scope} are {', '.join(names)} "
                          "(check the spelling)")
    defaults = cls()
    values = {key: _value(getattr(defaults, key), value, f"{prefix}{key}", source) for key, value in document.items()}
    return dataclasses.replace(defaults, **values)  # type: ignore[type-var]


def _value(default: Any, value: Any, key: str, source: str) -> Any:
    """``value`` checked against the type of ``default`` (a nested dataclass, numbers, a string)."""
    if dataclasses.is_dataclass(default):
        return _build(type(default), value, f"{key}.", source)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(_is_number(item) for item in value):
            raise ConfigError(f"{source}: {key} must be a list of numbers, e.g. {list(default)}")
        return tuple(float(item) for item in value)
    if isinstance(default, float):
        if not _is_number(value):
            raise ConfigError(f"{source}: {key} must be a number, e.g. {default:g}; got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a string, e.g. {default!r}; got {value!r}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
