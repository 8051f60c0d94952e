"""GrowPage configuration: one validated dataclass shared by every home.

Defaults are the contract's reference values (docs/CORE.md). Sources, later wins: defaults < file <
``GROWPAGE_*`` environment variables < explicit overrides (e.g. vLLM's ``additional_config["growpage"]``).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import logging
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from growpage.errors import ConfigError

ENV_PREFIX = "GROWPAGE_"
ENV_CONFIG_FILE = "GROWPAGE_CONFIG"
# GROWPAGE_* variables that are settings of something else, not config fields: never parsed here.
OTHER_ENV_SETTINGS = {
    ENV_CONFIG_FILE: "the config file's path",
    "GROWPAGE_TRACING": "OpenTelemetry spans on/off (growpage.telemetry.tracing)",
    "GROWPAGE_CACHE_DIR": "where prepared models live (growpage.engine.model_prep)",
    "GROWPAGE_API_KEY": "the API key of gpctl serve",
}
OTHER_ENV_PREFIXES = ("GROWPAGE_VLLM_",)  # the vLLM plugin's own settings and test hooks
DEPRECATED_ENV = {"GROWPAGE_VLLM_PYTHON": "gpctl serve --engine vllm now uses the current interpreter"}

logger = logging.getLogger(__name__)


class Mode(str, enum.Enum):
    """How much GrowPage does for a request.

    ``off``: nothing runs (plain paging). ``monitor``: summaries, decisions and stats, KV untouched,
    outputs bit-identical to ``off``. ``enforce``: decisions are applied.
    """

    OFF = "off"
    MONITOR = "monitor"
    ENFORCE = "enforce"


KV_DTYPES = ("float16", "bfloat16", "float32")

# The share of each request's observed attention its floor keeps where GrowPage serves (vLLM's
# plugin, the reference engine's serving benchmark); GrowPageConfig's own default (0: the floor
# alone) is the library's. Measured inside vLLM: 16 of 16 retrieval answers under KV pressure at
# 0.95, 12 of 16 at 0.9 (docs/BENCHMARKS.md).
DEFAULT_ATTENTION_COVERAGE = 0.95


@dataclasses.dataclass(frozen=True)
class GrowPageConfig:
    """Every knob of GrowPage, validated on construction.

    Attributes:
        mode: off | monitor | enforce. Monitor is the safe first rollout phase.
        enforce_namespaces: with ``mode=enforce``, only requests of these namespaces are enforced
            (the others are monitored); empty means every namespace (rollout phase 3).
        block_size: token slots per page at the KV dtype (a quantized page packs more tokens into
            the same bytes).
        base_pages: pages granted (reserved) to a request at admission.
        sts_window_steps: short-term summary window, in decode steps.
        sts_num_bins: position bins of the short-term attention histogram.
        sts_active_mass: a bin is active when its mean attention mass over the window is at least
            this (1/16 = half of a uniform share over 8 bins).
        lts_window_steps: time constant of the long-term entropy EMA, in decode steps.
        lts_update_interval_steps: the long-term EMA takes one update per this many steps.
        growth_coefficient: capacity boundary = base_pages * (1 + growth_coefficient * LTS).
        density_threshold: STS density above this compresses by quantization.
        lts_grow_threshold: at density <= threshold, LTS above this allocates, else evicts.
        rollout_entropy_threshold: namespaces whose LTS p50 exceeds this are phase-2 candidates.
        max_growth_rate: pages a request may add beyond its grant per second, as a fraction of the
            pages it holds (0.3 = at most 30 % more pages per second).
        quantization_bits: 8 or 4; the target format of quantizing compression.
        sink_tokens: first tokens of a request never evicted nor quantized (attention sinks).
        recent_window_tokens: newest tokens never evicted nor quantized.
        evict_min_pages: pages an eviction frees at least.
        observed_layers: how many layers (evenly spaced) feed the summaries.
        kv_dtype: storage dtype of unquantized KV.
        attention_coverage: with enforce and GrowPage's methods, in both homes: a request is never
            compressed below the tokens that hold this share of its observed attention (its
            prompt-anchored scores, highest first; the highest need seen so far), so its floor
            follows what its attention needs, not only ``base_pages``. 0: off (the default here;
            the vLLM plugin and the reference engine's serving benchmark default to
            :data:`DEFAULT_ATTENTION_COVERAGE`).
    """

    mode: Mode = Mode.MONITOR
    enforce_namespaces: tuple[str, ...] = ()
    block_size: int = 16
    base_pages: int = 128
    sts_window_steps: int = 32
    sts_num_bins: int = 8
    sts_active_mass: float = 1.0 / 16.0
    lts_window_steps: int = 512
    lts_update_interval_steps: int = 64
    growth_coefficient: float = 0.2
    density_threshold: float = 0.7
    lts_grow_threshold: float = 2.1
    rollout_entropy_threshold: float = 2.5
    max_growth_rate: float = 0.3
    quantization_bits: int = 8
    sink_tokens: int = 4
    recent_window_tokens: int = 64
    evict_min_pages: int = 1
    observed_layers: int = 3
    kv_dtype: str = "float16"
    attention_coverage: float = 0.0

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, [m.value for m in Mode])
        object.__setattr__(self, "mode", Mode(self.mode))
        object.__setattr__(self, "enforce_namespaces", tuple(self.enforce_namespaces))
        for name in ("block_size", "base_pages", "sts_window_steps", "sts_num_bins",
                     "lts_window_steps", "lts_update_interval_steps", "evict_min_pages",
                     "observed_layers"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("sink_tokens", "recent_window_tokens"):
            _check_int(name, getattr(self, name), minimum=0)
        if self.sts_num_bins > 255:
            raise ConfigError("sts_num_bins must be <= 255 (bins are indexed as uint8); try 8")
        if self.lts_update_interval_steps > self.lts_window_steps:
            raise ConfigError(
                f"lts_update_interval_steps ({self.lts_update_interval_steps}) must be <= "
                f"lts_window_steps ({self.lts_window_steps}); try 64 and 512")
        for name in ("sts_active_mass", "density_threshold"):
            _check_float(name, getattr(self, name), low=0.0, high=1.0)
        for name in ("growth_coefficient", "lts_grow_threshold", "rollout_entropy_threshold"):
            _check_float(name, getattr(self, name), low=0.0, high=None)
        _check_float("max_growth_rate", self.max_growth_rate, low=0.0, high=None)
        _check_float("attention_coverage", self.attention_coverage, low=0.0, high=1.0)
        if self.max_growth_rate <= 0:
            raise ConfigError("max_growth_rate must be > 0 (pages per second as a fraction of "
                              "held pages); try 0.3, or a large value to disable throttling")
        _check_choice("quantization_bits", self.quantization_bits, [8, 4])
        _check_choice("kv_dtype", self.kv_dtype, list(KV_DTYPES))
        protected = self.sink_tokens + self.recent_window_tokens
        evictable_room = (self.base_pages - self.evict_min_pages) * self.block_size
        if protected > evictable_room:
            fewest = min_base_pages(self.block_size, self.sink_tokens, self.recent_window_tokens,
                                    self.evict_min_pages)
            raise ConfigError(
                f"sink_tokens + recent_window_tokens ({protected}) must fit in "
                f"(base_pages - evict_min_pages) * block_size = {evictable_room} tokens, or "
                f"eviction could never free a page; raise base_pages to at least {fewest} at block_size "
                f"{self.block_size}, or lower recent_window_tokens")

    @property
    def lts_ema_decay(self) -> float:
        """Per-update decay of the LTS EMA, derived so its time constant is ``lts_window_steps``.

        The window is the quantity that means something to an operator (how far back "long-term"
        reaches), so the decay follows from it: 0.875 per 64-step update for 512 steps by default.
        A fixed decay such as 0.95 per update would silently stretch the window to ~1,280 steps.
        """
        return 1.0 - self.lts_update_interval_steps / self.lts_window_steps

    @property
    def summary_bytes_per_request(self) -> int:
        """Bytes of per-request summary state (STS ring + LTS registers), see SummaryBank."""
        sts_ring = self.sts_window_steps * self.sts_num_bins  # uint8 masses
        lts_registers = 4 * 4  # ema f32, interval sum f32, updates i32, interval steps i32
        step_counter = 8  # int64 ring cursor
        return sts_ring + lts_registers + step_counter

    def mode_for(self, namespace: str | None, requested: Mode | str | None = None) -> Mode:
        """The effective mode of one request (staged rollout).

        A request may ask for less than the deployment runs (``off`` or ``monitor``), never more.
        With ``enforce`` and a non-empty ``enforce_namespaces``, other namespaces are monitored.
        """
        mode = self.mode
        if mode is Mode.ENFORCE and self.enforce_namespaces and namespace not in self.enforce_namespaces:
            mode = Mode.MONITOR
        if requested is not None:
            asked = Mode(requested)
            order = [Mode.OFF, Mode.MONITOR, Mode.ENFORCE]
            mode = min(mode, asked, key=order.index)
        return mode

    def replace(self, **changes: Any) -> GrowPageConfig:
        """A copy with ``changes`` applied and validated (values coerced as from a file)."""
        merged = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        merged.update(_coerce_mapping(changes, source="overrides"))
        return GrowPageConfig(**merged)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(GrowPageConfig))


def min_base_pages(block_size: int, sink_tokens: int, recent_window_tokens: int, evict_min_pages: int) -> int:
    """The fewest ``base_pages`` :class:`GrowPageConfig` accepts with these settings.

    A request at its floor that evicts ``evict_min_pages`` pages must still hold its sinks and its
    recent window in the pages left: ``(base_pages - evict_min_pages) * block_size >= sink_tokens +
    recent_window_tokens``, so ``base_pages >= evict_min_pages + ceil(protected / block_size)``.
    """
    return evict_min_pages + math.ceil((sink_tokens + recent_window_tokens) / block_size)


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None,
                defaults: Mapping[str, Any] | None = None) -> GrowPageConfig:
    """Build a config from defaults, a file, ``GROWPAGE_*`` variables and overrides.

    Args:
        path: a YAML, JSON or TOML file; its values may sit under a top-level ``growpage`` key.
            When None, ``$GROWPAGE_CONFIG`` is used if set.
        env: the environment to read (default ``os.environ``); ``GROWPAGE_BASE_PAGES=64`` etc.
        overrides: highest-priority values, e.g. vLLM's ``additional_config["growpage"]``.
        defaults: a home's own defaults (vLLM's floor in its block size): above the dataclass's,
            below everything a user set (file, environment, overrides).

    Raises:
        ConfigError: a file is missing or unreadable, a key is unknown, or a value is invalid.
    """
    return GrowPageConfig(**merged_values(path, env, overrides, defaults))


def merged_values(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None,
                  defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields :func:`load_config` would build a config from, coerced but not yet validated
    together: only the keys some source set (a home derives a default from the others first).

    Raises:
        ConfigError: a file is missing or unreadable, a key is unknown, or a value cannot be coerced.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = _coerce_mapping(dict(defaults or {}), source="defaults")
    if path is None and env.get(ENV_CONFIG_FILE):
        path = env[ENV_CONFIG_FILE]
    if path is not None:
        values.update(_coerce_mapping(_read_file(Path(path)), source=str(path)))
    env_values = {key[len(ENV_PREFIX):].lower(): value for key, value in env.items()
                  if _is_config_env(key)}
    values.update(_coerce_mapping(env_values, source="environment", from_env=True))
    if overrides:
        values.update(_coerce_mapping(dict(overrides), source="overrides"))
    return values


def _is_config_env(key: str) -> bool:
    if key in DEPRECATED_ENV:
        logger.warning("%s is deprecated and ignored: %s; unset it", key, DEPRECATED_ENV[key])
        return False
    return (key.startswith(ENV_PREFIX) and key not in OTHER_ENV_SETTINGS
            and not key.startswith(OTHER_ENV_PREFIXES))


def _read_file(path: Path) -> Mapping[str, Any]:
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; pass a YAML/JSON/TOML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing YAML/JSON/TOML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path} is not UTF-8 (byte {error.start} is 0x{error.object[error.start]:02x});"
                          " save it as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read ({error.strerror}); check its permissions") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"config file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}: "
                          f"{first_line}") from None
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping of GrowPage fields")
    if "growpage" in data and isinstance(data["growpage"], Mapping):
        data = data["growpage"]
    return data


def _coerce_mapping(raw: Mapping[str, Any], source: str, from_env: bool = False) -> dict[str, Any]:
    types = {f.name: str(f.type) for f in dataclasses.fields(GrowPageConfig)}  # annotations are strings here
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in types:
            hint = difflib.get_close_matches(name, FIELD_NAMES, n=1)
            where = f"{ENV_PREFIX}{name.upper()}" if from_env else name
            suggestion = f"did you mean '{hint[0]}'?" if hint else f"valid fields: {', '.join(FIELD_NAMES)}"
            raise ConfigError(f"unknown GrowPage setting '{where}' in {source}; {suggestion}")
        out[name] = _coerce_value(name, types[name], value, source)
    return out


def _coerce_value(name: str, type_name: str, value: Any, source: str) -> Any:
    bad = ConfigError(f"{name}={value!r} in {source} is not a valid "
                      f"{type_name.replace('tuple[str, ...]', 'list of names')}")
    coerce = _COERCERS.get(type_name)
    if coerce is not None:
        return coerce(value, bad)
    if type_name == "Mode" and isinstance(value, str):
        return value.strip().lower()
    if isinstance(value, str):
        return value.strip()
    return value


def _number_from_text(value: Any, bad: ConfigError, parse: Callable[[str], int | float]) -> Any:
    """Text (environment variables arrive as text) parsed by ``parse``; ``True`` is not a number."""
    if isinstance(value, bool):
        raise bad
    if isinstance(value, str):
        try:
            return parse(value.strip())
        except ValueError:
            raise bad from None
    return value


def _coerce_int(value: Any, bad: ConfigError) -> Any:
    """YAML may write ``4.0`` for a count; anything else is left for validation to reject."""
    value = _number_from_text(value, bad, int)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _coerce_float(value: Any, bad: ConfigError) -> Any:
    """Text and ints become floats; anything else is left for validation to reject with its own message."""
    value = _number_from_text(value, bad, float)
    return float(value) if isinstance(value, int) else value


def _coerce_names(value: Any, bad: ConfigError) -> tuple[str, ...]:
    """A list of names from a comma-separated string (environment) or a YAML/JSON list."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    raise bad


_COERCERS: dict[str, Callable[[Any, ConfigError], Any]] = {
    "int": _coerce_int,
    "float": _coerce_float,
    "tuple[str, ...]": _coerce_names,
}


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def _check_float(name: str, value: Any, low: float, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value}; use a large finite value instead")
    if value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be {bounds}, got {value}")


def _check_choice(name: str, value: Any, choices: list[Any]) -> None:
    plain = value.value if isinstance(value, enum.Enum) else value
    if plain not in choices:
        options = " | ".join(str(c) for c in choices)
        raise ConfigError(f"{name} must be one of {options}, got {value!r}")
