"""INT8 / INT4 page quantization: error bounds and exact byte arithmetic."""

import pytest
import torch

from growpage.engine.kv import quantize as q


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_round_trip_error_is_within_half_a_step(bits, dtype):
    torch.manual_seed(bits)
    values = (torch.randn(3, 32, 2, 4, 64) * torch.rand(1, 1, 2, 4, 1) * 5).to(dtype)
    codes, scales = q.quantize(values, bits)
    restored = q.dequantize(codes, scales, bits, torch.float32)
    step = scales.float()[:, None, :, :, None]
    error = (restored - values.float()).abs()
    # Half a quantization step, plus float16 rounding of the stored scale (2**-11 relative).
    bound = step * 0.5 + step * q.qmax(bits) * 2.0 ** -10
    assert torch.all(error <= bound)


def test_int8_is_tighter_than_int4():
    torch.manual_seed(0)
    values = torch.randn(1, 64, 2, 2, 64)
    errors = {}
    for bits in (8, 4):
        codes, scales = q.quantize(values, bits)
        errors[bits] = (q.dequantize(codes, scales, bits, torch.float32) - values).abs().mean().item()
    assert errors[8] * 10 < errors[4]


def test_int4_packs_two_values_per_byte():
    values = torch.randn(2, 16, 2, 3, 64)
    codes, scales = q.quantize(values, 4)
    assert codes.dtype == torch.uint8 and codes.shape == (2, 16, 2, 3, 32)
    assert scales.shape == (2, 2, 3) and scales.dtype == torch.float16


def test_all_zero_head_stays_zero():
    values = torch.zeros(1, 8, 2, 1, 8)
    for bits in (8, 4):
        codes, scales = q.quantize(values, bits)
        assert torch.all(q.dequantize(codes, scales, bits, torch.float32) == 0)


def test_outliers_are_clipped_to_range_not_wrapped():
    values = torch.zeros(1, 4, 2, 1, 8)
    values[0, 0, 0, 0, 0] = 1000.0
    values[0, 1, 0, 0, 1] = -1000.0
    codes, scales = q.quantize(values, 4)
    restored = q.dequantize(codes, scales, 4, torch.float32)
    assert restored[0, 0, 0, 0, 0] == pytest.approx(1000.0, rel=1e-3)
    assert restored[0, 1, 0, 0, 1] == pytest.approx(-1000.0, rel=1e-3)


def test_int8_cannot_reach_two_x_once_scales_are_counted():
    # FP16 -> INT8 with per-head per-page scales is just under 2.0x.
    layers, tokens, heads, dim = 30, 16, 3, 64
    fp16_bytes = layers * tokens * 2 * heads * dim * 2
    int8 = q.quantized_bytes(layers, tokens, heads, dim, 8)
    int4 = q.quantized_bytes(layers, tokens, heads, dim, 4)
    assert int8 == fp16_bytes // 2 + layers * 2 * heads * 2
    assert 1.9 < fp16_bytes / int8 < 2.0
    assert 3.9 < fp16_bytes / int4 < 4.0
