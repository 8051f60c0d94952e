"""Where an attention backend keeps each token's K and V, learned from the backend.

vLLM hands every attention layer a logical ``[blocks, heads, slots, content]`` view of one shared
KV allocation; what lies where differs by backend, by kernel ISA and by the deployment's
``KVCacheLayout``:

- the CPU backend's ``vec`` kernels store K transposed (``[head_dim, block_size]`` per block and
  head), its ``amx`` kernels pack K for AMX tiles, ``vec16`` differs again;
- ``FLASH_ATTN``, ``FLASHINFER`` and ``TRITON_ATTN`` split the content axis into K and V halves
  (``reshape_and_cache_flash``), and the layout's stride order decides whether a block's interior
  is head-major (``LBHNC``) or slot-major (``LBNHC``), and whether blocks of different layers
  interleave (``BLHNC``, ``BLNHC``, ``BHLNC``) or each layer is one region (``L...``).

Rather than hard-coding one reader per combination, the observer *probes* the layout once per
process: it asks the backend's own cache-update method (the one vLLM calls every step) to write
probe keys and values into a one-block scratch cache with the real cache's stride order, each
element carrying its own coordinates in base-64 digits (small integers, exact in bf16/fp16/fp32),
and reads back where each landed. The result, a :class:`BlockLayout`, maps ``(head, slot, dim)`` to
an element offset from a block's first element in the cache's *storage*, plus the block stride, so
reading keys and moving tokens are one gather/scatter on the storage, on the cache's own device,
whatever the layout and for every layer sharing the allocation at once. A layout that does not
round-trip exactly (an FP8 or NVFP4 cache, a write that cannot target the scratch) gives ``None``:
the observer stays off in that process, and says so.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch

DIGIT_BASE = 64  # digits 1..64 are exact in every float KV dtype vLLM uses (bf16 holds integers to 256)

# write(key [tokens, kv_heads, head_dim], value (same), cache, slot_mapping [tokens] long)
CacheWrite = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Element offsets of K and V inside one block, in the cache's storage.

    Attributes:
        key_index: ``[num_kv_heads, block_size, head_dim]`` long, offsets from the block's base
            (``storage_offset + block * block_stride``) in the cache's storage.
        value_index: the same for V.
        block_stride: elements between consecutive blocks of one layer (``kv_cache.stride(0)``).
    """

    key_index: torch.Tensor
    value_index: torch.Tensor
    block_stride: int

    @property
    def block_size(self) -> int:
        return int(self.key_index.shape[1])

    @functools.cached_property
    def key_strides(self) -> tuple[int, int, int, int] | None:
        """``(origin, head, slot, dim)``: K of ``(h, s, d)`` sits at ``origin + h * head + s * slot
        + d * dim`` from a block's base, or None when no such strides exist (a packed layout).

        Every float layout vLLM's CUDA backends write (a strided view of one allocation) and the CPU
        ``vec``/``vec16`` kernels' K are affine, so keys can be read through a strided view with
        tiny index tensors (:func:`gather_key_blocks`). Computed once per layout (one host copy of
        the small ``key_index``).
        """
        return _affine_strides(self.key_index)

    @functools.cached_property
    def value_strides(self) -> tuple[int, int, int, int] | None:
        """:attr:`key_strides` for V."""
        return _affine_strides(self.value_index)

    def to(self, device: torch.device) -> BlockLayout:
        return BlockLayout(self.key_index.to(device), self.value_index.to(device), self.block_stride)


def _affine_strides(index: torch.Tensor) -> tuple[int, int, int, int] | None:
    """``(origin, head, slot, dim)`` with ``index[h, s, d] == origin + h * head + s * slot + d * dim``,
    all non-negative, or None."""
    index = index.cpu()
    origin = int(index[0, 0, 0])
    strides = [int(index.select(axis, 1).flatten()[0]) - origin if index.shape[axis] > 1 else 0 for axis in range(3)]
    if min(strides) < 0:
        return None
    axes = [torch.arange(n) for n in index.shape]
    affine = (origin + axes[0][:, None, None] * strides[0] + axes[1][None, :, None] * strides[1]
              + axes[2][None, None, :] * strides[2])
    return (origin, strides[0], strides[1], strides[2]) if torch.equal(affine, index) else None


def _scratch_like(cache_like: torch.Tensor) -> torch.Tensor:
    """One block shaped like ``cache_like``, zeroed, with its axes in the same physical order."""
    order = sorted(range(cache_like.dim()), key=lambda axis: (-cache_like.stride()[axis], axis))
    physical = torch.zeros([1 if axis == 0 else cache_like.shape[axis] for axis in order],
                           dtype=cache_like.dtype, device=cache_like.device)
    inverse = [order.index(axis) for axis in range(cache_like.dim())]
    return physical.permute(*inverse)


