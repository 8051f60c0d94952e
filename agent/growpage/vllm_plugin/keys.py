"""Where an attention backend keeps each token's K and V inside a block, learned from the backend.

vLLM's paged caches differ by backend and by kernel ISA: the CPU backend's ``vec`` kernels store K
transposed (``[head_dim, block_size]`` per block and head), its ``amx`` kernels pack K for AMX
tiles, ``vec16`` differs again, and GPU backends order ``[block, slot, head, dim]``. Rather than
hard-coding one reader per layout, the observer *probes* the layout once per process: it asks the
backend's own cache-update method (the one vLLM calls every step) to write probe keys and values
into a one-block scratch cache, each element carrying its own coordinates in base-64 digits (small
integers, exact in bf16/fp16/fp32), and reads back where each landed. The result, a
:class:`BlockLayout`, is two index maps from ``(head, slot, dim)`` to an element offset inside a
block. Reading keys and moving tokens are then one gather/scatter on the cache's own device,
whatever the layout. A layout that does not round-trip exactly (a quantized FP8 cache, a
non-contiguous cache) gives ``None``: the observer stays off in that process, and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

DIGIT_BASE = 64  # digits 1..64 are exact in every float KV dtype vLLM uses (bf16 holds integers to 256)

# write(key [tokens, kv_heads, head_dim], value (same), cache, slot_mapping [tokens] long)
CacheWrite = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Element offsets of K and V inside one block of a cache whose first axis is the block.

    Attributes:
        key_index: ``[num_kv_heads, block_size, head_dim]`` long, offsets into ``block.view(-1)``.
        value_index: the same for V.
    """

    key_index: torch.Tensor
    value_index: torch.Tensor

    @property
    def block_size(self) -> int:
        return int(self.key_index.shape[1])

    def to(self, device: torch.device) -> BlockLayout:
        return BlockLayout(self.key_index.to(device), self.value_index.to(device))


