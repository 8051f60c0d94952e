"""GrowPage's settings as vLLM's own processes read them (scheduler, workers, API server): never raising.

Settings GrowPage cannot honour must not take vLLM down. :func:`resolve_settings` then leaves
GrowPage off (vLLM pages on its own) with the exporter still serving, and says why
(:attr:`ResolvedSettings.problem`, the :class:`~growpage.errors.ConfigError`'s message with its
fix), for the scheduler to report as ``growpage_agent_active{reason="invalid_config"}`` and log
once. Mode ``off`` uses only the exporter's settings, so only those are checked there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from growpage.config import GrowPageConfig, Mode, merged_values
from growpage.errors import ConfigError
from growpage.vllm_plugin.settings import (
    ADDITIONAL_CONFIG_KEY,
    PluginSettings,
    coerce_plugin_env,
    config_env,
    default_base_pages,
    split_settings,
)

_DEFAULT_MODE = next(f.default for f in dataclasses.fields(GrowPageConfig) if f.name == "mode")


@dataclasses.dataclass(frozen=True)
class ResolvedSettings:
    """What one vLLM process runs: the user's settings, or, when they cannot be honoured, GrowPage
    off with the exporter still serving (so the pod says why).

    Attributes:
        config: the user's config, or a mode-``off`` config at vLLM's block size.
        settings: the user's plugin settings, or the exporter's settings alone.
        problem: why the user's settings cannot be honoured (the :class:`ConfigError`'s message,
            which says how to fix it); None when they are, or when only settings mode ``off``
            never uses are wrong.
        requested_mode: the mode the user asked for (``off`` | ``monitor`` | ``enforce``, or what
            they wrote), whether or not it runs.
    """

    config: GrowPageConfig
    settings: PluginSettings
    problem: str | None = None
    requested_mode: str = Mode.MONITOR.value


def resolve_settings(raw: Any, env: Mapping[str, str] | None = None,
                     block_size: int | None = None) -> ResolvedSettings:
    """:func:`split_settings` for vLLM's own processes (scheduler, workers, API server): never raises.

    Settings GrowPage cannot honour must not take vLLM down: GrowPage then runs ``off`` (vLLM pages
    on its own) and :attr:`ResolvedSettings.problem` says why, for the caller to report as
    ``growpage_agent_active{reason="invalid_config"}`` and log once. Mode ``off`` uses only the
    exporter's settings, so only those are checked there.
    """
    # raw is Any: whatever the user wrote, which split_settings (typed for the mapping it expects) checks
    env = os.environ if env is None else env
    try:
        config, settings = split_settings(raw, env, block_size)
        return ResolvedSettings(config, settings, None, config.mode.value)
    except ConfigError as error:
        problem: str | None = str(error)
    except (TypeError, ValueError) as error:  # a value no check foresaw: still never vLLM's problem
        problem = f"additional_config.growpage cannot be read ({type(error).__name__}: {error})"
    requested = _requested_mode(raw, env)
    settings, exporter_problem = _exporter_settings(raw, env)
    if requested == Mode.OFF.value:
        problem = exporter_problem
    return ResolvedSettings(_off_config(block_size), settings, problem, requested)


def _requested_mode(raw: object, env: Mapping[str, str]) -> str:
    """The mode the user asked for, read leniently (the rest of the settings may be invalid)."""
    value: object = raw.get("mode") if isinstance(raw, Mapping) else None
    if value is None:
        try:
            value = merged_values(env=config_env(env)).get("mode")
        except ConfigError:
            value = env.get("GROWPAGE_MODE")
    if value is None:
        value = _DEFAULT_MODE
    return str(getattr(value, "value", value)).strip().lower()


def _exporter_settings(raw: object, env: Mapping[str, str]) -> tuple[PluginSettings, str | None]:
    """The user's exporter address alone (the defaults if it is invalid), and what is wrong with it."""
    values: dict[str, Any] = {}  # unchecked values of several types, for PluginSettings to check
    try:
        for name in ("exporter_port", "exporter_host"):
            env_name = f"GROWPAGE_VLLM_{name.upper()}"
            if env_name in env:
                values[name] = coerce_plugin_env(name, env[env_name])
            if isinstance(raw, Mapping) and name in raw:
                values[name] = raw[name]
        return PluginSettings(**values), None
    except ConfigError as error:
        return PluginSettings(), str(error)


def _off_config(block_size: int | None) -> GrowPageConfig:
    """GrowPage off at vLLM's block size (the defaults, valid at every block size)."""
    if block_size is None:
        return GrowPageConfig(mode=Mode.OFF)
    return GrowPageConfig(mode=Mode.OFF, block_size=block_size, base_pages=default_base_pages(block_size))


def settings_from_vllm_config(vllm_config: object) -> ResolvedSettings:
    """:func:`resolve_settings` for a ``VllmConfig`` (its ``additional_config`` and block size): never raises."""
    additional = getattr(vllm_config, "additional_config", None) or {}
    block_size = getattr(getattr(vllm_config, "cache_config", None), "block_size", None)
    raw = additional.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional, Mapping) else additional
    return resolve_settings(raw, block_size=block_size)
