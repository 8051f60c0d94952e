"""Paged attention over mixed-precision pages, and the per-step layout it reads.

A :class:`StepLayout` is built once per engine step from the page tables (it is the same for every
layer): for each page format, a ``[batch, max_pages]`` matrix of page ids padded with the store's
null page. Each layer gathers every format's pages in one indexed read (dequantizing quantized
ones), concatenates them along the key axis and runs one masked attention. Keys are stored after
RoPE, so attention is order-free over the surviving tokens and logical positions only matter for the
causal mask; empty slots and padding carry position -1 and are masked.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from growpage.core.kv_store import KVStore, PageFormat


@dataclasses.dataclass
class StepLayout:
    """Where every cached key of a batch lives, for one step.

    Attributes:
        page_matrices: per format, ``[batch, max_pages]`` long page ids, null-page padded; the key
            axis is these formats' pages concatenated in this dict's order.
        key_positions: ``[batch, max_keys]`` int32 logical positions, -1 on padding/empty slots.
        key_slot_ids: ``[batch * max_keys]`` long index into ``KVStore.scores.view(-1)``, to
            accumulate attention mass per stored token.
        query_positions: ``[batch, max_queries]`` long, -1 on padding.
        last_query_index: ``[batch]`` long, the newest query of each row.
        logical_lengths: ``[batch]`` long, tokens each request has seen including this step.
        attn_mask: ``[batch, 1, max_queries, max_keys]`` bool, key visible to query.
        single_query_rows, multi_query_rows: ``[n]`` long row indices of the rows with one query
            (decodes) and with more (prompt chunks) when a step mixes both, else None: attention
            runs per group, so a prompt chunk beside many decodes does not pad every decode row to
            the chunk's length.
    """

    page_matrices: dict[PageFormat, torch.Tensor]
    key_positions: torch.Tensor
    key_slot_ids: torch.Tensor
    query_positions: torch.Tensor
    last_query_index: torch.Tensor
    logical_lengths: torch.Tensor
    attn_mask: torch.Tensor
    single_query_rows: torch.Tensor | None = None
    multi_query_rows: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.key_positions.shape[0]

    @property
    def max_keys(self) -> int:
        return self.key_positions.shape[1]


def build_layout(store: KVStore, page_tables: list[list[int]], query_positions: list[list[int]]) -> StepLayout:
    """Build the layout of one step.

    Args:
        page_tables: per batch row, the pages holding its tokens (any order; empty pages skipped).
        query_positions: per batch row, the logical positions of this step's query tokens, whose
            K/V must already be assigned to slots in the store.
    """
    device = store.device
    batch = len(page_tables)
    rows_by_format: dict[PageFormat, list[list[int]]] = {}
    for row, pages in enumerate(page_tables):
        for page in pages:
            if store.fill[page]:
                rows_by_format.setdefault(store.format[page], [[] for _ in range(batch)])[row].append(page)
    if not rows_by_format:  # nothing cached yet: one null page keeps every shape non-empty
        rows_by_format[PageFormat.FULL] = [[] for _ in range(batch)]

    page_matrices, position_blocks, slot_blocks = {}, [], []
    for fmt in sorted(rows_by_format):
        rows = rows_by_format[fmt]
        width = max(1, max(len(r) for r in rows))
        padded = [r + [store.null_page] * (width - len(r)) for r in rows]
        matrix = torch.tensor(padded, dtype=torch.long, device=device)
        per_page = store.tokens_per_page[fmt]
        page_matrices[fmt] = matrix
        position_blocks.append(store.positions[matrix, :per_page].reshape(batch, -1))
        slots = torch.arange(per_page, device=device)
        slot_blocks.append((matrix[:, :, None] * store.max_tokens_per_page + slots).reshape(batch, -1))
    key_positions = torch.cat(position_blocks, dim=1) if len(position_blocks) > 1 else position_blocks[0]
    slot_ids = torch.cat(slot_blocks, dim=1) if len(slot_blocks) > 1 else slot_blocks[0]

    max_queries = max((len(p) for p in query_positions), default=1) or 1
    padded_queries = [p + [-1] * (max_queries - len(p)) for p in query_positions]
    q_pos = torch.tensor(padded_queries, dtype=torch.long, device=device).view(batch, max_queries)
    last_index = torch.tensor([max(len(p) - 1, 0) for p in query_positions], dtype=torch.long, device=device)
    lengths = torch.tensor([(p[-1] + 1) if p else 0 for p in query_positions], dtype=torch.long, device=device)
    valid_key = (key_positions >= 0)[:, None, :]
    causal = key_positions[:, None, :].long() <= q_pos[:, :, None]
    # Padded query rows see every valid key, so no softmax row is empty (no NaN anywhere).
    mask = torch.where((q_pos >= 0)[:, :, None], causal & valid_key, valid_key)
    single = [row for row, p in enumerate(query_positions) if len(p) <= 1]
    mixed = 0 < len(single) < batch and max_queries > 1
    multi = [row for row, p in enumerate(query_positions) if len(p) > 1] if mixed else []
    return StepLayout(page_matrices=page_matrices, key_positions=key_positions,
                      key_slot_ids=slot_ids.reshape(-1), query_positions=q_pos,
                      last_query_index=last_index, logical_lengths=lengths, attn_mask=mask[:, None],
                      single_query_rows=torch.tensor(single, dtype=torch.long, device=device) if mixed else None,
                      multi_query_rows=torch.tensor(multi, dtype=torch.long, device=device) if mixed else None)


def gather_kv(store: KVStore, layer: int, layout: StepLayout, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys, values)``, each ``[batch, kv_heads, max_keys, head_dim]`` at ``dtype``."""
    batch = layout.batch_size
    blocks = []
    for fmt, matrix in layout.page_matrices.items():
        values = store.read_layer(layer, matrix.reshape(-1), fmt, dtype)  # [B * P, T, 2, H, D]
        blocks.append(values.reshape(batch, -1, *values.shape[2:]))
    kv = torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0]  # [B, K, 2, H, D]
    return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def paged_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layout: StepLayout,
                    scale: float) -> torch.Tensor:
    """Causal attention of this step's queries over the gathered pages.

    Args:
        query: ``[batch, max_queries, q_heads, head_dim]`` (q_heads a multiple of kv_heads).
        keys, values: from :func:`gather_kv`.

    Returns:
        ``[batch, max_queries, q_heads, head_dim]`` (zeros at a decode row's padded queries when
        the step mixes decodes and prompt chunks).
    """
    single, multi = layout.single_query_rows, layout.multi_query_rows
    if single is None or multi is None:
        out = F.scaled_dot_product_attention(query.transpose(1, 2), keys, values, attn_mask=layout.attn_mask,
                                             scale=scale, enable_gqa=True)
        return out.transpose(1, 2)
    # decodes and prompt chunks apart: a decode row's padded queries are never read
    out = query.new_zeros(query.shape)
    for rows, queries in ((single, 1), (multi, query.shape[1])):
        part = F.scaled_dot_product_attention(query[rows, :queries].transpose(1, 2), keys[rows], values[rows],
                                              attn_mask=layout.attn_mask[rows, :, :queries], scale=scale,
                                              enable_gqa=True)
        out[rows, :queries] = part.transpose(1, 2)
    return out


def newest_query_probs(query: torch.Tensor, keys: torch.Tensor, layout: StepLayout, scale: float) -> torch.Tensor:
    """Attention probabilities of each row's newest query: ``[batch, q_heads, max_keys]``."""
    batch, _, q_heads, dim = query.shape
    kv_heads = keys.shape[1]
    newest = query[torch.arange(batch, device=query.device), layout.last_query_index]  # [B, Hq, D]
    grouped = newest.view(batch, kv_heads, q_heads // kv_heads, dim).float()
    logits = torch.einsum("bhgd,bhld->bhgl", grouped, keys.float()) * scale
    mask = layout.attn_mask[torch.arange(batch, device=query.device), 0, layout.last_query_index]  # [B, L]
    logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.softmax(logits, dim=-1).reshape(batch, q_heads, -1)
