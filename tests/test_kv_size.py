"""Tests for growpage.kv_size: the numbers an SRE sizes a pool with."""

import json
from fractions import Fraction

import pytest

from growpage.errors import GrowPageError
from growpage.kv_size import (
    MODEL_PRESETS,
    estimate_kv_size,
    format_bytes,
    format_exact_bytes,
    quoted_example_note,
    resolve_geometry,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def test_quoted_example_has_the_right_numbers():
    # This example is often quoted at ~1.8 GB per request and 14 GB for batch 8; these are the true figures.
    estimate = estimate_kv_size(32, 32, 128, tokens=128 + 512, batch=8, dtype="float16")

    assert estimate.bytes_per_token == 524_288 == 512 * KiB
    assert estimate.bytes_per_request == 320 * MiB
    assert estimate.bytes_per_batch == int(2.5 * GiB)
    assert estimate.pages_per_request == 40
    assert estimate.pages_per_batch == 320
    assert estimate.bytes_per_page == 16 * 512 * KiB
    assert estimate.allocated_bytes_per_request == estimate.bytes_per_request
    assert format_bytes(estimate.bytes_per_request) == "320 MiB"
    assert format_bytes(estimate.bytes_per_batch) == "2.5 GiB"
    assert "32 layers x 32 KV heads x 128 head_dim x 2 (K and V) x 2 B (float16)" in estimate.formula
    assert "524,288 B per token" in estimate.formula


def test_quoted_example_note_corrects_only_the_quoted_example():
    example = estimate_kv_size(32, 32, 128, tokens=640, batch=8)
    note = quoted_example_note(example)
    assert note is not None and "1.8 GB" in note and "320 MiB" in note and "2.5 GiB" in note
    assert "\n" not in note
    assert quoted_example_note(estimate_kv_size(32, 8, 128, tokens=640)) is None


def test_smollm2_135m_preset_is_23040_bytes_per_token_in_fp16():
    geometry = resolve_geometry("smollm2-135m")
    estimate = estimate_kv_size(geometry.layers, geometry.kv_heads, geometry.head_dim, tokens=1)

    assert (geometry.layers, geometry.kv_heads, geometry.head_dim) == (30, 3, 64)
    assert estimate.bytes_per_token == 23_040


@pytest.mark.parametrize(
    ("name", "expected_bytes_per_token"),
    [
        ("llama-3-8b", 32 * 8 * 128 * 2 * 2),
        ("llama-2-7b", 32 * 32 * 128 * 2 * 2),
        ("qwen2.5-7b", 28 * 4 * 128 * 2 * 2),
    ],
)
def test_presets_fp16_bytes_per_token(name, expected_bytes_per_token):
    geometry = resolve_geometry(name)
    estimate = estimate_kv_size(geometry.layers, geometry.kv_heads, geometry.head_dim, tokens=1)
    assert estimate.bytes_per_token == expected_bytes_per_token


def test_explicit_values_override_the_preset():
    geometry = resolve_geometry("Llama-3-8B", kv_heads=32)
    assert (geometry.layers, geometry.kv_heads, geometry.head_dim) == (32, 32, 128)
    assert geometry.name is None  # no longer llama-3-8b's geometry
    assert resolve_geometry("llama-3-8b", layers=32).name == "llama-3-8b"


def test_bfloat16_is_the_same_size_as_float16():
    fp16 = estimate_kv_size(32, 8, 128, tokens=1000, batch=4, dtype="float16")
    bf16 = estimate_kv_size(32, 8, 128, tokens=1000, batch=4, dtype="bfloat16")
    assert dict(fp16.to_dict(), dtype=None, formula=None) == dict(
        bf16.to_dict(), dtype=None, formula=None
    )


def test_float32_is_twice_float16():
    fp16 = estimate_kv_size(30, 3, 64, tokens=100)
    fp32 = estimate_kv_size(30, 3, 64, tokens=100, dtype="fp32")
    assert fp32.dtype == "float32"
    assert fp32.bytes_per_request == 2 * fp16.bytes_per_request
    assert fp32.scale_bytes_per_page == 0


def test_int8_includes_one_fp16_scale_per_layer_kv_and_head_per_page():
    # 1000 tokens -> 63 pages of 16; the last page is partly filled but carries all its scales.
    estimate = estimate_kv_size(30, 3, 64, tokens=1000, batch=2, dtype="int8")

    scale_bytes_per_page = 30 * 2 * 3 * 2
    assert estimate.data_bytes_per_token == 23_040 // 2
    assert estimate.scale_bytes_per_page == scale_bytes_per_page == 360
    assert estimate.bytes_per_token == Fraction(11_520) + Fraction(360, 16) == Fraction(23_085, 2)
    assert estimate.pages_per_request == 63
    assert estimate.bytes_per_request == 1000 * 11_520 + 63 * 360
    assert estimate.bytes_per_batch == 2 * estimate.bytes_per_request
    assert estimate.bytes_per_page == 16 * 11_520 + 360
    assert estimate.allocated_bytes_per_request == 63 * estimate.bytes_per_page
    assert "+ scales:" in estimate.formula and "360 B per 16-token page" in estimate.formula


def test_int8_compression_ratio_is_below_two_once_scales_are_counted():
    # FP16 -> INT8 with per-head scales per 16-token page is ~1.998x, not 2.0x.
    fp16 = estimate_kv_size(1, 1, 128, tokens=16)
    int8 = estimate_kv_size(1, 1, 128, tokens=16, dtype="int8")
    assert fp16.bytes_per_page / int8.bytes_per_page == pytest.approx(4096 / 2050)
    assert fp16.bytes_per_page / int8.bytes_per_page < 2.0


def test_int4_packs_two_elements_per_byte_plus_scales():
    estimate = estimate_kv_size(32, 8, 128, tokens=33, dtype="int4", block_size=32)

    assert estimate.data_bytes_per_token == 32 * 8 * 2 * 64
    assert estimate.scale_bytes_per_page == 32 * 2 * 8 * 2
    assert estimate.pages_per_request == 2
    assert estimate.bytes_per_request == 33 * 32_768 + 2 * 1_024
    assert estimate.bytes_per_token == 32_768 + Fraction(1_024, 32)
    assert "0.5 B (int4)" in estimate.formula


def test_int4_odd_head_dim_rounds_each_head_vector_up_to_whole_bytes():
    estimate = estimate_kv_size(1, 1, 3, tokens=1, dtype="int4")
    assert estimate.data_bytes_per_token == 2 * 2  # K and V, 2 bytes each


def test_to_dict_is_json_with_int_bytes():
    document = json.loads(json.dumps(estimate_kv_size(32, 32, 128, tokens=640).to_dict()))
    assert document["bytes_per_token"] == 524_288 and isinstance(document["bytes_per_token"], int)
    assert isinstance(document["bytes_per_request"], int)
    int8 = json.loads(json.dumps(estimate_kv_size(30, 3, 64, tokens=10, dtype="int8").to_dict()))
    assert int8["bytes_per_token"] == 11_542.5


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [(0, "0 B"), (360, "360 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (5 * GiB // 4, "1.25 GiB")],
)
def test_format_bytes_uses_binary_units(num_bytes, text):
    assert format_bytes(num_bytes) == text


def test_format_exact_bytes():
    assert format_exact_bytes(2_684_354_560) == "2,684,354,560"
    assert format_exact_bytes(Fraction(23_085, 2)) == "11,542.5"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"dtype": "fp8"}, "unknown KV dtype 'fp8'"),
        ({"tokens": 0}, "tokens must be a positive whole number"),
        ({"batch": -1}, "batch must be a positive whole number"),
        ({"block_size": 0}, "block_size must be a positive whole number"),
        ({"layers": 0}, "layers must be a positive whole number"),
        ({"head_dim": True}, "head_dim must be a positive whole number"),
    ],
)
def test_invalid_input_raises_one_line_error_with_a_fix(kwargs, fragment):
    arguments = {"layers": 32, "kv_heads": 8, "head_dim": 128, "tokens": 640, **kwargs}
    with pytest.raises(GrowPageError) as raised:
        estimate_kv_size(**arguments)
    message = str(raised.value)
    assert fragment in message
    assert "\n" not in message
    assert "use one of" in message or "set --" in message


def test_unknown_preset_suggests_the_close_one():
    with pytest.raises(GrowPageError, match=r"did you mean 'llama-3-8b'.*use one of"):
        resolve_geometry("lama-3-8b")


def test_missing_geometry_names_the_missing_flags():
    with pytest.raises(GrowPageError, match=r"--kv-heads, --head-dim.*--model"):
        resolve_geometry(layers=32)


def test_every_preset_resolves():
    for name in MODEL_PRESETS:
        assert resolve_geometry(name).name == name
