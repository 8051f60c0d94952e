"""vLLM's objects as GrowPage reads them, as ``Protocol`` types.

GrowPage imports no vLLM where it decides (the tests drive it with stand-ins), so it names the
attributes it reads here, once: mypy checks every use against these, and a vLLM upgrade that renames
one is found by reading this file against vLLM's (``versions.SUPPORTED_VLLM_SPEC`` pins the version
they were written for: ``vllm/v1/request.py``, ``vllm/v1/core/kv_cache_manager.py``,
``vllm/v1/core/block_pool.py``, ``vllm/v1/core/sched/scheduler.py``, ``vllm/v1/kv_cache_interface.py``,
``vllm/config/``, ``vllm/v1/worker/``, ``vllm/v1/outputs.py``). Only what GrowPage reads is declared;
attributes it writes are declared writable. Members of the configuration and worker-side Protocols
are read-only properties, so that vLLM's own classes satisfy them where a real one reaches GrowPage
(``get_current_vllm_config()`` in the attention backend): mypy then checks them against vLLM's classes.

vLLM's own classes are named only under ``TYPE_CHECKING``, for values GrowPage hands back to vLLM
as they came (``ParallelConfig``) or sets of vLLM's enum (``CUDAGraphMode``): nothing here imports
vLLM when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Protocol, TypedDict

if TYPE_CHECKING:
    import numpy as np
    import torch
    from vllm.config import CUDAGraphMode, ParallelConfig


# ---- the scheduler side --------------------------------------------------------------------------


class KVBlock(Protocol):
    """``vllm.v1.core.kv_cache_utils.KVCacheBlock``."""

    block_id: int
    ref_cnt: int
    block_hash: object


class SamplingParams(Protocol):
    """``vllm.SamplingParams``: the per-request ``extra_args`` (namespace, requested mode)."""

    extra_args: dict[str, object] | None  # the client's vllm_xargs: JSON values, checked where read


class Request(Protocol):
    """``vllm.v1.request.Request`` (``num_computed_tokens`` is written back by the allocation wrapper)."""

    request_id: str
    num_computed_tokens: int
    max_tokens: int
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


class KVCacheSpec(Protocol):
    """``vllm.v1.kv_cache_interface.KVCacheSpec``: one layer's page, for the bytes a token takes."""

    @property
    def block_size(self) -> int: ...

    @property
    def page_size_bytes(self) -> int: ...


class KVCacheGroupSpec(Protocol):
    """``vllm.v1.kv_cache_interface.KVCacheGroupSpec``: the layers sharing one block table, and their spec."""

    @property
    def layer_names(self) -> Sequence[str]: ...

    @property
    def kv_cache_spec(self) -> KVCacheSpec: ...


class KVCacheConfig(Protocol):
    """``vllm.v1.kv_cache_interface.KVCacheConfig``: its groups (GrowPage runs on one-group models)."""

    @property
    def kv_cache_groups(self) -> Sequence[KVCacheGroupSpec]: ...


class Scheduler(Protocol):
    """``vllm.v1.core.sched.scheduler.Scheduler``: its queues and its KV cache manager
    (``max_num_active_reqs``, the admission limit, is read and written duck-typed: older vLLMs lack it)."""

    running: list[Request]
    waiting: RequestQueue
    kv_cache_manager: KVCacheManager
    kv_cache_config: KVCacheConfig  # its groups' cache specs (token bytes)
    vllm_config: VllmConfig  # read once, at the agent's start, by the settings resolver
    scheduler_config: SchedulerConfig


# ---- configuration (read by the scheduler and the workers) ---------------------------------------


class ModelConfig(Protocol):
    """``vllm.config.ModelConfig``: the ``model_name`` label, and the layer count the observer samples from."""

    @property
    def model(self) -> str: ...

    @property
    def served_model_name(self) -> str | list[str] | None: ...

    def get_num_layers(self, parallel_config: ParallelConfig) -> int: ...


class SchedulerConfig(Protocol):
    """``vllm.config.SchedulerConfig``: the most requests a step runs (the observer's summary rows)."""

    @property
    def max_num_seqs(self) -> int: ...


class VllmConfig(Protocol):
    """``vllm.config.VllmConfig``: the sections GrowPage reads by name. The optional ones (compilation,
    cache, device, observability, ``additional_config``) are read with ``getattr`` fallbacks, so
    stand-in configs work, and are not declared."""

    @property
    def model_config(self) -> ModelConfig: ...

    @property
    def parallel_config(self) -> ParallelConfig: ...

    @property
    def scheduler_config(self) -> SchedulerConfig: ...


# ---- the worker side -----------------------------------------------------------------------------


class ModelRunner(Protocol):
    """What both of vLLM's GPU model runners (V1 ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``,
    which the CPU runner subclasses, and V2 ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``) have
    in common that GrowPage reads: the config it was built from."""

    @property
    def vllm_config(self) -> VllmConfig: ...


class BlockTable(Protocol):
    """``vllm.v1.worker.block_table.BlockTable``: one KV cache group's block ids per batch row."""

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor: ...


class MultiGroupBlockTable(Protocol):
    """``vllm.v1.worker.block_table.MultiGroupBlockTable``: a block table per KV cache group."""

    @property
    def block_tables(self) -> Sequence[BlockTable]: ...


