"""What the quality and serving benchmarks share: one model in memory, one engine per KV method.

Every engine runs the same model weights on the same page geometry; only the KV method (what
happens at a page boundary) and the pool size differ. ``full_kv`` runs with GrowPage off, so it pays
no observation cost: it is vLLM's paging as a user runs it today.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from growpage.chat import chat_token_ids, user_turn
from growpage.config import GrowPageConfig, Mode, load_config
from growpage.core.methods import METHOD_NAMES, KVMethod, build_method
from growpage.core.stats import StatsSnapshot
from growpage.engine.engine import EngineConfig, LLMEngine, _load_tokenizer
from growpage.engine.llama import LlamaModel

if TYPE_CHECKING:
    from growpage.bench.workloads import Task


class RunSettings(Protocol):
    """What :func:`prepare` reads of a benchmark's settings (quality and serving both have it)."""

    @property
    def methods(self) -> tuple[str, ...]: ...

    @property
    def threads(self) -> int | None: ...

    def tasks(self) -> list[Task]: ...


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The model and tokenizer, loaded once and shared by every engine of a run."""

    model_dir: str
    model: LlamaModel
    tokenizer: Any  # a transformers tokenizer


POOLS = ("ample", "budget")


def check_pool(pool: str) -> None:
    """A comparison's pool: ``ample`` (no request ever waits) or ``budget`` (equal memory)."""
    if pool not in POOLS:
        raise ValueError(f"pool must be 'ample' or 'budget', not {pool!r}")


def check_methods(methods: tuple[str, ...]) -> None:
    unknown = sorted(set(methods) - set(METHOD_NAMES))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {', '.join(METHOD_NAMES)}")


def load(model_dir: str, threads: int | None = None) -> Loaded:
    if threads:
        torch.set_num_threads(threads)
    return Loaded(model_dir, LlamaModel.from_pretrained(model_dir, dtype=torch.float32, device="cpu"),
                  _load_tokenizer(model_dir))


def chat_ids(loaded: Loaded, prompt: str) -> list[int]:
    return chat_token_ids(loaded.tokenizer, user_turn(prompt))


def prepare(model_dir: str, settings: RunSettings,
            loaded: Loaded | None = None) -> tuple[Loaded, list[Task], dict[str, list[int]]]:
    """What every comparison run starts with: methods checked, the model loaded (unless shared),
    the settings' tasks and their chat-templated prompt ids by task id."""
    check_methods(settings.methods)
    loaded = loaded or load(model_dir, settings.threads)
    tasks = settings.tasks()
    return loaded, tasks, {t.task_id: chat_ids(loaded, t.prompt) for t in tasks}


def decision_counts(snapshot: StatsSnapshot) -> dict[str, int]:
    """Decisions (and refusals) taken during a run, by kind, zero counts left out."""
    return {kind: count for kind, count in snapshot.decisions_total.items() if count}


def kv_bytes_per_token(loaded: Loaded) -> int:
    """FP16 KV bytes of one token across all layers (23,040 for SmolLM2-135M)."""
    g = loaded.model.config
    return g.num_layers * 2 * g.num_kv_heads * g.head_dim * 2


class StepClock:
    """A clock that advances a fixed amount per engine step, so throttle decisions (which read a
    clock) are identical from run to run whatever the machine's speed."""

    def __init__(self, seconds_per_step: float):
        self.seconds_per_step = seconds_per_step
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1

    def __call__(self) -> float:
        return self.steps * self.seconds_per_step


# The thresholds a calibrated config file sets for the benchmarks (``gpctl calibrate``'s output);
# base_pages stays each benchmark's own variable.
CALIBRATED_KEYS = ("lts_grow_threshold", "density_threshold", "rollout_entropy_threshold")


def thresholds_from(path: str | None) -> dict[str, float]:
    """The calibrated thresholds of a GrowPage config file (empty: the published defaults).

    Raises:
        ConfigError: the file is missing or invalid (one line, says which key).
    """
    return dict(_calibrated(path)) if path else {}


@functools.lru_cache(maxsize=8)
def _calibrated(path: str) -> tuple[tuple[str, float], ...]:
    """Read once per run: every (method, budget, pool) engine of a benchmark asks for it."""
    config = load_config(path, env={})
    return tuple((key, float(getattr(config, key))) for key in CALIBRATED_KEYS)


def build_engine(loaded: Loaded, method_name: str, *, base_pages: int, num_pages: int, block_size: int,
                 max_num_seqs: int, clock: Callable[[], float] | None = None,
                 max_num_batched_tokens: int = 2048, seed: int = 0, mode: str | None = None,
                 thresholds: dict[str, float] | None = None,
                 attention_coverage: float = 0.0) -> tuple[LLMEngine, KVMethod]:
    """An engine whose manager runs ``method_name`` (GrowPage off for ``full_kv``), with
    ``thresholds`` (from :func:`thresholds_from`) over the defaults; a method that pins its own
    (``growpage_uncalibrated``) keeps them. ``attention_coverage`` raises GrowPage's floors to that
    share of each request's observed attention (the fixed caps ignore it)."""
    method = build_method(method_name, seed=seed)
    mode = mode or ("off" if method.family == "full" else "enforce")
    config = GrowPageConfig(mode=Mode(mode), base_pages=base_pages, block_size=block_size, kv_dtype="float16",
                            attention_coverage=attention_coverage).replace(**(thresholds or {}))
    engine = LLMEngine(EngineConfig(model_dir=loaded.model_dir, num_pages=num_pages, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False),
                       config, model=loaded.model, tokenizer=loaded.tokenizer, method=method,
                       clock=clock or time.monotonic)
    return engine, method


