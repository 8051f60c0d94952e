"""The newest queries' attention over paged keys, in chunks of bounded transient memory.

At the end of a step the observer scores every observed layer at once: the newest query of each
observed request (or, at the step that ends a prompt, its last few queries: an observation window),
for the sampled heads, against every key of that request in the paged cache. Each query of a
window is one more row of its request's softmax: a query ``o`` positions before the newest sees only
the keys before it (causal), and histograms, entropies and token mass are means over heads and
window queries alike. A request with fewer queries than the step's window repeats its newest one
(offset 0): identical rows leave every mean as it was, so a step may mix prompts that end (a
window) with decodes (one query).
Done naively (every request, whole blocks, upcast at once) that is ``[layers, requests, heads,
tokens, head_dim]`` float32 of transient memory, gigabytes at serving scale, outside the KV
budget vLLM profiled. Here:

- only the sampled heads' keys are read (:func:`~growpage.vllm_plugin.keys.gather_key_blocks`:
  no V, no other head);
- requests are scored in chunks, sorted by length, and each chunk's keys are gathered a few
  blocks at a time, so the transient memory stays under ``cap_bytes`` (:func:`plan_chunks` sizes
  both from the host-side lengths). A chunk pads every request to its longest, so the chunks are
  also cut where padding would cost more than scoring one more chunk (:func:`chunk_cost_keys`): a
  step that ends a 1,000-token prompt beside a dozen 200-token decodes scores two chunks, not
  twelve requests padded to 1,000 keys. Chunking changes nothing in the result: each request's
  softmax, histogram and entropy are its own;
- nothing waits on the device: the per-step indices travel in one non-blocking copy and the loops
  run on host integers (no ``.item()``, ``.tolist()`` or ``.cpu()`` per chunk or per layer).

Pure torch (this module, :mod:`~growpage.vllm_plugin.keys` and :mod:`growpage.core.devices` import
nothing else from GrowPage or vLLM), so the torch-only GPU checks run it as the observer does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from growpage.core.devices import to_device
from growpage.vllm_plugin import keys as kv_keys

DEFAULT_CAP_BYTES = 256 * 2 ** 20
FLOAT_BYTES = 4
OFFSET_BYTES = 8  # a long offset per key element when the layout is packed (no strided view)
PROB_COPIES = 3  # probabilities alive at once: the softmax, then the summary's log and product
# What one more chunk costs, in keys scored by one query head: its per-layer gathers, softmax and
# summaries are a few dozen tensor operations in each layer, where a key costs each layer one dot
# product per sampled head and window query. On the CPU build (2 cores, the packaged model's
# geometry, 4 sampled heads, one query each, a mixed trace of 600-1,100-token prompts among
# decodes) 256-1,024 keys a chunk scored fastest, 512 best: 173 ms of scoring over the trace's 25
# observed steps against 420 ms for one padded chunk (docs/BENCHMARKS.md). A GPU's launches cost far
# more than its keys, so there a chunk is cut only where it would pad a lot (not measured on a GPU).
CHUNK_COST_HEAD_KEYS = {"cpu": 512 * 4}
GPU_CHUNK_COST_HEAD_KEYS = 16384 * 4

# summarize(probs [N, H, K], key_positions [N, K] (-1 past a request), lengths [N]) ->
# (bin_mass [N, bins], entropy [N]); growpage.core.summaries.summarize_attention with the bins bound
Summarize = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class ObservedLayer:
    """One observed layer of a step: its cache view and its requests' newest sampled queries.

    Attributes:
        cache: one layer's ``[blocks, kv_heads, slots, content]`` view of the paged cache.
        query: ``[R, H, head_dim]`` the newest query of each observed request, sampled heads; or
            ``[R, H, W, head_dim]``, an observation window of ``W`` queries per request, the newest
            last (see ``query_offsets`` in :func:`score_step`).
        scale: the layer's softmax scale.
        kv_heads: ``[H]`` long, on the host: the KV head each sampled query head reads.
    """

    cache: torch.Tensor
    query: torch.Tensor
    scale: float
    kv_heads: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Requests scored together.

    Attributes:
        rows: positions in the step's rows (host ints).
        length: the longest of them (keys scored per request, masked past each one's own length).
        blocks_per_gather: blocks of keys gathered (and upcast) at a time.
    """

    rows: tuple[int, ...]
    length: int
    blocks_per_gather: int


