"""Reading a request's cached keys out of vLLM's CPU paged KV cache.

The CPU cache of one layer is ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]``; each
(block, head) holds ``block_size * head_dim`` key elements then as many value elements. How the keys
are laid out inside depends on the kernel ISA: on ``vec`` (AVX2/AVX-512) K is stored transposed,
``[head_dim, block_size]``; other ISAs (AMX) pack differently. Rather than trusting the ISA name, the
layout is *detected*: after vLLM writes a step's keys, :func:`detect_layout` reads one back under
each known layout and keeps the one that matches the key just written. No match -> ``None``, and the
observer stays off for that process (counted, logged once) instead of observing garbage.
"""

from __future__ import annotations

import torch

TRANSPOSED = "transposed"  # [head_dim, block_size] per (block, head): the vec ISA
ROW_MAJOR = "row_major"  # [block_size, head_dim] per (block, head)
LAYOUTS = (TRANSPOSED, ROW_MAJOR)


def _key_blocks(kv_cache: torch.Tensor, block_ids: torch.Tensor, kv_heads: torch.Tensor,
                layout: str) -> torch.Tensor:
    """``[heads, n_blocks * block_size, head_dim]`` keys of ``block_ids`` for ``kv_heads``."""
    _, _, block_size, two_head_dim = kv_cache.shape
    head_dim = two_head_dim // 2
    blocks = kv_cache.index_select(0, block_ids).index_select(1, kv_heads)  # [n, H, bs, 2hd]
    num_blocks, num_heads = blocks.shape[0], blocks.shape[1]
    keys = blocks.reshape(num_blocks, num_heads, block_size * two_head_dim)[..., :block_size * head_dim]
    if layout == TRANSPOSED:
        keys = keys.reshape(num_blocks, num_heads, head_dim, block_size).transpose(2, 3)
    else:
        keys = keys.reshape(num_blocks, num_heads, block_size, head_dim)
    return keys.permute(1, 0, 2, 3).reshape(num_heads, num_blocks * block_size, head_dim)


def read_keys(kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int, kv_heads: torch.Tensor,
              layout: str) -> torch.Tensor:
    """Keys of one request's first ``seq_len`` tokens.

    Args:
        kv_cache: one layer's cache, ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]``.
        block_row: the request's block-table row (block ids, position order).
        seq_len: tokens in the cache for this request, this step's included.
        kv_heads: ``[H]`` long, the KV heads to read.
        layout: one of :data:`LAYOUTS`.

    Returns:
        ``[H, seq_len, head_dim]`` in the cache dtype (a copy; the cache is never written).
    """
    block_size = kv_cache.shape[2]
    num_blocks = -(-seq_len // block_size)
    keys = _key_blocks(kv_cache, block_row[:num_blocks].long(), kv_heads, layout)
    return keys[:, :seq_len]


def detect_layout(kv_cache: torch.Tensor, key: torch.Tensor, slot_mapping: torch.Tensor) -> str | None:
    """The layout under which the key of this step's first written token reads back exactly.

    Args:
        kv_cache: one layer's cache after vLLM's ``do_kv_cache_update``.
        key: ``[num_tokens, num_kv_heads, head_dim]`` keys vLLM just wrote.
        slot_mapping: ``[num_tokens]`` their slots (``-1``: not written).

    Returns:
        A name from :data:`LAYOUTS`, or None when no known layout matches (or nothing was written).
    """
    written = (slot_mapping[: key.shape[0]] >= 0).nonzero()
    if written.numel() == 0:
        return None
    token = int(written[0, 0])
    slot = int(slot_mapping[token])
    block_size = kv_cache.shape[2]
    block, offset = slot // block_size, slot % block_size
    expected = key[token].to(kv_cache.dtype).float()  # [kv_heads, head_dim]
    heads = torch.arange(kv_cache.shape[1])
    for layout in LAYOUTS:
        got = _key_blocks(kv_cache, torch.tensor([block]), heads, layout)[:, offset].float()
        if torch.allclose(got, expected, atol=1e-3, rtol=1e-2):
            return layout
    return None
