"""Paged KV caches laid out as vLLM's worker lays them out, built with torch alone.

vLLM carves every layer's cache out of one ``int8`` allocation: a logical ``[L, B, H, N, C]``
tensor (layers, blocks, KV heads, slots, content bytes: K then V of one head and slot) whose
physical axis order is the deployment's ``KVCacheLayout``, viewed per layer as ``[B, H, N, 2 *
head_dim]`` of the model's dtype. :func:`layer_caches` rebuilds those strided views without vLLM
(the layout tests pin them to vLLM's own ``create_kv_cache_views``), so the torch-only GPU checks
and the benchmarks read, score and move keys in every layout the CUDA backends use.
:func:`flash_write` is the store ``FLASH_ATTN``, ``FLASHINFER`` and ``TRITON_ATTN`` make
(``reshape_and_cache_flash``), in torch.
"""

from __future__ import annotations

import torch

# KVCacheLayout: logical axes [L, B, H, N, C] in physical order, outermost first
LAYOUT_ORDERS: dict[str, tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def layout_strides(layout_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of the logical ``[L, B, H, N, C]`` ``shape``, packed in the layout's physical order."""
    strides = [0] * len(shape)
    current = 1
    for axis in reversed(LAYOUT_ORDERS[layout_name]):
        strides[axis] = current
        current *= shape[axis]
    return tuple(strides)


def layer_caches(layout_name: str, num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int,
                 head_dim: int, dtype: torch.dtype, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Per-layer caches in one zeroed allocation, as vLLM builds them for ``layout_name``.

    Returns:
        ``num_layers`` views ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]`` of ``dtype``
        sharing one storage (unpadded pages, no kernel-block split).
    """
    element = torch.empty((), dtype=dtype).element_size()
    shape = (num_layers, num_blocks, num_kv_heads, block_size, 2 * head_dim * element)
    strides = layout_strides(layout_name, shape)
    raw = torch.zeros(num_layers * num_blocks * num_kv_heads * block_size * 2 * head_dim * element,
                      dtype=torch.int8, device=device)
    logical = torch.as_strided(raw, shape, strides, 0)
    return [logical[layer].view(dtype) for layer in range(num_layers)]


def flash_write(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """The CUDA backends' cache update, in torch (a :data:`~growpage.vllm_plugin.keys.CacheWrite`).

    ``kv_cache.transpose(1, 2).split(head_dim, dim=-1)`` gives ``[blocks, slots, heads, dim]`` K
    and V views of the logical cache, and token ``t`` lands at ``(slot // block_size, slot %
    block_size)`` through their strides, whatever the layout; slots < 0 are skipped.

    Args:
        key, value: ``[tokens, kv_heads, head_dim]``.
        cache: one layer's ``[blocks, kv_heads, slots, 2 * head_dim]`` view.
        slot_mapping: ``[tokens]`` slot ids.
    """
    head_dim = key.shape[-1]
    key_cache, value_cache = cache.transpose(1, 2).split(head_dim, dim=-1)
    block_size = key_cache.shape[1]
    written = slot_mapping >= 0
    slots = slot_mapping[written].long()
    key_cache[slots // block_size, slots % block_size] = key[: slot_mapping.numel()][written].to(cache.dtype)
    value_cache[slots // block_size, slots % block_size] = value[: slot_mapping.numel()][written].to(cache.dtype)