@dataclasses.dataclass(frozen=True)
class StepScores:
    """What one step's observation yields.

    Attributes:
        entropy: ``[L, R]`` head-mean attention entropy per layer and request (None without a
            ``summarize``).
        bin_mass: ``[L, R, bins]`` head-mean attention mass per position bin (None likewise).
        token_mass: ``[R, max_len]`` attention per key, mean over heads, summed over layers (the
            compaction scores; 0 past each request), when asked for; ``[R, kv_heads, max_len]``
            with ``mass_by_kv_head`` (each KV head's mean over the sampled query heads that read it).
        planned_bytes: the largest transient a chunk was planned to hold (:func:`chunk_bytes`).
        chunks: how many chunks of requests were scored.
    """

    entropy: torch.Tensor | None
    bin_mass: torch.Tensor | None
    token_mass: torch.Tensor | None
    planned_bytes: int
    chunks: int


def chunk_cost_keys(device: torch.device, query_heads: int) -> int:
    """What one more chunk costs on ``device``, in keys scored by ``query_heads`` query heads
    (sampled heads times window queries; :data:`CHUNK_COST_HEAD_KEYS`)."""
    return max(1, CHUNK_COST_HEAD_KEYS.get(device.type, GPU_CHUNK_COST_HEAD_KEYS) // max(1, query_heads))


def key_element_bytes(cache_dtype: torch.dtype, layout: kv_keys.BlockLayout) -> int:
    """Transient bytes per gathered key element: the gathered copy, its float32 upcast, and a long
    offset where the layout has no strided view (or a second copy where it splits an axis, as
    ``amx`` does: the rows are copied into place)."""
    element = torch.empty((), dtype=cache_dtype).element_size()
    tiles = layout.key_tiles
    extra = OFFSET_BYTES if tiles is None else element if tiles.split else 0
    return element + FLOAT_BYTES + extra


def chunk_bytes(rows: int, length: int, blocks_per_gather: int, *, num_layers: int, num_heads: int,
                head_dim: int, block_size: int, element_bytes: int) -> int:
    """Peak transient bytes of scoring one chunk (what :func:`score_step` holds at once).

    ``S = L * rows * H * length * 4`` is one float32 copy of the chunk's logits/probabilities.
    While keys are gathered, the logits (``S``) and one gather (``rows * H * blocks * block_size``
    keys of ``element_bytes`` each, plus its float32 product with the queries) are alive; after,
    the probabilities and the summary's two temporaries (``3 S``).
    """
    scores = num_layers * rows * num_heads * length * FLOAT_BYTES
    keys = rows * num_heads * blocks_per_gather * block_size * (head_dim * element_bytes + FLOAT_BYTES)
    return max(scores + keys, PROB_COPIES * scores)


def plan_chunks(lengths: Sequence[int], *, num_layers: int, num_heads: int, head_dim: int, block_size: int,
                element_bytes: int, cap_bytes: int, chunk_cost: int) -> list[Chunk]:
    """Split a step's requests into chunks whose :func:`chunk_bytes` stay under ``cap_bytes``, at
    the least cost: the keys scored (each request padded to its chunk's longest) plus
    ``chunk_cost`` per chunk.

    Requests are taken shortest first and cut into runs of neighbours (a shortest path over the
    cut points, at most ``R^2 / 2`` host steps for ``R`` requests: 0.27 ms at 64). A chunk holds
    requests while ``3 S`` fits in the cap; its gathers take as many blocks as fit in what ``S``
    leaves. One request and one block are the floor: a single request whose own scores exceed the
    cap is scored alone, over the cap (its keys still a block at a time).

    Args:
        lengths: ``[R]`` keys per request (host ints, >= 1).
        num_layers, num_heads, head_dim, block_size: the step's geometry (``num_heads`` sampled).
        element_bytes: from :func:`key_element_bytes`.
        cap_bytes: the transient budget of one chunk.
        chunk_cost: what one more chunk costs, in keys scored (:func:`chunk_cost_keys`); 0 gives
            each length a chunk of its own, a cost above any padding one chunk as large as the cap
            allows.

    Returns:
        Chunks covering every row once, in scoring order.
    """
    order = sorted(range(len(lengths)), key=lambda row: lengths[row])
    per_key = num_layers * num_heads * FLOAT_BYTES
    # cheapest[end]: the least cost of scoring the shortest ``end`` requests; start[end]: where the
    # last chunk of that plan starts
    cheapest, start = [0] + [-1] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        length = lengths[order[end - 1]]
        for first in range(end - 1, -1, -1):
            if end - first > 1 and PROB_COPIES * per_key * (end - first) * length > cap_bytes:
                break  # a longer run only grows: nothing earlier fits either
            cost = cheapest[first] + chunk_cost + (end - first) * length
            if cheapest[end] < 0 or cost <= cheapest[end]:  # a tie: the longer last chunk
                cheapest[end], start[end] = cost, first
    bounds, end = [], len(order)
    while end > 0:
        bounds.append((start[end], end))
        end = start[end]
    chunks: list[Chunk] = []
    for first, end in reversed(bounds):
        rows, length = tuple(order[first:end]), lengths[order[end - 1]]
        left = cap_bytes - per_key * len(rows) * length
        per_block = len(rows) * num_heads * block_size * (head_dim * element_bytes + FLOAT_BYTES)
        blocks = max(1, min(-(-length // block_size), left // per_block))
        chunks.append(Chunk(rows, length, blocks))
    return chunks


def score_step(layers: Sequence[ObservedLayer], block_rows: torch.Tensor, lengths: Sequence[int],
               layout: kv_keys.BlockLayout, *, cap_bytes: int = DEFAULT_CAP_BYTES, chunk_cost: int | None = None,
               summarize: Summarize | None = None, token_mass: bool = False, mass_by_kv_head: bool = False,
               query_offsets: Sequence[Sequence[int]] | None = None, summarize_newest: bool = False) -> StepScores:
    """Attention of each layer's newest queries (or windows: the module docstring) over its requests' keys.

    Args:
        layers: the step's observed layers (same requests and sampled head count in each).
        block_rows: ``[R, M]`` block-table rows on the cache's device, ``M * block_size`` >= the
            longest length (entries past a request's own blocks are never scored).
        lengths: ``[R]`` keys per request in the cache, this step's included (host ints).
        layout: from :func:`~growpage.vllm_plugin.keys.probe_layout`, on the cache's device.
        cap_bytes, chunk_cost: transient budget per chunk, and the keys one more chunk costs
            (:func:`plan_chunks`; None: :func:`chunk_cost_keys` for the step).
        summarize: turns probabilities into histograms and entropies (see :data:`Summarize`).
        token_mass: also return per-key attention summed over layers (compaction scores).
        mass_by_kv_head: that attention per KV head of the cache (per-head keep sets); a KV head
            no sampled query head reads gets the mean over all sampled heads.
        query_offsets: ``[R][W]`` with a window: how many positions each query lies before its
            request's newest (0 for the newest and for repeats; host ints). None: all 0.
        summarize_newest: histograms and entropies from each request's newest query alone (the
            window's last; the window feeds the token mass only: :mod:`~growpage.vllm_plugin.skipped_queries`).

    Returns:
        :class:`StepScores`, everything on the cache's device.
    """
    first, device = layers[0], layers[0].cache.device
    num_layers, num_rows = len(layers), len(lengths)
    window = int(first.query.shape[2]) if first.query.dim() == 4 else 1
    num_heads, head_dim = int(first.query.shape[1]), int(first.query.shape[-1])
    # the window's rows count as heads for the scores' memory (keys are gathered once per head)
    geometry = dict(num_layers=num_layers, num_heads=num_heads * window, head_dim=head_dim,
                    block_size=layout.block_size, element_bytes=key_element_bytes(first.cache.dtype, layout))
    chunks = plan_chunks(lengths, cap_bytes=cap_bytes, **geometry, chunk_cost=chunk_cost_keys(
        device, num_heads * window) if chunk_cost is None else chunk_cost)
    order = [row for chunk in chunks for row in chunk.rows]
    order_t, lengths_t, heads_t, offsets_t = _step_indices(layers, order, lengths, query_offsets, window, device)
    queries = torch.stack([layer.query.view(num_rows, num_heads, window, head_dim) for layer in layers])
    queries = queries.to(device).float()  # [L, R, H, W, hd]
    entropy = torch.zeros(num_layers, num_rows, device=device) if summarize else None
    bin_mass: torch.Tensor | None = None
    mass, head_weights = (_token_mass_buffers(heads_t, int(first.cache.shape[1]), num_rows, max(lengths),
                                              mass_by_kv_head) if token_mass else (None, None))
    start = 0
    for chunk in chunks:
        rows = order_t[start:start + len(chunk.rows)]
        chunk_lengths = lengths_t[start:start + len(chunk.rows)]
        visible = chunk_lengths[:, None] - offsets_t[start:start + len(chunk.rows)]  # [r, W] keys each query sees
        start += len(chunk.rows)
        probs = _chunk_probabilities(layers, queries.index_select(1, rows), heads_t, block_rows.index_select(0, rows),
                                     visible, chunk, layout)
        if mass is not None:
            mass[..., :chunk.length].index_copy_(0, rows, _chunk_token_mass(probs, num_heads, window, head_weights))
        if summarize is not None and entropy is not None:
            summarized = probs.unflatten(2, (num_heads, window))[:, :, :, -1] if summarize_newest else probs
            bin_mass = _write_summaries(summarize(*_summary_inputs(summarized, chunk_lengths, chunk.length)),
                                        rows, entropy, bin_mass)
        del probs
    planned = max(chunk_bytes(len(c.rows), c.length, c.blocks_per_gather, **geometry) for c in chunks)
    return StepScores(entropy, bin_mass, mass, planned, len(chunks))


def _step_indices(layers: Sequence[ObservedLayer], order: list[int], lengths: Sequence[int],
                  query_offsets: Sequence[Sequence[int]] | None, window: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's host indices in one copy to the device: rows in scoring order, their lengths,
    each layer's KV head per sampled head (``[L, H]``) and the window offsets (``[R, W]``, scoring order)."""
    num_rows, num_layers = len(order), len(layers)
    heads = [layer.kv_heads.tolist() for layer in layers]  # host tensors: no device wait
    offsets = [list(query_offsets[row]) if query_offsets is not None else [0] * window for row in order]
    if any(len(row) != window for row in offsets):
        raise ValueError(f"query_offsets must hold {window} offsets per request, one per window query")
    packed = to_device(order + [lengths[row] for row in order] + [h for layer in heads for h in layer]
                       + [o for row in offsets for o in row], device)
    heads_end = 2 * num_rows + sum(len(layer) for layer in heads)
    return (packed[:num_rows], packed[num_rows:2 * num_rows],
            packed[2 * num_rows:heads_end].view(num_layers, -1), packed[heads_end:].view(num_rows, window))


def _summary_inputs(probs: torch.Tensor, lengths: torch.Tensor,
                    length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``summarize`` reads of a chunk's ``[L, r, H', length]`` probabilities, every layer at once."""
    num_layers, num_rows = probs.shape[:2]
    positions = torch.arange(length, device=probs.device).expand(num_rows, length)
    key_positions = positions.masked_fill(positions >= lengths[:, None], -1)
    return probs.flatten(0, 1), key_positions.repeat(num_layers, 1), lengths.repeat(num_layers)


def _write_summaries(summaries: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor, entropy: torch.Tensor,
                     bin_mass: torch.Tensor | None) -> torch.Tensor:
    """A chunk's ``(bins [L * r, B], entropy [L * r])`` into the step's ``[L, R]`` buffers at
    ``rows``; returns the bin buffer (made at the first chunk, once the bin count is known)."""
    chunk_bins, chunk_entropy = summaries
    num_layers, num_rows = entropy.shape
    if bin_mass is None:
        bin_mass = torch.zeros(num_layers, num_rows, chunk_bins.shape[-1], device=entropy.device)
    bin_mass.index_copy_(1, rows, chunk_bins.view(num_layers, len(rows), -1))
    entropy.index_copy_(1, rows, chunk_entropy.view(num_layers, len(rows)))
    return bin_mass


def _token_mass_buffers(heads: torch.Tensor, num_kv_heads: int, num_rows: int, length: int,
                        by_kv_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step's zeroed token mass (``[R, length]``, or ``[R, G, length]`` by KV head) and, by KV
    head, the sampled heads' weights (:func:`_kv_head_weights`)."""
    if not by_kv_head:
        return torch.zeros(num_rows, length, device=heads.device), None
    return (torch.zeros(num_rows, num_kv_heads, length, device=heads.device),
            _kv_head_weights(heads, num_kv_heads))


def _chunk_token_mass(probs: torch.Tensor, num_heads: int, window: int, weights: torch.Tensor | None) -> torch.Tensor:
    """A chunk's attention per key summed over layers: the mean over heads and window queries
    (``[r, K]``), or per KV head (``[r, G, K]``) with ``weights``."""
    if weights is None:
        return probs.mean(2).sum(0)
    return _mass_by_kv_head(probs, num_heads, window, weights)


def _kv_head_weights(heads: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[L, H, G + 1]``: per layer, each sampled head's weight in its KV head's mean (column ``g``)
    and in the mean over all sampled heads (the last column, for KV heads no sampled head reads)."""
    one_hot = torch.nn.functional.one_hot(heads, num_kv_heads).float()  # [L, H, G]
    per_kv_head = one_hot / one_hot.sum(1, keepdim=True).clamp(min=1.0)
    everyone = torch.full_like(one_hot[..., :1], 1.0 / heads.shape[1])
    return torch.cat([per_kv_head, everyone], dim=-1)


def _mass_by_kv_head(probs: torch.Tensor, num_heads: int, window: int, weights: torch.Tensor) -> torch.Tensor:
    """``[r, G, K]`` attention per KV head, summed over layers, from ``probs`` ``[L, r, H * W, K]``."""
    per_head = probs.unflatten(2, (num_heads, window)).mean(3)  # [L, r, H, K]
    mass = torch.einsum("lrhk,lhg->rgk", per_head, weights)  # [r, G + 1, K]
    read = weights[..., :-1].sum(1).amax(0) > 0  # [G]: some sampled head reads this KV head
    return torch.where(read[None, :, None], mass[:, :-1], mass[:, -1:])


def _block_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``[r, H, W, m * bs]`` dot products of ``query`` (``[r, H, W, hd]``) with gathered ``keys``
    (``[r, H, m, bs, hd]``), in the orientation the keys were gathered in: no copy of the keys.

    The CPU ``vec`` kernels store K with slots innermost, so their gathered keys are a transposed
    view (``[.., hd, bs]`` in memory); a batched matrix product in that orientation reads them as
    they lie, where making them row-major first cost a copy of every key per layer.
    """
    num_rows, num_heads, window = query.shape[:3]
    if keys.stride(-2) == 1 and keys.stride(-1) != 1:  # [.., hd, bs] in memory
        scores = torch.matmul(query[:, :, None], keys.transpose(-1, -2))  # [r, H, m, W, bs]
        if window == 1:
            return scores.reshape(num_rows, num_heads, 1, -1)
        return scores.permute(0, 1, 3, 2, 4).reshape(num_rows, num_heads, window, -1)
    # one product per (request, head) over all its blocks, where broadcasting the query over the blocks
    # ran one small product per block: 10-30 % faster at one query on the CPU build, 1.5x at a window of 8
    return torch.matmul(keys.flatten(2, 3), query.transpose(-1, -2)).transpose(-1, -2)  # [r, H, W, m * bs]


def _chunk_probabilities(layers: Sequence[ObservedLayer], queries: torch.Tensor, heads: torch.Tensor,
                         block_rows: torch.Tensor, visible: torch.Tensor, chunk: Chunk,
                         layout: kv_keys.BlockLayout) -> torch.Tensor:
    """``[L, r, H * W, chunk.length]`` softmax probabilities of one chunk (0 where a query sees no key).

    Args:
        queries: ``[L, r, H, W, hd]`` float32.
        heads: ``[L, H]`` KV head per sampled head, on the device.
        block_rows: ``[r, M]`` the chunk's block-table rows.
        visible: ``[r, W]`` keys each window query sees (its request's length less its offset).
    """
    num_rows, num_heads, window = queries.shape[1], queries.shape[2], queries.shape[3]
    block_size = layout.block_size
    logits = torch.empty(len(layers), num_rows, num_heads, window, chunk.length, device=queries.device)
    num_blocks = -(-chunk.length // block_size)
    for index, layer in enumerate(layers):
        query = queries[index]  # [r, H, W, hd]
        for first in range(0, num_blocks, chunk.blocks_per_gather):
            last = min(num_blocks, first + chunk.blocks_per_gather)
            keys = kv_keys.gather_key_blocks(layer.cache, block_rows[:, first:last], heads[index], layout).float()
            begin, end = first * block_size, min(last * block_size, chunk.length)
            scores = _block_scores(query, keys)  # [r, H, W, (last - first) * bs]
            logits[index, :, :, :, begin:end] = scores[..., :end - begin] * layer.scale
            del keys, scores
    outside = torch.arange(chunk.length, device=queries.device)[None, None, :] >= visible[:, :, None]  # [r, W, K]
    logits.masked_fill_(outside[None, :, None], float("-inf"))
    return torch.softmax(logits, dim=-1).flatten(2, 3)
