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

**Moving tokens in chunks under a memory cap.** A compaction moves each survivor's K and V, in every
layer, to the front of its request's blocks (:func:`move_tokens_in_layers`). A move gathers the
moved tokens out of the cache, then scatters them back: the gathered copy and its index tensors are
transient device memory outside vLLM's profiled KV budget, about 128 KiB per moved token at an 8B
model's geometry (32 layers, 8 KV heads of 128 dims, bf16). Moving thousands of tokens at once could
take hundreds of MiB the profile never saw, so the moves run in chunks of at most
:func:`plan_move_chunks`' ``tokens_per_chunk`` tokens, each chunk gathered then scattered before the
next is gathered.

Why chunks in order are exact in place: counted in the request's physical token indices (its
blocks in order), survivor ``j`` sits at ``keep[j]``, ascending, and lands at ``j <= keep[j]``
(per KV head, each row of ``[kv_heads, N]`` is such a move; the compactor's filter of columns no
head moves keeps a suffix, since once ``keep[j] > j`` every later survivor moves too). A chunk
writes only indices below the next chunk's first destination, hence below every later source,
and distinct indices are distinct cache slots (a request's blocks are distinct), so no later
chunk's source is overwritten: after any number of whole chunks the rest of the move is still
ahead, intact. That is what lets a failed chunk finish one slot at a time and still leave exactly
the chosen tokens (:func:`move_tokens_chunked`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

MIB = 1 << 20
LONG_BYTES = 8  # index tensors are int64
DIGIT_BASE = 64  # digits 1..64 are exact in every float KV dtype vLLM uses (bf16 holds integers to 256)

# write(key [tokens, kv_heads, head_dim], value (same), cache, slot_mapping [tokens] long)
CacheWrite = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
_Index = TypeVar("_Index", torch.Tensor, int)


# ---- chunking a move (pure: sizes only) ----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MoveChunks:
    """The chunks of one move (see the module docstring).

    Attributes:
        bounds: ``(start, stop)`` column ranges of the moved slots, ascending and contiguous.
        bytes_per_token: transient bytes one moved slot (one column) costs while its chunk moves.
        cap_bytes: the cap the chunks were planned under.
    """

    bounds: tuple[tuple[int, int], ...]
    bytes_per_token: int
    cap_bytes: int

    @property
    def tokens_per_chunk(self) -> int:
        return max((stop - start for start, stop in self.bounds), default=0)

    @property
    def peak_bytes(self) -> int:
        """The largest chunk's transient: at most ``cap_bytes``, unless one token alone exceeds it."""
        return self.tokens_per_chunk * self.bytes_per_token


def plan_move_chunks(num_tokens: int, bytes_per_token: int, cap_bytes: int) -> MoveChunks:
    """Cut ``num_tokens`` moved slots into chunks whose transient stays within ``cap_bytes``.

    The floor is one token per chunk: a token whose transient alone exceeds the cap still moves,
    alone.

    Args:
        num_tokens: moved slots (columns of ``[N]`` or ``[kv_heads, N]`` slot tensors).
        bytes_per_token: from :func:`move_bytes_per_token`.
        cap_bytes: the most transient memory one chunk may hold (``compaction_chunk_mib``).
    """
    if num_tokens < 0 or bytes_per_token < 1 or cap_bytes < 1:
        raise ValueError(f"cannot plan {num_tokens} tokens of {bytes_per_token} bytes under {cap_bytes} bytes")
    per_chunk = max(1, cap_bytes // bytes_per_token)
    bounds = tuple((start, min(start + per_chunk, num_tokens)) for start in range(0, num_tokens, per_chunk))
    return MoveChunks(bounds, bytes_per_token, cap_bytes)


def move_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, element_size: int, *,
                         per_head: bool, strided: bool) -> int:
    """Transient bytes of one moved slot in one cache allocation of ``num_layers`` layers.

    Strided layouts (:class:`TileStrides`: every CUDA backend's, the CPU kernels') gather K and V
    of every layer through strided views: the tokens themselves plus block and offset indices of the source and
    destination (and their device copies), per KV head when heads move their own slots. Packed
    layouts address every element through int64 offsets: per layer, a source and a destination
    offset for each element on top of the element itself, plus the per-token offsets they are
    built from.
    """
    elements = 2 * num_kv_heads * head_dim  # K and V of one token in one layer
    rows = num_kv_heads if per_head else 1
    if strided:
        return num_layers * elements * element_size + 6 * rows * LONG_BYTES
    return elements * (num_layers * (element_size + 2 * LONG_BYTES) + 4 * LONG_BYTES) + 6 * rows * LONG_BYTES


@dataclasses.dataclass(frozen=True)
class MoveOutcome:
    """What one compaction's move did.

    Attributes:
        bytes_moved: K and V bytes copied, every layer.
        chunks: gather-then-scatter chunks run.
        peak_bytes_planned: the largest chunk's planned transient.
        tokens_copied_one_by_one: slots moved by the allocation-free fallback after a chunk's gather
            failed (0 when every chunk gathered).
    """

    bytes_moved: int = 0
    chunks: int = 0
    peak_bytes_planned: int = 0
    tokens_copied_one_by_one: int = 0

    def plus(self, other: MoveOutcome) -> MoveOutcome:
        return MoveOutcome(self.bytes_moved + other.bytes_moved, self.chunks + other.chunks,
                           max(self.peak_bytes_planned, other.peak_bytes_planned),
                           self.tokens_copied_one_by_one + other.tokens_copied_one_by_one)


# ---- the layout ---------------------------------------------------------------------------------
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
    def key_tiles(self) -> TileStrides | None:
        """Where K of ``(h, s, d)`` sits as strides (:class:`TileStrides`), or None when no such
        strides exist (a truly packed layout).

        Every float layout vLLM's CUDA backends write (a strided view of one allocation) and the CPU
        ``vec``/``vec16`` kernels' K are affine; the CPU ``amx`` kernels pack K's dims and V's slots
        in pairs, strided once each is split in two. Either way keys are read, and tokens moved,
        through strided views with tiny index tensors (:func:`gather_key_blocks`,
        :func:`move_tokens_chunked`). Computed once per layout (one host copy of the small
        ``key_index``).
        """
        return _tile_strides(self.key_index)

    @functools.cached_property
    def value_tiles(self) -> TileStrides | None:
        """:attr:`key_tiles` for V."""
        return _tile_strides(self.value_index)

    def to(self, device: torch.device) -> BlockLayout:
        return BlockLayout(self.key_index.to(device), self.value_index.to(device), self.block_stride)


@dataclasses.dataclass(frozen=True)
class TileStrides:
    """K (or V) of ``(head h, slot s, dim d)`` as strides from a block's base: ``origin + h * head``
    plus the slot and the dim, each split in two, ``(s // slot_split) * slot_outer + (s % slot_split)
    * slot_inner`` and the same for ``d``.

    A split of 1 is an affine axis (its inner stride is 0): every CUDA layout and the CPU ``vec``
    kernels. The CPU ``amx`` kernels store K's dims in pairs inside each slot (``dim_split`` 2, the
    VNNI packing AMX tiles read) and V's slots in pairs (``slot_split`` 2).
    """

    origin: int
    head: int
    slot_outer: int
    slot_inner: int
    slot_split: int
    dim_outer: int
    dim_inner: int
    dim_split: int

    @property
    def split(self) -> bool:
        """A slot or dim is split (not affine): reading keys in order takes one more copy."""
        return self.slot_split > 1 or self.dim_split > 1

    def slot_axes(self, block_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(size, stride)`` of the slot's outer then inner part."""
        return (block_size // self.slot_split, self.slot_outer), (self.slot_split, self.slot_inner)

    def dim_axes(self, head_dim: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """``(size, stride)`` of the dim's outer then inner part."""
        return (head_dim // self.dim_split, self.dim_outer), (self.dim_split, self.dim_inner)

    def slot_parts(self, slots: _Index) -> tuple[_Index, _Index]:
        """In-block offsets (a tensor of them, or one int) split into their outer and inner indices."""
        return slots // self.slot_split, slots % self.slot_split

    def offsets(self, num_heads: int, block_size: int, head_dim: int) -> torch.Tensor:
        """``[num_heads, block_size, head_dim]`` offsets these strides give (what the probe must equal)."""
        head, slot, dim = (torch.arange(n) for n in (num_heads, block_size, head_dim))
        slot_offset = (slot // self.slot_split) * self.slot_outer + (slot % self.slot_split) * self.slot_inner
        dim_offset = (dim // self.dim_split) * self.dim_outer + (dim % self.dim_split) * self.dim_inner
        return self.origin + head[:, None, None] * self.head + slot_offset[None, :, None] + dim_offset[None, None, :]


TILE_SPLITS = (1, 2, 4, 8, 16)  # pairs are amx's bf16 packing; fours its int8 one


def _tile_strides(index: torch.Tensor) -> TileStrides | None:
    """The :class:`TileStrides` with the smallest splits that give ``index`` exactly, or None."""
    index = index.cpu()
    num_heads, block_size, head_dim = index.shape
    splits = sorted(((slot_split, dim_split) for slot_split in TILE_SPLITS for dim_split in TILE_SPLITS
                     if block_size % slot_split == 0 and head_dim % dim_split == 0),
                    key=lambda pair: (pair[0] * pair[1], pair))
    origin = int(index[0, 0, 0])

    def step(head: int, slot: int, dim: int, size: int) -> int:
        return int(index[head, slot, dim]) - origin if size > 1 else 0

    for slot_split, dim_split in splits:
        tiles = TileStrides(origin, step(1 % num_heads, 0, 0, num_heads),
                            step(0, slot_split % block_size, 0, block_size // slot_split),
                            step(0, 1 % block_size, 0, slot_split), slot_split,
                            step(0, 0, dim_split % head_dim, head_dim // dim_split),
                            step(0, 0, 1 % head_dim, dim_split), dim_split)
        strides = (tiles.head, tiles.slot_outer, tiles.slot_inner, tiles.dim_outer, tiles.dim_inner)
        if min(strides) >= 0 and torch.equal(tiles.offsets(num_heads, block_size, head_dim), index):
            return tiles
    return None


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

    Where the layout is strided (:attr:`BlockLayout.key_tiles`: every float layout vLLM's CUDA
    backends and the CPU kernels write, ``amx``'s pairs included), each (request, head, block) is
    one row of the storage (:func:`_overlapping_rows`), its axes in storage order, and one
    ``index_select`` copies them all: whole rows, where indexing by block and head at once went
    element by element (3.5x slower on the CPU build for 6 requests x 8 blocks x 4 sampled heads;
    ``amx``'s K through long offsets 1.6x slower, its split axes copied into place after). Only
    the heads asked for are read (duplicates included), so the gather stays the size the
    observation chunks plan. Otherwise (a packed layout) each element is gathered through a
    ``[R, H, M, block_size, head_dim]`` long offset tensor. Either way the cache is only read, on
    its own device, with no host synchronisation.

    Args:
        kv_cache: one layer's cache (block axis first).
        block_rows: ``[R, M]`` block ids (clamped into range; callers mask by length).
        kv_heads: ``[H]`` long, on any device (moved without waiting).
        layout: from :func:`probe_layout`, on the cache's device.

    Returns:
        ``[R, H, M, block_size, head_dim]`` in the cache dtype. It may be a permuted view of the
        gathered copy (slots before dims in storage, as the ``vec`` kernels store K): callers that
        need contiguous rows copy it while upcasting. Split axes (``amx``) are copied into place,
        a word at a time where a dim's inner part is the storage's innermost run.
    """
    device = kv_cache.device
    rows = block_rows.to(device, non_blocking=True).long().clamp(0, kv_cache.shape[0] - 1)
    heads = kv_heads.to(device, non_blocking=True).long()
    num_kv_heads, block_size, head_dim = layout.key_index.shape
    storage = storage_of(kv_cache)
    tiles = layout.key_tiles
    if tiles is None:
        index = layout.key_index.to(device, non_blocking=True).index_select(0, heads)  # [H, bs, hd]
        offsets = rows[:, None, :, None, None] * layout.block_stride + index[None, :, None]
        return storage[kv_cache.storage_offset():][offsets]
    # a row is one (block, head)'s keys, its axes in storage order so that the copy runs along it
    axes = [*tiles.slot_axes(block_size), *tiles.dim_axes(head_dim)]  # slot outer, inner, dim outer, inner
    storage_order = sorted(range(len(axes)), key=lambda axis: -axes[axis][1])
    row = [axes[axis] for axis in storage_order]
    dense = all(stride == math.prod(size for size, _ in row[position + 1:])
                for position, (size, stride) in enumerate(row) if size > 1)
    head_rows, (per_block, per_head) = _overlapping_rows(  # a dense row is copied as one run
        storage, int(kv_cache.storage_offset()) + tiles.origin, (layout.block_stride, tiles.head),
        (kv_cache.shape[0], num_kv_heads), [(block_size * head_dim, 1)] if dense else row)
    index = (rows[:, None, :] * per_block + heads[None, :, None] * per_head).reshape(-1)  # [R * H * M]
    gathered = head_rows.index_select(0, index).view(-1, *(size for size, _ in row))
    permutation = [1 + storage_order.index(axis) for axis in range(len(axes))]
    shape = (rows.shape[0], heads.shape[0], rows.shape[1], block_size, head_dim)
    word = _word_dtype(*row[-1], gathered.element_size()) if storage_order[-1] == len(axes) - 1 else None
    if word is None:
        return gathered.permute(0, *permutation).reshape(shape)
    # the storage's innermost run is a dim's inner part (amx's VNNI pairs), which stays innermost in
    # logical order: reorder whole words, not elements (2.7x faster for amx's bf16 pairs on the CPU
    # build, where the element-wise copy into place was most of an observed step's scoring)
    words = gathered.view(word).squeeze(-1)
    return words.permute(0, *permutation[:-1]).contiguous().view(kv_cache.dtype).reshape(shape)


def _word_dtype(size: int, stride: int, element_bytes: int) -> torch.dtype | None:
    """An integer dtype as wide as a contiguous run of ``size`` elements, or None (no such run)."""
    if stride != 1 or size < 2:
        return None
    return {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size * element_bytes)


def _overlapping_rows(storage: torch.Tensor, base: int, strides: Sequence[int], counts: Sequence[int],
                      row: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, list[int]]:
    """The storage viewed as rows of ``row`` (``(size, stride)`` per row axis), one every gcd of
    ``strides`` elements from ``base``, and each axis's step in rows: index ``i_k`` of axis ``k``
    (``counts[k]`` of them, ``strides[k]`` elements apart) starts row ``sum(i_k * step_k)``. The
    rows overlap, so the view is only read (``index_select`` copies whole rows); the last row is
    every axis's last index, so every row lies inside the cache."""
    unit = math.gcd(*strides)
    steps = [stride // unit for stride in strides]
    num_rows = sum((count - 1) * step for count, step in zip(counts, steps, strict=True)) + 1
    sizes, row_strides = zip(*row, strict=True)
    return torch.as_strided(storage, (num_rows, *sizes), (unit, *row_strides), base), steps


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
    """:func:`move_tokens` in every layer, in one chunk (:func:`move_tokens_chunked` without a cap).

    Returns:
        Bytes moved (K and V, every layer).
    """
    return move_tokens_chunked(kv_caches, src_slots, dst_slots, layout).bytes_moved


def move_tokens_chunked(kv_caches: Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor,
                        layout: BlockLayout, max_chunk_bytes: int | None = None) -> MoveOutcome:
    """Move K and V of ``src_slots`` into ``dst_slots`` in every layer, in chunks of at most
    ``max_chunk_bytes`` transient memory (:func:`plan_move_chunks`).

    ``src_slots`` and ``dst_slots`` are ``[N]`` (every KV head moves the same slots) or
    ``[kv_heads, N]`` (head ``h`` moves ``src_slots[h]`` into ``dst_slots[h]``: per-head keep sets).
    With a cap they must be a compaction's: in each row, column ``j`` moves the request's physical
    token ``keep[j]`` (ascending) into its physical token ``j' <= keep[j]`` (ascending too), so that
    chunks in order are exact in place (the module docstring). The slot ids
    themselves need not be ascending (a request's blocks lie anywhere in the pool); what matters is
    that physical indices map to distinct slots. Without a cap the whole move is one gather then
    one scatter, and any slots may overlap.

    vLLM carves every layer's cache out of one allocation, each layer a constant stride from the
    last. Where the layout is strided (:attr:`BlockLayout.key_tiles`) and the layers' offsets are
    evenly spaced, K (then V) of every layer is one strided ``[layers, blocks, heads, slots, dim]``
    view (slots and dims split in two where ``amx`` packs pairs), moved by one gather and one
    scatter per chunk indexed by the chunk's slots alone: the transient is the moved tokens
    themselves. Otherwise every element is addressed through long offsets (8 bytes per moved
    element twice over, on top of the tokens).

    NOTE: a chunk's gather (the only large allocation) is done before its scatter writes anything.
    When it fails (out of memory), the chunks before it are complete and every later source intact,
    so the rest moves one token at a time by copies between views of the cache, which allocate
    nothing on strided layouts (:attr:`MoveOutcome.tokens_copied_one_by_one` says how many). When a
    scatter fails, its chunk is rewritten column by column from the gathered copy, then the rest
    moves one at a time. Only a fault those copies hit too (a device fault: the CUDA context is
    lost, and vLLM's next kernel fails as well) propagates, with the destinations undefined.
    """
    outcome = MoveOutcome()
    if src_slots.numel() == 0 or not kv_caches:
        return outcome
    for group in _cache_groups(kv_caches, layout):
        outcome = outcome.plus(_move_group(group, src_slots, dst_slots, max_chunk_bytes))
    return outcome


@dataclasses.dataclass(frozen=True)
class _CacheGroup:
    """The layers of one allocation with one stride order and dtype (moved together)."""

    first: torch.Tensor  # the layer at the lowest storage offset
    offsets: tuple[int, ...]  # every layer's storage offset, ascending
    layout: BlockLayout  # on the group's device

    @property
    def layer_stride(self) -> int | None:
        """The constant distance between consecutive layers, or None when they are unevenly spaced."""
        steps = {b - a for a, b in zip(self.offsets, self.offsets[1:], strict=False)}
        return max(steps, default=0) if len(steps) <= 1 else None

    @property
    def strided(self) -> bool:
        """K and V of every layer are strided views (strided layout, evenly spaced layers)."""
        return (self.layout.key_tiles is not None and self.layout.value_tiles is not None
                and self.layer_stride is not None)

    @property
    def tiles(self) -> tuple[TileStrides, TileStrides]:
        """K's and V's strides (a strided group's)."""
        assert self.layout.key_tiles is not None and self.layout.value_tiles is not None
        return self.layout.key_tiles, self.layout.value_tiles


def _cache_groups(kv_caches: Sequence[torch.Tensor], layout: BlockLayout) -> list[_CacheGroup]:
    groups: dict[tuple[int, tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
    for cache in kv_caches:
        key = (cache.untyped_storage().data_ptr(), tuple(cache.stride()), cache.dtype)
        groups.setdefault(key, []).append(cache)
    out = []
    for caches in groups.values():
        device = caches[0].device
        device_layout = layout if layout.key_index.device == device else layout.to(device)
        ordered = sorted(caches, key=lambda c: c.storage_offset())
        out.append(_CacheGroup(ordered[0], tuple(int(c.storage_offset()) for c in ordered), device_layout))
    return out


def _move_group(group: _CacheGroup, src_slots: torch.Tensor, dst_slots: torch.Tensor,
                max_chunk_bytes: int | None) -> MoveOutcome:
    """:func:`move_tokens_chunked` in one cache group: chunk by chunk, each gathered then scattered.

    A chunk whose gather fails has written nothing: it and the rest move one slot at a time. A
    chunk whose scatter fails (it may have written part of its destinations, some of which are
    this chunk's own sources) is rewritten column by column from its gathered copy, which holds
    the true sources; the rest then moves one slot at a time. Either way exactly the chosen
    tokens end up in the destinations.
    """
    device = group.first.device
    src, dst = src_slots.long().to(device), dst_slots.long().to(device)
    num_kv_heads, _, head_dim = group.layout.key_index.shape
    per_token = move_bytes_per_token(len(group.offsets), num_kv_heads, head_dim, group.first.element_size(),
                                     per_head=src.dim() == 2, strided=group.strided)
    columns = int(src.shape[-1])
    chunks = plan_move_chunks(columns, per_token, max_chunk_bytes or columns * per_token or 1)
    moved = 0
    for index, (start, stop) in enumerate(chunks.bounds):
        chunk_src, chunk_dst = src[..., start:stop], dst[..., start:stop]
        try:
            gathered = _gather(group, chunk_src)
        except Exception:  # nothing of this chunk was written: finish without allocating
            moved += _copy_one_by_one(group, src[..., start:], dst[..., start:])
            return MoveOutcome(moved, index, chunks.peak_bytes, columns - start)
        try:
            _scatter(group, chunk_dst, gathered)
        except Exception:  # rewrite this chunk from its copy, then finish without allocating
            moved += _scatter_one_by_one(group, chunk_dst, gathered)
            moved += _copy_one_by_one(group, src[..., stop:], dst[..., stop:])
            return MoveOutcome(moved, index, chunks.peak_bytes, columns - start)
        moved += sum(tokens.numel() * tokens.element_size() for tokens in gathered)
    return MoveOutcome(moved, len(chunks.bounds), chunks.peak_bytes)


def move_tokens_one_by_one(kv_caches: Sequence[torch.Tensor], src_slots: torch.Tensor, dst_slots: torch.Tensor,
                           layout: BlockLayout) -> MoveOutcome:
    """:func:`move_tokens_chunked`'s allocation-free path alone: slot by slot, in order, through
    views of the cache (a few index longs per slot on packed layouts). For a compaction's slots
    (see :func:`move_tokens_chunked`), where a gathered copy must not be risked: the compactor's
    fallback after a failed compaction.
    """
    outcome = MoveOutcome()
    if src_slots.numel() == 0 or not kv_caches:
        return outcome
    for group in _cache_groups(kv_caches, layout):
        src, dst = (slots.long().to(group.first.device) for slots in (src_slots, dst_slots))
        outcome = outcome.plus(MoveOutcome(_copy_one_by_one(group, src, dst),
                                           tokens_copied_one_by_one=int(src.shape[-1])))
    return outcome


def _strided_view(group: _CacheGroup, tiles: TileStrides) -> torch.Tensor:
    """K or V (``tiles``) of every layer of the group as a ``[layers, blocks, kv_heads, slot outer,
    slot inner, dim outer, dim inner]`` view."""
    layout, cache = group.layout, group.first
    num_kv_heads, block_size, head_dim = layout.key_index.shape
    (slot_outer, slot_inner), (dim_outer, dim_inner) = tiles.slot_axes(block_size), tiles.dim_axes(head_dim)
    shape = (len(group.offsets), cache.shape[0], num_kv_heads, slot_outer[0], slot_inner[0], dim_outer[0],
             dim_inner[0])
    strides = (group.layer_stride or 0, layout.block_stride, tiles.head, slot_outer[1], slot_inner[1], dim_outer[1],
               dim_inner[1])
    return torch.as_strided(storage_of(cache), shape, strides, group.offsets[0] + tiles.origin)


def _slot_index(slots: torch.Tensor, tiles: TileStrides,
                block_size: int) -> tuple[torch.Tensor, slice | torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(block, heads, slot outer, slot inner)`` indices of ``slots`` into a strided view: every head
    the same slots (``[N]``), or head ``h`` its own row of them (``[H, N]``)."""
    heads: slice | torch.Tensor = (slice(None) if slots.dim() == 1
                                   else torch.arange(slots.shape[0], device=slots.device)[:, None])
    return (slots // block_size, heads, *tiles.slot_parts(slots % block_size))


def _gather(group: _CacheGroup, src: torch.Tensor) -> list[torch.Tensor]:
    """Copies of K and V of ``src`` in every layer (``[N, L, H, hd]`` for ``[N]`` slots or
    ``[L, H, N, hd]`` for ``[H, N]``, each on the strided path; ``[L, elements]`` on the offsets
    path, elements in :func:`_token_offsets`' order). Reads only."""
    layout = group.layout
    if group.strided:
        return [_gather_token_rows(group, src, tiles) for tiles in group.tiles]
    bases = torch.tensor(group.offsets, dtype=torch.long, device=src.device)
    return [storage_of(group.first)[bases[:, None] + _token_offsets(src, layout).reshape(-1)[None, :]]]


def _gather_token_rows(group: _CacheGroup, src: torch.Tensor, tiles: TileStrides) -> torch.Tensor:
    """K or V of ``src`` in every layer of a strided group, as :func:`_gather` returns them, read as
    whole ``head_dim`` rows (:func:`_overlapping_rows`) with one ``index_select`` over every
    (layer, head, slot), where indexing the strided view by block, head and slot at once goes
    element by element (3.6x slower for 200 tokens x 30 layers on the CPU build)."""
    layout, cache = group.layout, group.first
    num_kv_heads, block_size, head_dim = layout.key_index.shape
    strides, counts = _token_starts(group, tiles)
    rows, steps = _overlapping_rows(storage_of(cache), group.offsets[0] + tiles.origin, strides, counts,
                                    tiles.dim_axes(head_dim))
    index = _token_row_index(src, tiles, block_size, len(group.offsets), num_kv_heads, steps)
    return rows.index_select(0, index.reshape(-1)).view(*index.shape, head_dim)


def _token_starts(group: _CacheGroup, tiles: TileStrides) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Strides and counts of the axes a token's row starts along: layer, block, head, slot outer, slot inner."""
    slot_outer, slot_inner = tiles.slot_axes(group.layout.block_size)
    strides = (group.layer_stride or 0, group.layout.block_stride, tiles.head, slot_outer[1], slot_inner[1])
    counts = (len(group.offsets), group.first.shape[0], group.layout.key_index.shape[0], slot_outer[0], slot_inner[0])
    return strides, counts


def _token_row_index(slots: torch.Tensor, tiles: TileStrides, block_size: int, num_layers: int, num_kv_heads: int,
                     steps: Sequence[int]) -> torch.Tensor:
    """Row of every (layer, head, slot) of ``slots`` in a row view whose rows start ``steps`` apart
    along :func:`_token_starts`' axes: ``[N, L, H]`` for ``[N]`` slots, ``[L, H, N]`` for ``[H, N]``."""
    per_layer, per_block, per_head, per_outer, per_inner = steps
    outer, inner = tiles.slot_parts(slots % block_size)
    token = (slots // block_size) * per_block + outer * per_outer + inner * per_inner
    layer = torch.arange(num_layers, device=slots.device) * per_layer
    head = torch.arange(num_kv_heads, device=slots.device) * per_head
    if slots.dim() == 1:  # [N] slots, every head
        return token[:, None, None] + layer[None, :, None] + head[None, None, :]
    return layer[:, None, None] + head[None, :, None] + token[None]  # [H, N]: head h its own row


def _token_rows_to_write(group: _CacheGroup, tiles: TileStrides) -> tuple[torch.Tensor, list[int]] | None:
    """The storage as ``head_dim`` rows that do not overlap, from K's (or V's) origin, with each
    start axis's step in rows; None unless a token's dims are one contiguous run and every
    (layer, block, head, slot) starts a whole row (the CUDA backends' K and V, the CPU ``vec``
    kernels' V; not ``vec``'s K nor ``amx``'s pairs)."""
    head_dim = group.layout.key_index.shape[2]
    strides, counts = _token_starts(group, tiles)
    if tiles.dim_split != 1 or tiles.dim_outer != 1 or any(
            stride % head_dim for stride, count in zip(strides, counts, strict=True) if count > 1):
        return None
    steps = [stride // head_dim if count > 1 else 0 for stride, count in zip(strides, counts, strict=True)]
    num_rows = sum((count - 1) * step for count, step in zip(counts, steps, strict=True)) + 1
    storage = storage_of(group.first)
    return torch.as_strided(storage, (num_rows, head_dim), (head_dim, 1), group.offsets[0] + tiles.origin), steps


def _scatter(group: _CacheGroup, dst: torch.Tensor, gathered: list[torch.Tensor]) -> None:
    """Write what :func:`_gather` read into ``dst`` (its indices are the only new tensors).

    Where a token's dims are a contiguous row (:func:`_token_rows_to_write`) each (layer, head,
    slot) is written as one row by ``index_copy_``; otherwise through the strided view, element by
    element."""
    layout = group.layout
    if group.strided:
        num_kv_heads, block_size, head_dim = layout.key_index.shape
        for tiles, tokens in zip(group.tiles, gathered, strict=True):
            rows = _token_rows_to_write(group, tiles)
            if rows is not None:
                index = _token_row_index(dst, tiles, block_size, len(group.offsets), num_kv_heads, rows[1])
                rows[0].index_copy_(0, index.reshape(-1), tokens.reshape(-1, head_dim))
                continue
            view = _strided_view(group, tiles)
            split_dims = tokens.view(*tokens.shape[:-1], *view.shape[-2:])  # [.., dim outer, dim inner]
            view[(slice(None), *_slot_index(dst, tiles, block_size))] = split_dims
        return
    bases = torch.tensor(group.offsets, dtype=torch.long, device=dst.device)
    storage_of(group.first)[bases[:, None] + _token_offsets(dst, layout).reshape(-1)[None, :]] = gathered[0]


def _copy_one_by_one(group: _CacheGroup, src: torch.Tensor, dst: torch.Tensor) -> int:
    """Move slot by slot, in order, through views of the cache (no gathered copy): on the strided
    path each copy is ``view[:, block, head, offset]``, a basic view, so nothing is allocated.

    Returns:
        Bytes moved.
    """
    if src.shape[-1] == 0:
        return 0
    rows_src, rows_dst = src.reshape(-1, src.shape[-1]).tolist(), dst.reshape(-1, dst.shape[-1]).tolist()
    block_size, moved = group.layout.block_size, 0
    views = [(_strided_view(group, tiles), tiles) for tiles in group.tiles] if group.strided else []
    for column in range(src.shape[-1]):
        for row, (row_src, row_dst) in enumerate(zip(rows_src, rows_dst, strict=True)):
            source, target = row_src[column], row_dst[column]
            if source == target:
                continue
            if not views:
                moved += _copy_slot_by_offsets(group, source, target, None if src.dim() == 1 else row)
                continue
            head: slice | int = slice(None) if src.dim() == 1 else row
            for view, tiles in views:
                into = view[(slice(None), target // block_size, head, *tiles.slot_parts(target % block_size))]
                into.copy_(view[(slice(None), source // block_size, head, *tiles.slot_parts(source % block_size))])
                moved += into.numel() * into.element_size()
    return moved


def _copy_slot_by_offsets(group: _CacheGroup, source: int, target: int, head: int | None) -> int:
    """One slot (one head's, or every head's) on the offsets path: its few offsets are allocated."""
    layout, device = group.layout, group.first.device
    bases = torch.tensor(group.offsets, dtype=torch.long, device=device)
    offsets = [_token_offsets(torch.tensor([slot], device=device), layout)[0] for slot in (source, target)]
    if head is not None:
        offsets = [o[:, head] for o in offsets]
    storage = storage_of(group.first)
    tokens = storage[bases[:, None] + offsets[0].reshape(-1)[None, :]]
    storage[bases[:, None] + offsets[1].reshape(-1)[None, :]] = tokens
    return tokens.numel() * tokens.element_size()


def _scatter_one_by_one(group: _CacheGroup, dst: torch.Tensor, gathered: list[torch.Tensor]) -> int:
    """Write a chunk's gathered copy (:func:`_gather`) into ``dst`` one column at a time (each
    column's indices are a few longs), after its whole scatter failed.

    Returns:
        Bytes moved.
    """
    moved = 0
    for column in range(int(dst.shape[-1])):
        tokens = _gathered_column(group, gathered, column, per_head=dst.dim() == 2)
        _scatter(group, dst[..., column:column + 1], tokens)
        moved += sum(t.numel() * t.element_size() for t in tokens)
    return moved


def _gathered_column(group: _CacheGroup, gathered: list[torch.Tensor], column: int, *,
                     per_head: bool) -> list[torch.Tensor]:
    """Column ``column`` of :func:`_gather`'s copy, shaped as :func:`_gather` gives one column."""
    if group.strided:  # [N, L, H, hd] per request, [L, H, N, hd] per KV head
        return [t[:, :, column:column + 1] if per_head else t[column:column + 1] for t in gathered]
    num_kv_heads, _, head_dim = group.layout.key_index.shape
    tokens = gathered[0]
    if per_head:  # elements in (H, N, 2, hd) order
        by_head = tokens.reshape(tokens.shape[0], num_kv_heads, -1, 2 * head_dim)
        return [by_head[:, :, column].reshape(tokens.shape[0], -1)]
    width = 2 * num_kv_heads * head_dim  # elements in (N, 2, H, hd) order
    return [tokens[:, column * width:(column + 1) * width]]