def probe_layout(write: CacheWrite, cache_like: torch.Tensor, num_kv_heads: int, block_size: int,
                 head_dim: int) -> BlockLayout | None:
    """Learn the block layout from the backend's own write (see the module docstring).

    Args:
        write: the backend's cache update, called on a one-block scratch cache with the axes of
            ``cache_like`` in the same physical order.
        cache_like: one layer's real cache, block axis first; its shape, strides, dtype and
            device are used, never its contents.
        num_kv_heads, block_size, head_dim: the cache's geometry.

    Returns:
        The layout, or None when the probe does not round-trip exactly.
    """
    if cache_like.dim() < 2 or cache_like.stride(-1) != 1 or min(cache_like.stride()) < 1:
        return None
    device = cache_like.device
    scratch = _scratch_like(cache_like)
    count = num_kv_heads * block_size * head_dim
    # coordinate of (slot, head, dim), in the [tokens, heads, head_dim] order vLLM writes
    coordinates = torch.arange(count, device=device).view(num_kv_heads, block_size, head_dim).permute(1, 0, 2)
    slots = torch.arange(block_size, dtype=torch.long, device=device)
    indices = []
    for writes_key in (True, False):
        probed = _probe_tensor(write, writes_key, scratch, coordinates, slots)
        if probed is None:
            return None
        positions, found = probed
        index = torch.empty(count, dtype=torch.long, device=device)
        index[found] = _storage_offsets(positions, cache_like)
        indices.append(index.view(num_kv_heads, block_size, head_dim))
    return BlockLayout(key_index=indices[0], value_index=indices[1], block_stride=int(cache_like.stride(0)))


