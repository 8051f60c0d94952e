"""vLLM's scheduler-side objects as GrowPage reads them, as ``Protocol`` types.

GrowPage imports no vLLM where it decides (the tests drive it with stand-ins), so it names the
attributes it reads here, once: mypy checks every use against these, and a vLLM upgrade that renames
one is found by reading this file against vLLM's (``versions.SUPPORTED_VLLM_SPEC`` pins the version
they were written for: ``vllm/v1/request.py``, ``vllm/v1/core/kv_cache_manager.py``,
``vllm/v1/core/block_pool.py``, ``vllm/v1/core/sched/scheduler.py``). Only what GrowPage reads is
declared; attributes it writes are declared writable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol


class KVBlock(Protocol):
    """``vllm.v1.core.kv_cache_utils.KVCacheBlock``."""

    block_id: int
    ref_cnt: int
    block_hash: object


class SamplingParams(Protocol):
    """``vllm.SamplingParams``: the per-request ``extra_args`` (namespace, requested mode)."""

    extra_args: dict[str, Any] | None


class Request(Protocol):
    """``vllm.v1.request.Request`` (``num_computed_tokens`` is written back by the allocation wrapper)."""

    request_id: str
    num_computed_tokens: int
    sampling_params: SamplingParams | None

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def prompt_token_ids(self) -> list[int] | None: ...


class RequestQueue(Protocol):
    """``vllm.v1.core.sched.request_queue.RequestQueue``: the waiting requests, in vLLM's order."""

    def __iter__(self) -> Iterator[Request]: ...

    def __len__(self) -> int: ...

    def __bool__(self) -> bool: ...


class BlockPool(Protocol):
    """``vllm.v1.core.block_pool.BlockPool``."""

    num_gpu_blocks: int

    def get_num_free_blocks(self) -> int: ...

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None: ...

    def _maybe_evict_cached_block(self, block: KVBlock) -> bool: ...


class SingleTypeManager(Protocol):
    """One KV cache group's manager: each request's blocks, and how many of them are cached."""

    req_to_blocks: dict[str, list[KVBlock]]


class Coordinator(Protocol):
    single_type_managers: Sequence[SingleTypeManager]


class KVCacheManager(Protocol):
    """``vllm.v1.core.kv_cache_manager.KVCacheManager``."""

    block_pool: BlockPool
    coordinator: Coordinator


class Scheduler(Protocol):
    """``vllm.v1.core.sched.scheduler.Scheduler``: its queues and its KV cache manager
    (``max_num_active_reqs``, the admission limit, is read and written duck-typed: older vLLMs lack it)."""

    running: list[Request]
    waiting: RequestQueue
    kv_cache_manager: KVCacheManager
    kv_cache_config: Any  # vLLM's KVCacheConfig: its groups' cache specs (token bytes)
    vllm_config: Any  # read once, at the agent's start, by the settings resolver
    scheduler_config: Any
