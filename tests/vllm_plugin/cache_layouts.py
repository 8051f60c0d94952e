"""Cache writers in the layouts vLLM's backends use, for layout tests that need no engine.

Each writer has the signature of :data:`growpage.vllm_plugin.keys.CacheWrite`. The synthetic ones
reproduce the CPU ``vec`` layout (K transposed per block and head), the CPU ``amx`` layout (VNNI
pairs) and a row-major layout (the order GPU backends use within a block); :func:`vllm_cpu_writer`
is vLLM's own CPU kernel for one ISA (``vec``, ``vec16``, ``amx``), used where vLLM is installed
and the ISA runs on this CPU.
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


def amx_like_write(key, value, cache, slot_mapping) -> None:
    """The CPU ``amx`` kernels' layout (VNNI pairs), for hosts without AMX: per (block, head), K in
    tiles of 16 slots, each ``[head_dim / 2, 16, 2]`` (a slot's dims in pairs), then V in tiles of
    16 dims, each ``[block_size / 2, 16, 2]`` (pairs of slots). Neither is affine in (slot, dim)."""
    num_blocks, heads, block_size, two_head_dim = cache.shape
    head_dim = two_head_dim // 2
    flat = cache.view(num_blocks, heads, block_size * two_head_dim)
    dims = torch.arange(head_dim)
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        key_at = (offset // 16) * 16 * head_dim + (dims // 2) * 32 + (offset % 16) * 2 + dims % 2
        value_at = (block_size * head_dim + (dims // 16) * 16 * block_size + (offset // 2) * 32
                    + (dims % 16) * 2 + offset % 2)
        flat[block, :, key_at] = key[token]
        flat[block, :, value_at] = value[token]


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


def flash_write(key, value, cache, slot_mapping) -> None:
    """The cache update of vLLM's ``FLASH_ATTN``, ``FLASHINFER`` and ``TRITON_ATTN`` (unquantized), in
    torch: ``kv_cache.transpose(1, 2).split(head_size, dim=-1)`` gives ``[blocks, slots, heads, dim]``
    K and V views of the logical ``[blocks, heads, slots, 2 * dim]`` cache, and
    ``reshape_and_cache_flash`` stores token ``t`` at ``(slot // block_size, slot % block_size)``
    through those views' strides, whatever the deployment's ``KVCacheLayout``."""
    head_dim = key.shape[-1]
    key_cache, value_cache = cache.transpose(1, 2).split(head_dim, dim=-1)
    block_size = key_cache.shape[1]
    written = slot_mapping >= 0
    slots = slot_mapping[written].long()
    key_cache[slots // block_size, slots % block_size] = key[: slot_mapping.numel()][written]
    value_cache[slots // block_size, slots % block_size] = value[: slot_mapping.numel()][written]


# The call each GPU backend makes, as its source spells it (checked against the installed vLLM).
FLASH_WRITE_SOURCE = "kv_cache.transpose(1, 2).split("


def vllm_layer_caches(layout_name: str, num_layers: int, num_blocks: int, heads: int, block_size: int,
                      head_dim: int, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    """Per-layer caches exactly as vLLM's worker builds them for ``layout_name`` (one ``int8``
    allocation viewed through ``create_kv_cache_views``), zeroed."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout

    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_dim, dtype=dtype)
    layout = KVCacheLayout[layout_name]
    strides = compute_layout_strides(spec, num_blocks, num_layers, layout)
    size = spec.page_size_bytes * num_blocks * num_layers
    tensor = KVCacheTensor(size=size, layers=[f"model.layers.{i}.self_attn.attn" for i in range(num_layers)],
                           layer_stride=strides[0], block_stride=strides[1])
    return create_kv_cache_views(torch.zeros(size, dtype=torch.int8, device=device), spec, num_blocks, layout,
                                 tensor)


def cuda_flash_write(key, value, cache, slot_mapping) -> None:
    """vLLM's real ``reshape_and_cache_flash`` CUDA kernel, called as its CUDA backends call it."""
    key_cache, value_cache = cache.transpose(1, 2).split(key.shape[-1], dim=-1)
    scale = torch.ones((), dtype=torch.float32, device=cache.device)
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, "auto",
                                                   scale, scale)


def transposed_cache(keys: torch.Tensor, block_size: int, num_blocks: int) -> torch.Tensor:
    """A CPU ``vec`` cache holding ``keys`` ([tokens, kv_heads, hd]) in blocks 0.. (K transposed)."""
    tokens, heads, head_dim = keys.shape
    cache = torch.zeros(num_blocks, heads, block_size, 2 * head_dim)
    flat = cache.view(num_blocks, heads, block_size * 2 * head_dim)
    for t in range(tokens):
        block, offset = divmod(t, block_size)
        for h in range(heads):
            flat[block, h, :block_size * head_dim].view(head_dim, block_size)[:, offset] = keys[t, h]
    return cache