def _probe_tensor(write: CacheWrite, writes_key: bool, scratch: torch.Tensor, coordinates: torch.Tensor,
                  slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where the backend puts each element of K (``writes_key``) or V in ``scratch``.

    Each write stores one base-``DIGIT_BASE`` digit (plus one, so zero means unwritten) of every
    element's coordinate; reading the digits back spells out the coordinate at each written place.

    Returns:
        ``(positions, coordinates)``: the written places in ``scratch``'s logical order ``[count]``, and the
        coordinate found at each ``[count]``; None when the writes do not round-trip exactly.
    """
    count, device = coordinates.numel(), coordinates.device
    num_digits = 1
    while DIGIT_BASE ** num_digits < count:
        num_digits += 1
    found: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    for digit in range(num_digits):
        probe = ((coordinates // DIGIT_BASE ** digit) % DIGIT_BASE + 1).to(scratch.dtype)
        zeros = torch.zeros_like(probe)
        scratch.zero_()
        try:
            write(probe if writes_key else zeros, zeros if writes_key else probe, scratch, slots)
        except Exception:
            return None  # the backend cannot write this layout from a scratch block
        flat = scratch.contiguous().reshape(-1).float()  # logical order
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
    return positions, found


def _storage_offsets(positions: torch.Tensor, cache_like: torch.Tensor) -> torch.Tensor:
    """Logical positions within one block ``[n]`` -> offsets from the block's base in the real storage."""
    inner_shape = torch.tensor(cache_like.shape[1:], device=positions.device)
    inner_strides = torch.tensor(cache_like.stride()[1:], device=positions.device)
    offsets = torch.zeros_like(positions)
    remainder = positions.clone()
    for axis in range(inner_shape.numel() - 1, -1, -1):  # unravel, then dot with the real strides
        offsets += (remainder % inner_shape[axis]) * inner_strides[axis]
        remainder = remainder // inner_shape[axis]
    return offsets


def storage_of(kv_cache: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``kv_cache`` as one 1-D tensor of its dtype (a view: writes land)."""
    elements = kv_cache.untyped_storage().nbytes() // kv_cache.element_size()
    return torch.as_strided(kv_cache, (elements,), (1,), 0)


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
    num_blocks = -(-seq_len // layout.block_size)
    return read_keys_batched(kv_cache, block_row[None, :num_blocks], kv_heads, layout)[0, :, :seq_len]


def read_keys_batched(kv_cache: torch.Tensor, block_rows: torch.Tensor, kv_heads: torch.Tensor,
                      layout: BlockLayout) -> torch.Tensor:
    """Keys of several requests in one gather (no Python loop over requests).

    Args:
        kv_cache: one layer's cache (block axis first).
        block_rows: ``[R, M]`` block ids, each request's first ``M`` blocks (entries past a
            request's own blocks may be anything: they are clamped into range, and callers mask
            by sequence length).
        kv_heads: ``[H]`` long, the KV heads to read.
        layout: from :func:`probe_layout`.

    Returns:
        ``[R, H, M * block_size, head_dim]`` in the cache dtype.
    """
    keys = gather_key_blocks(kv_cache, block_rows, kv_heads, layout)
    num_requests, heads, num_blocks, block_size, head_dim = keys.shape
    return keys.reshape(num_requests, heads, num_blocks * block_size, head_dim)


def gather_key_blocks(kv_cache: torch.Tensor, block_rows: torch.Tensor, kv_heads: torch.Tensor,
                      layout: BlockLayout) -> torch.Tensor:
    """The keys of ``kv_heads`` in ``block_rows``, and nothing else (no V, no other head).

    Where the layout is affine (:attr:`BlockLayout.key_strides`: every float layout vLLM's CUDA
    backends and the CPU ``vec``/``vec16`` kernels write), the storage is viewed as
    ``[blocks, kv_heads, slots, head_dim]`` with the layout's strides and indexed by block and
    head in one op, whose index tensors are ``R * M + H`` longs; otherwise (a packed layout) each
    element is gathered through a ``[R, H, M, block_size, head_dim]`` long offset tensor. Either
    way the cache is only read, on its own device, with no host synchronisation.

    Args:
        kv_cache: one layer's cache (block axis first).
        block_rows: ``[R, M]`` block ids (clamped into range; callers mask by length).
        kv_heads: ``[H]`` long, on any device (moved without waiting).
        layout: from :func:`probe_layout`, on the cache's device.

    Returns:
        ``[R, H, M, block_size, head_dim]`` in the cache dtype. It may be a permuted view of the
        gathered copy (slots before dims in storage, as the ``vec`` kernels store K): callers that
        need contiguous rows copy it while upcasting.
    """
    device = kv_cache.device
    rows = block_rows.to(device, non_blocking=True).long().clamp(0, kv_cache.shape[0] - 1)
    heads = kv_heads.to(device, non_blocking=True).long()
    num_kv_heads, block_size, head_dim = layout.key_index.shape
    storage = storage_of(kv_cache)
    strides = layout.key_strides
    if strides is None:
        index = layout.key_index.to(device, non_blocking=True).index_select(0, heads)  # [H, bs, hd]
        offsets = rows[:, None, :, None, None] * layout.block_stride + index[None, :, None]
        return storage[kv_cache.storage_offset():][offsets]
    origin, head_stride, slot_stride, dim_stride = strides
    base = kv_cache.storage_offset() + origin
    if slot_stride < dim_stride:  # slots are the inner run in storage: gather [.., hd, bs], then permute
        view = torch.as_strided(storage, (kv_cache.shape[0], num_kv_heads, head_dim, block_size),
                                (layout.block_stride, head_stride, dim_stride, slot_stride), base)
        return view[rows[:, None, :], heads[None, :, None]].transpose(-1, -2)
    view = torch.as_strided(storage, (kv_cache.shape[0], num_kv_heads, block_size, head_dim),
                            (layout.block_stride, head_stride, slot_stride, dim_stride), base)
    return view[rows[:, None, :], heads[None, :, None]]  # [R, H, M, bs, hd]


def read_token(kv_cache: torch.Tensor, slot: int, layout: BlockLayout, value: bool = False) -> torch.Tensor:
    """``[num_kv_heads, head_dim]``: the K (or V) of one cache slot (for checks)."""
    block, offset = divmod(slot, layout.block_size)
    index = (layout.value_index if value else layout.key_index)[:, offset]
    base = kv_cache.storage_offset() + block * layout.block_stride
    return storage_of(kv_cache)[base + index]


def _token_offsets(slots: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """K then V storage offsets of ``slots`` from the layer's base: ``[N, 2, H, hd]`` for ``[N]``
    slots (every head), ``[H, N, 2, hd]`` for ``[H, N]`` (head ``h``'s own slots)."""
    block, offset = slots // layout.block_size, slots % layout.block_size
    if slots.dim() == 2:
        heads = torch.arange(slots.shape[0], device=slots.device)[:, None]
        kv = torch.stack([layout.key_index[heads, offset], layout.value_index[heads, offset]], dim=2)  # [H, N, 2, hd]
        return block[:, :, None, None] * layout.block_stride + kv
    kv = torch.stack([layout.key_index[:, offset], layout.value_index[:, offset]])  # [2, H, N, hd]
    return block[:, None, None, None] * layout.block_stride + kv.permute(2, 0, 1, 3)


def move_tokens(kv_cache: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor,
                layout: BlockLayout) -> None:
    """Copy K and V of ``src_slots`` into ``dst_slots`` in one layer's cache (gather, then scatter).

    Args:
        kv_cache: one layer's cache (block axis first).
        src_slots, dst_slots: ``[N]`` slot ids (``block * block_size + offset``); every source is
            read before any destination is written, so the two may overlap.
        layout: from :func:`probe_layout`.
    """
    move_tokens_in_layers([kv_cache], src_slots, dst_slots, layout)


def move_tokens_in_layers(kv_caches: Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor,
                          layout: BlockLayout) -> int:
    """:func:`move_tokens` in every layer: a few indexed copies per shared allocation.

    ``src_slots`` and ``dst_slots`` are ``[N]`` (every KV head moves the same slots) or
    ``[kv_heads, N]`` (head ``h`` moves ``src_slots[h]`` into ``dst_slots[h]``: per-head keep sets).

    vLLM carves every layer's cache out of one allocation, each layer a constant stride from the
    last. Where the layout is affine (:attr:`BlockLayout.key_strides`) and the layers' offsets are
    evenly spaced, K (then V) of every layer is one strided ``[layers, blocks, heads, slots, dim]``
    view, moved by one gather and one scatter indexed by the ``N`` slots alone: the transient is
    the moved tokens themselves. Otherwise every element is addressed through long offsets (8 bytes
    per moved element twice over, on top of the tokens).

    Returns:
        Bytes moved (K and V, every layer).
    """
    if src_slots.numel() == 0 or not kv_caches:
        return 0
    groups: dict[tuple[int, tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
    for cache in kv_caches:
        key = (cache.untyped_storage().data_ptr(), tuple(cache.stride()), cache.dtype)
        groups.setdefault(key, []).append(cache)
    moved = 0
    for caches in groups.values():
        device = caches[0].device
        device_layout = layout if layout.key_index.device == device else layout.to(device)
        src, dst = src_slots.long().to(device), dst_slots.long().to(device)
        offsets = sorted(c.storage_offset() for c in caches)
        steps = {b - a for a, b in zip(offsets, offsets[1:], strict=False)}
        affine = (layout.key_strides, layout.value_strides)
        if affine[0] is not None and affine[1] is not None and len(steps) <= 1:
            moved += _move_strided(caches[0], int(offsets[0]), len(offsets), int(max(steps, default=0)), src, dst,
                                   device_layout, (affine[0], affine[1]))
            continue
        src_offsets = _token_offsets(src, device_layout).reshape(-1)
        dst_offsets = _token_offsets(dst, device_layout).reshape(-1)  # (either shape: the same order for both)
        bases = torch.tensor(offsets, dtype=torch.long, device=device)
        storage = storage_of(caches[0])
        tokens = storage[bases[:, None] + src_offsets[None, :]]
        storage[bases[:, None] + dst_offsets[None, :]] = tokens
        moved += tokens.numel() * tokens.element_size()
    return moved


def _move_strided(cache: torch.Tensor, first_offset: int, num_layers: int, layer_stride: int, src: torch.Tensor,
                  dst: torch.Tensor, layout: BlockLayout,
                  strides: tuple[tuple[int, int, int, int], tuple[int, int, int, int]]) -> int:
    """K and V of ``src`` slots into ``dst`` slots in ``num_layers`` evenly spaced layers: for each
    of K and V, one gather (``[N, L, H, hd]``, or ``[L, H, N, hd]`` for per-head ``[H, N]`` slots)
    then one scatter (sources read before any write)."""
    storage = storage_of(cache)
    num_kv_heads, block_size, head_dim = layout.key_index.shape
    views = [torch.as_strided(storage, (num_layers, cache.shape[0], num_kv_heads, block_size, head_dim),
                              (layer_stride, layout.block_stride, head, slot, dim), first_offset + origin)
             for origin, head, slot, dim in strides]
    src_block, src_offset = src // block_size, src % block_size
    dst_block, dst_offset = dst // block_size, dst % block_size
    # every head the same slots, or head h its own row of them
    heads: slice | torch.Tensor = (slice(None) if src.dim() == 1
                                   else torch.arange(src.shape[0], device=src.device)[:, None])
    gathered = [view[:, src_block, heads, src_offset] for view in views]
    for view, tokens in zip(views, gathered, strict=True):
        view[:, dst_block, heads, dst_offset] = tokens
    return sum(tokens.numel() * tokens.element_size() for tokens in gathered)
