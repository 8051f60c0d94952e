"""Symmetric INT8 / INT4 quantization of KV pages with one scale per (page, K|V, head).

Shapes: a page group is ``[num_layers, num_tokens, 2, num_kv_heads, head_dim]`` (2 = K, V); scales
are ``[num_layers, 2, num_kv_heads]`` in float16 so the stored bytes are exactly what we report.
INT4 packs two values per byte along ``head_dim`` (even index in the low nibble), KIVI-style, with a
+8 offset so codes are unsigned.

Error bound (tested): ``|x - dequantize(quantize(x))| <= scale / 2`` per element, up to float16
rounding of the scale, where ``scale = absmax / qmax`` (127 for INT8, 7 for INT4).
"""

from __future__ import annotations

import torch

SCALE_DTYPE = torch.float16
SCALE_BYTES = 2
_TINY_SCALE = 2.0 ** -24  # smallest float16 subnormal: an all-zero head still divides safely


def qmax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def quantize(values: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a page's tokens.

    Args:
        values: ``[L, T, 2, H, D]`` float tensor.
        bits: 8 or 4.

    Returns:
        ``(codes, scales)``: codes ``[L, T, 2, H, D]`` int8 (bits=8) or ``[L, T, 2, H, D/2]`` uint8
        (bits=4); scales ``[L, 2, H]`` float16.
    """
    limit = qmax(bits)
    absmax = values.abs().amax(dim=(1, 4)).float()  # [L, 2, H]
    scales = (absmax / limit).clamp_min(_TINY_SCALE).to(SCALE_DTYPE)
    divisor = scales.float()[:, None, :, :, None]
    codes = torch.round(values.float() / divisor).clamp_(-limit, limit)
    if bits == 8:
        return codes.to(torch.int8), scales
    if values.shape[-1] % 2:
        raise ValueError(f"INT4 packing needs an even head_dim, got {values.shape[-1]}")
    unsigned = (codes + 8).to(torch.uint8)
    packed = unsigned[..., 0::2] | (unsigned[..., 1::2] << 4)
    return packed, scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize`; broadcasts over any leading page dimensions.

    Args:
        codes: ``[..., T, 2, H, D]`` int8 or ``[..., T, 2, H, D/2]`` uint8.
        scales: ``[..., 2, H]``.
    """
    if bits == 8:
        values = codes.float()
    else:
        low = (codes & 0x0F).to(torch.int16) - 8
        high = (codes >> 4).to(torch.int16) - 8
        values = torch.stack((low, high), dim=-1).flatten(-2).float()
    return (values * scales.float().unsqueeze(-3).unsqueeze(-1)).to(dtype)


def quantized_bytes(num_layers: int, num_tokens: int, num_kv_heads: int, head_dim: int, bits: int) -> int:
    """Bytes of ``num_tokens`` quantized tokens in one page, scales included."""
    values = num_layers * num_tokens * 2 * num_kv_heads * head_dim * bits // 8
    return values + num_layers * 2 * num_kv_heads * SCALE_BYTES
