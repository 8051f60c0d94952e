"""The one seam per model runner: where a step's batch is read, whichever runner the worker drives.

Both of vLLM's GPU runners (V1 ``GPUModelRunner``, which the CPU runner subclasses, and Model
Runner V2 ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``, the default on CUDA) are driven by
the worker's ``execute_model`` and call the same attention backends; they differ in where a step's
batch lives while attention runs:

- V1 keeps a persistent ``input_batch`` (``req_ids`` in row order) and host mirrors of the query
  starts (``query_start_loc.cpu``) and lengths (``optimistic_seq_lens_cpu``);
- V2 builds an ``InputBatch`` per step in ``prepare_inputs`` and keeps it in a local variable, so
  :func:`remember_v2_batch` (wrapped around ``prepare_inputs`` by the worker hooks) keeps a handle
  on the runner for the length of the step. Its lengths are the host arrays
  ``num_computed_tokens_np + num_scheduled_tokens`` (no device read).

The block table is the attention metadata's where the backend has one (FlashAttention, Triton,
CPU), else V1's own table. Everything here reads host state: no device-to-host copy per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from growpage.vllm_plugin.vllm_types import ModelRunner, V1ModelRunner, V2InputBatch

V2_BATCH_ATTRIBUTE = "_growpage_input_batch"  # on a V2 runner: the step's InputBatch

BatchView = tuple[list[str], list[int], list[int], torch.Tensor]


def remember_v2_batch(runner: ModelRunner, input_batch: V2InputBatch) -> None:
    """Keep the V2 step's ``InputBatch`` on its runner until the next ``prepare_inputs``."""
    runner.__dict__[V2_BATCH_ATTRIBUTE] = input_batch


def batch_view(runner: Any, metadata: object) -> BatchView:
    """This step's request ids (batch row order), query starts, physical ``seq_lens`` and block table.

    ``runner`` is either model runner, told apart by the V2 batch remembered on it; ``metadata`` is
    the attention backend's.

    Raises:
        RuntimeError: the runner keeps no batch GrowPage knows how to read, or no block table can be
            found for it (counted as a fault by the caller; vLLM carries on).
    """
    # runner is Any: no type tells V1 from V2 here (the remembered batch does), and _v1_view reads V1's
    v2_batch = getattr(runner, "__dict__", {}).get(V2_BATCH_ATTRIBUTE)
    if v2_batch is not None:
        return _v2_view(v2_batch, metadata)
    return _v1_view(runner, metadata)


def _metadata_block_table(metadata: object) -> torch.Tensor | None:
    block_table = getattr(metadata, "block_table", None)
    return block_table if isinstance(block_table, torch.Tensor) else None


def _v1_view(runner: V1ModelRunner, metadata: Any) -> BatchView:
    # metadata is Any: its query_start_loc and seq_lens are read only where the runner keeps no host
    # copies of them, and FlashInfer's metadata has neither, so no Protocol of it would be true
    batch = runner.input_batch
    req_ids = list(batch.req_ids)
    num_reqs = len(req_ids)
    host_starts = getattr(getattr(runner, "query_start_loc", None), "cpu", None)
    host_lens = getattr(runner, "optimistic_seq_lens_cpu", None)
    if isinstance(host_starts, torch.Tensor) and isinstance(host_lens, torch.Tensor):
        starts = host_starts[:num_reqs + 1].tolist()
        seq_lens = host_lens[:num_reqs].tolist()
    else:
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
    block_table = _metadata_block_table(metadata)
    if block_table is None:  # FlashInfer's metadata has none: the runner's table of the first group
        block_table = batch.block_table.block_tables[0].get_device_tensor(num_reqs)
    return req_ids, starts, seq_lens, block_table


def _v2_view(input_batch: V2InputBatch, metadata: object) -> BatchView:
    num_reqs = int(input_batch.num_reqs)
    req_ids = list(input_batch.req_ids[:num_reqs])
    starts = [int(x) for x in input_batch.query_start_loc_np[:num_reqs + 1]]
    computed = input_batch.num_computed_tokens_np[:num_reqs]
    scheduled = input_batch.num_scheduled_tokens[:num_reqs]
    seq_lens = [int(c) + int(n) for c, n in zip(computed, scheduled, strict=True)]
    block_table = _metadata_block_table(metadata)
    if block_table is None:
        raise RuntimeError("Model Runner V2 with an attention backend whose metadata has no block table "
                           "(FlashInfer): GrowPage cannot read its keys; use FLASH_ATTN or TRITON_ATTN")
    return req_ids, starts, seq_lens, block_table
