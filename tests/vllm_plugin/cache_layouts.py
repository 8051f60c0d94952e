"""Cache writers in the layouts vLLM's backends use, for layout tests that need no engine.

Each writer has the signature of :data:`growpage.vllm_plugin.keys.CacheWrite`. The synthetic ones
reproduce the CPU ``vec`` layout (K transposed per block and head) and a row-major layout (the
order GPU backends use within a block); :func:`vllm_cpu_writer` is vLLM's own CPU kernel for one
ISA (``vec``, ``vec16``, ``amx``), used where vLLM is installed and the ISA runs on this CPU.
"""

from __future__ import annotations

import torch

from growpage.vllm_plugin import keys as kv_keys


def _write(key, value, cache, slot_mapping, keys_transposed: bool) -> None:
    """Per (block, head): K (``[head_dim, block_size]`` if transposed, else ``[block_size, head_dim]``)
    then V (``[block_size, head_dim]``)."""
    num_blocks, heads, block_size, two_head_dim = cache.shape
    head_dim = two_head_dim // 2
    flat = cache.view(num_blocks, heads, block_size * two_head_dim)
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        keys = flat[block, :, :block_size * head_dim]
        if keys_transposed:
            keys.view(heads, head_dim, block_size)[:, :, offset] = key[token]
        else:
            keys.view(heads, block_size, head_dim)[:, offset] = key[token]
        flat[block, :, block_size * head_dim:].view(heads, block_size, head_dim)[:, offset] = value[token]


def transposed_write(key, value, cache, slot_mapping) -> None:
    """The CPU ``vec`` layout: per (block, head), K as ``[head_dim, block_size]`` then V row-major."""
    _write(key, value, cache, slot_mapping, keys_transposed=True)


def row_major_write(key, value, cache, slot_mapping) -> None:
    """Per (block, head), K then V, both ``[block_size, head_dim]``."""
    _write(key, value, cache, slot_mapping, keys_transposed=False)


def lossy_write(key, value, cache, slot_mapping) -> None:
    """A cache that stores values scaled (as a quantized cache would): must not be trusted."""
    row_major_write(key * 0.5, value * 0.5, cache, slot_mapping)


def vllm_cpu_writer(isa: str):
    """vLLM's CPU cache update for ``isa``, exactly as ``CPUAttentionBackendImpl`` calls it."""
    from vllm import _custom_ops as ops

    def write(key, value, cache, slot_mapping) -> None:
        num_blocks, heads, block_size, _ = cache.shape
        key_cache, value_cache = cache.view(num_blocks, heads, block_size * 2, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa)

    return write


def available_vllm_isas(dtype: torch.dtype, block_size: int, head_dim: int) -> list[str]:
    """The CPU kernel ISAs that run here for this geometry (empty without vLLM)."""
    try:
        from vllm import _custom_ops  # noqa: F401
    except ImportError:
        return []
    isas = ["vec"] if block_size % 32 == 0 else []
    isas.append("vec16")
    if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16 and block_size % 32 == 0:
        isas.append("amx")
    return isas


def probed(write, num_blocks: int, heads: int, block_size: int, head_dim: int,
           dtype: torch.dtype = torch.float32) -> kv_keys.BlockLayout:
    cache = torch.zeros(num_blocks, heads, block_size, 2 * head_dim, dtype=dtype)
    layout = kv_keys.probe_layout(write, cache, heads, block_size, head_dim)
    assert layout is not None
    return layout
