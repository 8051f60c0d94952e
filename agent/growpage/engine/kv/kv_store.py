"""The bytes of the KV pages, in mixed precision, and their per-token metadata.

Every page is the same number of bytes per layer (``block_size`` tokens at ``kv_dtype``). A page's
*format* decides how many tokens those bytes hold: ``FULL`` holds ``block_size``; ``INT8`` holds
``block_size * itemsize``; ``INT4`` twice that. That is how quantization frees pages: two full FP16
pages become one INT8 page and the other page goes back to the pool.

Layouts (views of one uint8 arena ``[L, P, page_bytes]``, no copies):
    full: ``[L, P, block_size, 2, H, D]`` at ``kv_dtype``   (2 = K, V; keys are stored after RoPE)
    int8: ``[L, P, 2 * itemsize * block_size / 2, 2, H, D]`` int8
    int4: ``[L, P, ..., 2, H, D / 2]`` uint8
Per page and slot: ``positions`` (logical position, -1 = empty) and ``scores`` (accumulated
attention mass, the eviction score); per page: scales ``[L, 2, H]`` for quantized pages.
"""

from __future__ import annotations

import enum

import torch

from growpage.engine.kv import quantize as q
from growpage.kv_size import kv_token_bytes


class PageFormat(enum.IntEnum):
    FULL = 0
    INT8 = 1
    INT4 = 2

    @property
    def bits(self) -> int:
        return {PageFormat.INT8: 8, PageFormat.INT4: 4}[self]

    @classmethod
    def for_bits(cls, bits: int) -> PageFormat:
        return cls.INT8 if bits == 8 else cls.INT4


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class KVStore:
    """Page bytes for ``num_layers`` layers plus host-side per-page fill counts and formats."""

    def __init__(self, num_layers: int, num_pages: int, block_size: int, num_kv_heads: int,
                 head_dim: int, kv_dtype: torch.dtype = torch.float16,
                 device: torch.device | str = "cpu"):
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for INT4 packing, got {head_dim}")
        self.num_layers, self.num_pages, self.block_size = num_layers, num_pages, block_size
        self.num_kv_heads, self.head_dim, self.kv_dtype = num_kv_heads, head_dim, kv_dtype
        self.device = torch.device(device)
        itemsize = torch.empty((), dtype=kv_dtype).element_size()
        self.full_token_bytes = kv_token_bytes(1, num_kv_heads, head_dim, itemsize)  # one layer
        self.page_bytes = block_size * self.full_token_bytes  # one layer
        self.tokens_per_page = {
            PageFormat.FULL: block_size,
            PageFormat.INT8: block_size * itemsize,
            PageFormat.INT4: 2 * block_size * itemsize,
        }
        max_tokens = self.tokens_per_page[PageFormat.INT4]
        # One extra page, never granted: the null page. It pads page tables in attention layouts and
        # sinks their score updates; it stays zero (every format reads it as 0, positions -1).
        self.null_page = num_pages
        self.arena = torch.zeros(num_layers, num_pages + 1, self.page_bytes, dtype=torch.uint8,
                                 device=self.device)
        shape = (num_layers, num_pages + 1)
        self._views = {
            PageFormat.FULL: self.arena.view(kv_dtype).view(*shape, block_size, 2, num_kv_heads, head_dim),
            PageFormat.INT8: self.arena.view(torch.int8).view(
                *shape, self.tokens_per_page[PageFormat.INT8], 2, num_kv_heads, head_dim),
            PageFormat.INT4: self.arena.view(*shape, max_tokens, 2, num_kv_heads, head_dim // 2),
        }
        self.scales = torch.zeros(num_layers, num_pages + 1, 2, num_kv_heads, dtype=q.SCALE_DTYPE,
                                  device=self.device)
        self.positions = torch.full((num_pages + 1, max_tokens), -1, dtype=torch.int32, device=self.device)
        self.scores = torch.zeros(num_pages + 1, max_tokens, dtype=torch.float32, device=self.device)
        self.max_tokens_per_page = max_tokens
        self.fill = [0] * (num_pages + 1)
        self.format = [PageFormat.FULL] * (num_pages + 1)

    # ---- bytes --------------------------------------------------------------------------------
    def stored_bytes(self, page: int) -> int:
        """Bytes a used page occupies, all layers, scales included for quantized pages."""
        scale_bytes = 0
        if self.format[page] is not PageFormat.FULL:
            scale_bytes = self.num_layers * 2 * self.num_kv_heads * q.SCALE_BYTES
        return self.num_layers * self.page_bytes + scale_bytes

    def live_bytes(self, page: int) -> int:
        """Bytes of the tokens a page holds at its format, scales included (slack excluded: that is
        what fragmentation measures)."""
        fmt = self.format[page]
        scale_bytes = 0 if fmt is PageFormat.FULL else self.num_layers * 2 * self.num_kv_heads * q.SCALE_BYTES
        return round(self.fill[page] * self.token_bytes(fmt)) + scale_bytes

    def logical_bytes(self, num_tokens: int) -> int:
        """Bytes ``num_tokens`` tokens would take at full precision in every layer."""
        return num_tokens * self.num_layers * self.full_token_bytes

    def token_bytes(self, fmt: PageFormat) -> float:
        """Bytes per token at ``fmt``, all layers, without scales."""
        return self.num_layers * self.page_bytes / self.tokens_per_page[fmt]

    def capacity(self, page: int) -> int:
        return self.tokens_per_page[self.format[page]]

    # ---- reads --------------------------------------------------------------------------------
    def read_layer(self, layer: int, pages: torch.Tensor, fmt: PageFormat, dtype: torch.dtype) -> torch.Tensor:
        """``[n, tokens_per_page(fmt), 2, H, D]`` values of ``pages`` in one layer, dequantized."""
        raw = self._views[fmt][layer].index_select(0, pages)
        if fmt is PageFormat.FULL:
            return raw.to(dtype)
        return q.dequantize(raw, self.scales[layer].index_select(0, pages), fmt.bits, dtype)

    def read_all_layers(self, pages: list[int], dtype: torch.dtype) -> torch.Tensor:
        """``[L, N, 2, H, D]``: the filled tokens of ``pages`` in order, all layers, dequantized."""
        chunks = []
        for page in pages:
            fmt, fill = self.format[page], self.fill[page]
            raw = self._views[fmt][:, page, :fill]
            if fmt is PageFormat.FULL:
                chunks.append(raw.to(dtype))
            else:
                chunks.append(q.dequantize(raw, self.scales[:, page], fmt.bits, dtype))
        return torch.cat(chunks, dim=1)

    # ---- writes -------------------------------------------------------------------------------
    def write_tokens(self, layer: int, pages: torch.Tensor, slots: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor) -> None:
        """Store new tokens' K and V (``[N, H, D]`` each) into full-format slots of one layer."""
        view = self._views[PageFormat.FULL][layer]
        view[pages, slots, 0] = key.to(self.kv_dtype)
        view[pages, slots, 1] = value.to(self.kv_dtype)

    def assign_slots(self, pages: list[int], slots: list[int], positions: list[int]) -> None:
        """Record the logical positions of tokens about to be written (shared by all layers)."""
        if not pages:
            return
        page_index = torch.tensor(pages, dtype=torch.long, device=self.device)
        slot_index = torch.tensor(slots, dtype=torch.long, device=self.device)
        self.positions[page_index, slot_index] = torch.tensor(positions, dtype=torch.int32,
                                                              device=self.device)
        self.scores[page_index, slot_index] = 0.0
        for page, slot in zip(pages, slots, strict=True):
            self.fill[page] = max(self.fill[page], slot + 1)

    def write_group(self, pages: list[int], fmt: PageFormat, values: torch.Tensor,
                    positions: torch.Tensor, scores: torch.Tensor) -> list[int]:
        """Rewrite ``pages`` to hold the tokens ``values`` (``[L, N, 2, H, D]``) at ``fmt``, in order.

        Returns the pages left empty (their tokens moved into earlier ones), for the caller to
        release or keep.
        """
        per_page = self.tokens_per_page[fmt]
        num_tokens = values.shape[1]
        emptied = []
        for index, page in enumerate(pages):
            start = index * per_page
            count = max(min(per_page, num_tokens - start), 0)
            self.positions[page].fill_(-1)
            self.scores[page].zero_()
            self.fill[page] = count
            if count == 0:
                self._set_format(page, PageFormat.FULL)
                emptied.append(page)
                continue
            chunk = values[:, start:start + count]
            self._set_format(page, fmt)
            if fmt is PageFormat.FULL:
                self._views[fmt][:, page, :count] = chunk.to(self.kv_dtype)
            else:
                codes, scales = q.quantize(chunk, fmt.bits)
                self._views[fmt][:, page, :count] = codes
                self.scales[:, page] = scales
            self.positions[page, :count] = positions[start:start + count].to(torch.int32)
            self.scores[page, :count] = scores[start:start + count]
        return emptied

    def clear(self, page: int) -> None:
        """Forget a page's tokens (on release); its bytes are overwritten by the next writer."""
        self.positions[page].fill_(-1)
        self.scores[page].zero_()
        self.fill[page] = 0
        self._set_format(page, PageFormat.FULL)

    def _set_format(self, page: int, fmt: PageFormat) -> None:
        # NOTE: attention reads whole pages and masks empty slots by position. Empty slots of a
        # full-precision page must hold finite numbers (a masked value still meets a 0 weight, and
        # NaN * 0 is NaN); quantized codes read as FP16 can be NaN, so such pages are zeroed.
        if fmt is PageFormat.FULL and self.format[page] is not PageFormat.FULL:
            self.arena[:, page].zero_()
        self.format[page] = fmt