def probe_layout(write: CacheWrite, cache_like: torch.Tensor, num_kv_heads: int, block_size: int,
                 head_dim: int) -> BlockLayout | None:
    """Learn the block layout from the backend's own write (see the module docstring).

    Args:
        write: the backend's cache update, called on a scratch cache shaped like ``cache_like``
            with one block.
        cache_like: one layer's real cache (block axis first); only its shape, dtype and device
            are used.
        num_kv_heads, block_size, head_dim: the cache's geometry.

    Returns:
        The layout, or None when the probe does not round-trip exactly.
    """
    if not cache_like.is_contiguous():
        return None
    device = cache_like.device
    scratch = torch.zeros((1, *cache_like.shape[1:]), dtype=cache_like.dtype, device=device)
    count = num_kv_heads * block_size * head_dim
    # coordinate of (slot, head, dim), in the [tokens, heads, head_dim] order vLLM writes
    coordinates = torch.arange(count, device=device).view(num_kv_heads, block_size, head_dim).permute(1, 0, 2)
    slots = torch.arange(block_size, dtype=torch.long, device=device)
    num_digits = 1
    while DIGIT_BASE ** num_digits < count:
        num_digits += 1
    indices = []
    for writes_key in (True, False):
        found: torch.Tensor | None = None
        positions: torch.Tensor | None = None
        for digit in range(num_digits):
            probe = ((coordinates // DIGIT_BASE ** digit) % DIGIT_BASE + 1).to(cache_like.dtype)
            zeros = torch.zeros_like(probe)
            scratch.zero_()
            write(probe if writes_key else zeros, zeros if writes_key else probe, scratch, slots)
            flat = scratch.reshape(-1).float()
            written = flat.nonzero().flatten()
            if positions is None:
                positions, found = written, torch.zeros(written.numel(), dtype=torch.long, device=device)
            if written.numel() != count or not torch.equal(written, positions):
                return None
            digits = flat[written].round().long() - 1
            if ((digits < 0) | (digits >= DIGIT_BASE)).any():
                return None
            assert found is not None
            found += digits * DIGIT_BASE ** digit
        assert found is not None and positions is not None
        if not torch.equal(torch.sort(found).values, torch.arange(count, device=device)):
            return None  # not a permutation: values were transformed (quantized, scaled)
        index = torch.empty(count, dtype=torch.long, device=device)
        index[found] = positions
        indices.append(index.view(num_kv_heads, block_size, head_dim))
    return BlockLayout(key_index=indices[0], value_index=indices[1])


def _blocks(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, elements per block]``, a view: writes reach the cache."""
    return kv_cache.view(kv_cache.shape[0], -1)


def read_keys(kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int, kv_heads: torch.Tensor,
              layout: BlockLayout) -> torch.Tensor:
    """Keys of one request's first ``seq_len`` tokens.

    Args:
        kv_cache: one layer's cache (block axis first).
        block_row: the request's block-table row (block ids, position order).
        seq_len: tokens in the cache for this request, this step's included.
        kv_heads: ``[H]`` long, the KV heads to read.
        layout: from :func:`probe_layout`.

    Returns:
        ``[H, seq_len, head_dim]`` in the cache dtype (a copy; the cache is never written).
    """
    block_size = layout.block_size
    num_blocks = -(-seq_len // block_size)
    blocks = _blocks(kv_cache).index_select(0, block_row[:num_blocks].long().to(kv_cache.device))
    index = layout.key_index.index_select(0, kv_heads.to(layout.key_index.device))  # [H, bs, hd]
    keys = blocks[:, index]  # [n, H, bs, hd]
    heads, head_dim = index.shape[0], index.shape[2]
    return keys.permute(1, 0, 2, 3).reshape(heads, num_blocks * block_size, head_dim)[:, :seq_len]


def read_keys_batched(kv_cache: torch.Tensor, block_rows: torch.Tensor, kv_heads: torch.Tensor,
                      layout: BlockLayout) -> torch.Tensor:
    """Keys of several requests in one gather (no Python loop over requests).

    Args:
        kv_cache: one layer's cache (block axis first, contiguous).
        block_rows: ``[R, M]`` block ids, each request's first ``M`` blocks (entries past a
            request's own blocks may be anything in range: callers mask by sequence length).
        kv_heads: ``[H]`` long, the KV heads to read.
        layout: from :func:`probe_layout`.

    Returns:
        ``[R, H, M * block_size, head_dim]`` in the cache dtype.
    """
    flat = kv_cache.reshape(-1)
    block_numel = flat.numel() // kv_cache.shape[0]
    index = layout.key_index.index_select(0, kv_heads.to(layout.key_index.device))  # [H, bs, hd]
    rows = block_rows.long().to(kv_cache.device).clamp(0, kv_cache.shape[0] - 1)
    offsets = rows[:, :, None, None, None] * block_numel + index[None, None]  # [R, M, H, bs, hd]
    keys = flat[offsets]
    num_requests, num_blocks, heads, block_size, head_dim = keys.shape
    return keys.permute(0, 2, 1, 3, 4).reshape(num_requests, heads, num_blocks * block_size, head_dim)


def read_token(kv_cache: torch.Tensor, slot: int, layout: BlockLayout, value: bool = False) -> torch.Tensor:
    """``[num_kv_heads, head_dim]``: the K (or V) of one cache slot (for checks)."""
    block, offset = divmod(slot, layout.block_size)
    index = (layout.value_index if value else layout.key_index)[:, offset]
    return _blocks(kv_cache)[block][index]


def move_tokens(kv_cache: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor,
                layout: BlockLayout) -> None:
    """Copy K and V of ``src_slots`` into ``dst_slots`` in one layer's cache (gather, then scatter).

    Args:
        kv_cache: one layer's cache (block axis first, contiguous).
        src_slots, dst_slots: ``[N]`` slot ids (``block * block_size + offset``); every source is
            read before any destination is written, so the two may overlap.
        layout: from :func:`probe_layout`.
    """
    if src_slots.numel() == 0:
        return
    blocks = _blocks(kv_cache)
    block_size = layout.block_size
    src_slots, dst_slots = src_slots.long().to(kv_cache.device), dst_slots.long().to(kv_cache.device)
    src_block, src_offset = (src_slots // block_size)[:, None, None], src_slots % block_size
    dst_block, dst_offset = (dst_slots // block_size)[:, None, None], dst_slots % block_size
    moved = [blocks[src_block, index[:, src_offset].transpose(0, 1)]
             for index in (layout.key_index, layout.value_index)]  # each [N, H, hd]
    for index, tokens in zip((layout.key_index, layout.value_index), moved, strict=True):
        blocks[dst_block, index[:, dst_offset].transpose(0, 1)] = tokens
