"""Paged attention over mixed-precision pages, and the per-step layout it reads.

A :class:`StepLayout` is built once per engine step from the page tables (it is the same for every
layer). Each layer gathers every format's pages in one indexed read per format (dequantizing
quantized ones) and runs one masked attention over ``[batch, max_keys]`` keys:

- one format (full KV, the fixed caps): a ``[batch, max_pages]`` matrix of page ids padded with the
  store's null page, read as it lies;
- several formats (GrowPage's quantized pages beside full ones): each format's pages are read once,
  unpadded, and one more index packs each row's keys side by side. Padding each format to its own
  widest row instead would give every row the sum of the widest rows' keys (a request with many
  full pages beside one with many quantized pages pads both to both), and attention would read the
  padding at every layer of every step.

Keys are stored after RoPE, so attention is order-free over the surviving tokens and logical
positions only matter for the causal mask; empty slots and padding carry position -1 and are masked.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from growpage.engine.kv.kv_store import KVStore, PageFormat


@dataclasses.dataclass
class StepLayout:
    """Where every cached key of a batch lives, for one step.

    Attributes:
        pages_by_format: per format, the long page ids each layer reads, in the order their
            tokens are gathered (formats in this dict's order, each page's slots in order).
        pack_index: None when one format is read as a ``[batch, max_pages]`` null-padded matrix
            (the gathered tokens are the key axis as they lie); else ``[batch * max_keys]`` long
            indices into the gathered tokens, each row's keys first, padded with a null slot.
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

    pages_by_format: dict[PageFormat, torch.Tensor]
    pack_index: torch.Tensor | None
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
    rows_by_format = dict(sorted(rows_by_format.items()))
    if len(rows_by_format) == 1:
        pages_by_format, pack_index, key_pages, key_slots = _padded_matrix(store, rows_by_format, batch)
    else:
        pages_by_format, pack_index, key_pages, key_slots = _packed_rows(store, rows_by_format, batch)
    key_positions = store.positions[key_pages, key_slots]  # [B, K]
    slot_ids = key_pages * store.max_tokens_per_page + key_slots

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
    return StepLayout(pages_by_format=pages_by_format, pack_index=pack_index, key_positions=key_positions,
                      key_slot_ids=slot_ids.reshape(-1), query_positions=q_pos,
                      last_query_index=last_index, logical_lengths=lengths, attn_mask=mask[:, None],
                      single_query_rows=torch.tensor(single, dtype=torch.long, device=device) if mixed else None,
                      multi_query_rows=torch.tensor(multi, dtype=torch.long, device=device) if mixed else None)


# (pages read per format, pack index or None, [B, K] page and [B, K] slot of every key)
_KeyAxis = tuple[dict[PageFormat, torch.Tensor], torch.Tensor | None, torch.Tensor, torch.Tensor]


def _padded_matrix(store: KVStore, rows_by_format: dict[PageFormat, list[list[int]]], batch: int) -> _KeyAxis:
    """One format: its ``[batch, max_pages]`` null-padded page matrix is the key axis as read."""
    (fmt, rows), = rows_by_format.items()
    width = max(1, max(len(r) for r in rows))
    matrix = torch.tensor([r + [store.null_page] * (width - len(r)) for r in rows], dtype=torch.long,
                          device=store.device)
    per_page = store.tokens_per_page[fmt]
    slots = torch.arange(per_page, device=store.device)
    key_pages = matrix[:, :, None].expand(batch, width, per_page).reshape(batch, -1)
    return {fmt: matrix.reshape(-1)}, None, key_pages, slots.repeat(batch, width)


def _packed_rows(store: KVStore, rows_by_format: dict[PageFormat, list[list[int]]], batch: int) -> _KeyAxis:
    """Several formats: each format's pages read once, unpadded, then packed per row by one index.

    The gathered tokens are every format's pages in turn (each page's ``tokens_per_page`` slots),
    then one null page; a row's keys are its pages' slots side by side, padded with the null page's
    first slot. Built per page on the host (a step holds hundreds of pages), expanded to tokens on
    the device.
    """
    device = store.device
    read: dict[PageFormat, list[int]] = {}
    columns = [0] * batch  # each row's keys so far
    # per format: each page's first gathered token, row and first column in its row; tokens per page
    placed: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = []
    first_token = 0
    for fmt, rows in rows_by_format.items():
        per_page = store.tokens_per_page[fmt]
        pages, page_rows, page_columns = [], [], []
        for row, row_pages in enumerate(rows):
            for page in row_pages:
                pages.append(page)
                page_rows.append(row)
                page_columns.append(columns[row])
                columns[row] += per_page
        read[fmt] = pages
        placed.append((first_token + per_page * torch.arange(len(pages), device=device),
                       torch.tensor(page_rows, dtype=torch.long, device=device),
                       torch.tensor(page_columns, dtype=torch.long, device=device), per_page))
        first_token += per_page * len(pages)
    read[next(reversed(read))].append(store.null_page)  # padding reads the null page's first slot
    pack = torch.full((batch, max(1, max(columns))), first_token, dtype=torch.long, device=device)
    for first_tokens, row_ids, first_columns, per_page in placed:
        slots = torch.arange(per_page, device=device)
        pack[row_ids[:, None], first_columns[:, None] + slots] = first_tokens[:, None] + slots
    pages_read = {fmt: torch.tensor(pages, dtype=torch.long, device=device) for fmt, pages in read.items()}
    # the page and slot of every gathered token, in gather order
    token_pages = torch.cat([pages.repeat_interleave(store.tokens_per_page[fmt]) for fmt, pages in pages_read.items()])
    token_slots = torch.cat([torch.arange(store.tokens_per_page[fmt], device=device).repeat(len(pages))
                             for fmt, pages in pages_read.items()])
    return pages_read, pack.reshape(-1), token_pages[pack], token_slots[pack]


def gather_kv(store: KVStore, layer: int, layout: StepLayout, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys, values)``, each ``[batch, kv_heads, max_keys, head_dim]`` at ``dtype``."""
    batch = layout.batch_size
    tokens = [store.read_layer(layer, pages, fmt, dtype).flatten(0, 1)  # [P * T, 2, H, D]
              for fmt, pages in layout.pages_by_format.items()]
    gathered = torch.cat(tokens) if len(tokens) > 1 else tokens[0]
    if layout.pack_index is not None:
        gathered = gathered.index_select(0, layout.pack_index)
    kv = gathered.view(batch, -1, *gathered.shape[1:])  # [B, K, 2, H, D]
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