class V1InputBatch(Protocol):
    """``vllm.v1.worker.gpu_input_batch.InputBatch``: V1's persistent batch, rows in ``req_ids`` order."""

    @property
    def req_ids(self) -> Sequence[str]: ...

    @property
    def block_table(self) -> MultiGroupBlockTable: ...


class V1ModelRunner(ModelRunner, Protocol):
    """V1 ``GPUModelRunner`` (and the CPU runner): its persistent batch. The host mirrors of the
    query starts and lengths (``query_start_loc.cpu``, ``optimistic_seq_lens_cpu``) are read with
    ``getattr`` fallbacks, so they are not declared."""

    @property
    def input_batch(self) -> V1InputBatch: ...


class V2InputBatch(Protocol):
    """``vllm.v1.worker.gpu.input_batch.InputBatch``: Model Runner V2's batch of one step (host arrays)."""

    @property
    def num_reqs(self) -> int: ...

    @property
    def req_ids(self) -> Sequence[str]: ...

    @property
    def query_start_loc_np(self) -> np.ndarray: ...

    @property
    def num_computed_tokens_np(self) -> np.ndarray: ...

    @property
    def num_scheduled_tokens(self) -> np.ndarray: ...


class NewRequestData(Protocol):
    """``vllm.v1.core.sched.output.NewRequestData``: a request the worker sees for the first time."""

    @property
    def req_id(self) -> str: ...

    @property
    def prompt_token_ids(self) -> list[int] | None: ...

    @property
    def sampling_params(self) -> SamplingParams | None: ...


class AttentionImpl(Protocol):
    """An attention backend's impl as the observer reads it (``vllm.v1.attention.backend.AttentionImpl``)."""

    @property
    def num_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def scale(self) -> float: ...


class HostDeviceBuffer(Protocol):
    """``vllm.v1.utils.CpuGpuBuffer``: a host tensor and its device copy."""

    @property
    def cpu(self) -> torch.Tensor: ...

    @property
    def gpu(self) -> torch.Tensor: ...


class CachedRequestState(Protocol):
    """``vllm.v1.worker.gpu_input_batch.CachedRequestState``: a request's block ids per KV cache group."""

    @property
    def block_ids(self) -> tuple[list[int], ...]: ...


class GroupBlockTable(Protocol):
    """One KV cache group's ``BlockTable`` as a compaction rewrites it (host rows, device slots)."""

    @property
    def num_blocks_per_row(self) -> np.ndarray: ...

    @property
    def block_table(self) -> HostDeviceBuffer: ...

    @property
    def slot_mapping(self) -> HostDeviceBuffer: ...


class GroupBlockTables(Protocol):
    @property
    def block_tables(self) -> Sequence[GroupBlockTable]: ...


class CompactionInputBatch(Protocol):
    """V1's persistent batch as a compaction reads and rewrites it."""

    @property
    def num_reqs(self) -> int: ...

    @property
    def req_ids(self) -> Sequence[str]: ...

    @property
    def req_id_to_index(self) -> dict[str, int]: ...

    @property
    def num_computed_tokens_cpu(self) -> np.ndarray: ...

    @property
    def block_table(self) -> GroupBlockTables: ...


class CompactingRunner(Protocol):
    """V1 ``GPUModelRunner`` (and the CPU runner) as the compactor moves a request's tokens and
    rewrites its inputs to physical lengths (:mod:`~growpage.vllm_plugin.compactor`)."""

    @property
    def requests(self) -> dict[str, CachedRequestState]: ...

    @property
    def input_batch(self) -> CompactionInputBatch: ...

    @property
    def query_start_loc(self) -> HostDeviceBuffer: ...

    @property
    def seq_lens(self) -> torch.Tensor: ...

    @property
    def optimistic_seq_lens_cpu(self) -> torch.Tensor: ...

    @property
    def kv_caches(self) -> list[torch.Tensor]: ...


class Worker(Protocol):
    """``vllm.v1.worker.gpu_worker.Worker`` (and the CPU worker): the model runner it drives."""

    @property
    def model_runner(self) -> ModelRunner: ...


class AsyncModelRunnerOutput(Protocol):
    """``vllm.v1.outputs.AsyncModelRunnerOutput``: a step's output resolved later, by ``get_output()``.
    Declared writable: GrowPage replaces it on the instance to attach the worker's report to what it
    resolves to."""

    get_output: Callable[[], object]


class AttentionBackend(Protocol):
    """``vllm.v1.attention.backend.AttentionBackend`` (the class, subclassed by GrowPage): its impl class."""

    @staticmethod
    def get_impl_cls() -> type: ...


class CudagraphDispatchKeywords(TypedDict, total=False):
    """The keyword arguments of V1's ``CudagraphDispatcher.dispatch`` (``vllm/v1/cudagraph_dispatcher.py``)
    after ``num_tokens``: GrowPage reads and rewrites the two mode sets."""

    uniform_decode: bool
    has_lora: bool
    num_active_loras: int
    valid_modes: AbstractSet[CUDAGraphMode] | None
    invalid_modes: AbstractSet[CUDAGraphMode] | None


# ---- the front-end -------------------------------------------------------------------------------


class FrontEndRequestState(Protocol):
    """``vllm.v1.engine.output_processor.RequestState``: the request id its ``llm_request`` span is for."""

    @property
    def request_id(self) -> str: ...
