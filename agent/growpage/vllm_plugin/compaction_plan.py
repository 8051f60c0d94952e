"""How a compaction's token moves are cut into chunks under a memory cap, without torch.

A compaction moves each survivor's K and V, in every layer, to the front of its request's blocks
(:func:`~growpage.vllm_plugin.keys.move_tokens_in_layers`). A move gathers the moved tokens out of
the cache, then scatters them back: the gathered copy and its index tensors are transient device
memory outside vLLM's profiled KV budget, about 128 KiB per moved token at an 8B model's geometry
(32 layers, 8 KV heads of 128 dims, bf16). Moving thousands of tokens at once could take hundreds
of MiB the profile never saw, so the moves run in chunks of at most :func:`plan_move_chunks`'
``tokens_per_chunk`` tokens, each chunk gathered then scattered before the next is gathered.

Why chunks in order are exact in place: counted in the request's physical token indices (its
blocks in order), survivor ``j`` sits at ``keep[j]``, ascending, and lands at ``j <= keep[j]``
(per KV head, each row of ``[kv_heads, N]`` is such a move; the compactor's filter of columns no
head moves keeps a suffix, since once ``keep[j] > j`` every later survivor moves too). A chunk
writes only indices below the next chunk's first destination, hence below every later source,
and distinct indices are distinct cache slots (a request's blocks are distinct), so no later
chunk's source is overwritten: after any number of whole chunks the rest of the move is still
ahead, intact. That is what lets a failed chunk finish one slot at a time and still leave exactly
the chosen tokens (:func:`~growpage.vllm_plugin.keys.move_tokens_chunked`).
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20
LONG_BYTES = 8  # index tensors are int64


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
                         per_head: bool, affine: bool) -> int:
    """Transient bytes of one moved slot in one cache allocation of ``num_layers`` layers.

    Affine layouts (every CUDA backend's, the CPU ``vec`` kernels') gather K and V of every layer
    through strided views: the tokens themselves plus block and offset indices of the source and
    destination (and their device copies), per KV head when heads move their own slots. Packed
    layouts address every element through int64 offsets: per layer, a source and a destination
    offset for each element on top of the element itself, plus the per-token offsets they are
    built from.
    """
    elements = 2 * num_kv_heads * head_dim  # K and V of one token in one layer
    rows = num_kv_heads if per_head else 1
    if affine:
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
