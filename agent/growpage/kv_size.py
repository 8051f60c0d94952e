"""KV cache size arithmetic: how many bytes and pages a request's keys and values take.

A common estimate gets this wrong (it puts 32 layers x 32 KV heads x head_dim 128 at 640 FP16 tokens
at "about 1.8 GB" per request; it is 320 MiB). This module is the one place the project does the
arithmetic, so ``gpctl kv-size``, docs and capacity advice all agree. Pure Python, no CLI imports.

Layout assumed (vLLM's paged KV cache): every layer stores one K and one V vector of ``head_dim``
elements per KV head per token, in pages of ``block_size`` token slots. Quantized dtypes (int8, int4)
also store one float16 scale per (layer, K|V, KV head) per page, as GrowPage's compressor does.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from fractions import Fraction
from typing import Any

from growpage.errors import GrowPageError

# Bits rather than bytes so int4 (half a byte) stays exact integer arithmetic.
DTYPE_BITS: dict[str, int] = {
    "float16": 16,
    "bfloat16": 16,
    "float32": 32,
    "int8": 8,
    "int4": 4,
}
DTYPE_ALIASES: dict[str, str] = {
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
}
QUANTIZED_DTYPES = frozenset({"int8", "int4"})
SCALE_BYTES = 2  # one float16 scale per (layer, K|V, KV head) per page
KV_TENSORS_PER_LAYER = 2  # K and V


def kv_token_bytes(layers: int, kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """Bytes one token's K and V take at full precision across ``layers`` (scales excluded).

    The one place this product is written: the reference engine's page store, the vLLM plugin's
    byte gauges and :func:`estimate_kv_size` all call it. SmolLM2-135M, FP16: 30 x 3 x 2 x 64 x 2
    = 23,040 bytes.
    """
    return layers * kv_heads * KV_TENSORS_PER_LAYER * head_dim * element_bytes

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@dataclasses.dataclass(frozen=True)
class ModelGeometry:
    """The attention shape that decides KV size (from a model's ``config.json``).

    Attributes:
        name: preset name, or ``None`` for a geometry given by hand.
        layers: ``num_hidden_layers``.
        kv_heads: ``num_key_value_heads`` (equals ``num_attention_heads`` without GQA/MQA).
        head_dim: ``head_dim``, or ``hidden_size / num_attention_heads`` where absent.
    """

    name: str | None
    layers: int
    kv_heads: int
    head_dim: int


MODEL_PRESETS: dict[str, ModelGeometry] = {
    geometry.name: geometry
    for geometry in (
        ModelGeometry("smollm2-135m", layers=30, kv_heads=3, head_dim=64),
        ModelGeometry("llama-3-8b", layers=32, kv_heads=8, head_dim=128),
        ModelGeometry("llama-2-7b", layers=32, kv_heads=32, head_dim=128),
        ModelGeometry("qwen2.5-7b", layers=28, kv_heads=4, head_dim=128),
    )
    if geometry.name is not None  # every preset is named; a geometry built from flags is not
}


@dataclasses.dataclass(frozen=True)
class KVSizeEstimate:
    """KV cache footprint of one request and of a batch of identical requests.

    Byte counts are exact. "Held" sizes count the tokens' slots; "allocated" sizes count whole pages,
    so they include the unused tail of each request's last page.

    Attributes:
        layers: transformer layers.
        kv_heads: KV heads per layer.
        head_dim: elements per head vector.
        tokens: tokens per request (prompt plus generated).
        batch: concurrent requests.
        dtype: canonical KV dtype name.
        block_size: token slots per page.
        data_bytes_per_token: K and V element bytes for one token, scales excluded.
        scale_bytes_per_page: quantization scale bytes per page (0 for float dtypes).
        bytes_per_token: data plus scales amortized over a full page; fractional only when the
            scales do not divide evenly by ``block_size``.
        bytes_per_page: bytes of one full page, scales included.
        pages_per_request: ``ceil(tokens / block_size)``.
        pages_per_batch: ``batch * pages_per_request``.
        bytes_per_request: ``tokens * data_bytes_per_token + pages_per_request *
            scale_bytes_per_page``.
        bytes_per_batch: ``batch * bytes_per_request``.
        allocated_bytes_per_request: ``pages_per_request * bytes_per_page``.
        allocated_bytes_per_batch: ``batch * allocated_bytes_per_request``.
        formula: how ``bytes_per_token`` was computed, for humans.
    """

    layers: int
    kv_heads: int
    head_dim: int
    tokens: int
    batch: int
    dtype: str
    block_size: int
    data_bytes_per_token: int
    scale_bytes_per_page: int
    bytes_per_token: Fraction
    bytes_per_page: int
    pages_per_request: int
    pages_per_batch: int
    bytes_per_request: int
    bytes_per_batch: int
    allocated_bytes_per_request: int
    allocated_bytes_per_batch: int
    formula: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view with a stable set of keys.

        Every byte count is an ``int`` except ``bytes_per_token``, which is an ``int`` when whole
        (always for float dtypes) and a ``float`` when amortized scales leave a fraction.
        """
        view = dataclasses.asdict(self)
        view["bytes_per_token"] = _whole_or_float(self.bytes_per_token)
        return view


def canonical_dtype(dtype: str) -> str:
    """Returns the canonical name of a KV dtype (``fp16`` -> ``float16``).

    Raises:
        GrowPageError: the dtype is not one the calculator knows.
    """
    name = str(dtype).strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BITS:
        raise GrowPageError(
            f"unknown KV dtype {dtype!r}{_did_you_mean(name, [*DTYPE_BITS, *DTYPE_ALIASES])}; "
            f"use one of: {', '.join(DTYPE_BITS)}"
        )
    return name


def resolve_geometry(
    model: str | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> ModelGeometry:
    """Combines a preset with explicit values; explicit values win.

    Args:
        model: a key of :data:`MODEL_PRESETS` (case-insensitive), or ``None``.
        layers: overrides the preset's layer count.
        kv_heads: overrides the preset's KV head count.
        head_dim: overrides the preset's head dimension.

    Raises:
        GrowPageError: unknown preset, or no preset and a value missing.
    """
    preset = None
    if model is not None:
        key = model.strip().lower()
        preset = MODEL_PRESETS.get(key)
        if preset is None:
            raise GrowPageError(
                f"unknown model preset {model!r}{_did_you_mean(key, MODEL_PRESETS)}; "
                f"use one of: {', '.join(MODEL_PRESETS)}, or give --layers, --kv-heads and --head-dim"
            )
    given = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}
    if preset is not None:
        given = {
            field: getattr(preset, field) if value is None else value
            for field, value in given.items()
        }
    resolved = {field: value for field, value in given.items() if value is not None}
    missing = [field for field in given if field not in resolved]
    if missing:
        flags = ", ".join("--" + field.replace("_", "-") for field in missing)
        raise GrowPageError(
            f"missing model geometry: {flags}; give them, or pick a preset with --model "
            f"({', '.join(MODEL_PRESETS)})"
        )
    # NOTE: keep the preset's name only while it still describes the geometry.
    name = None
    if preset is not None and all(value == getattr(preset, field) for field, value in resolved.items()):
        name = preset.name
    return ModelGeometry(name=name, **resolved)


def estimate_kv_size(
    layers: int,
    kv_heads: int,
    head_dim: int,
    tokens: int,
    batch: int = 1,
    dtype: str = "float16",
    block_size: int = 16,
) -> KVSizeEstimate:
    """Computes the exact KV cache footprint of ``batch`` requests of ``tokens`` tokens each.

    Args:
        layers: transformer layers (``num_hidden_layers``).
        kv_heads: KV heads per layer (``num_key_value_heads``).
        head_dim: elements per head vector.
        tokens: tokens per request, prompt plus generated.
        batch: concurrent requests of that length.
        dtype: KV element type: float16, bfloat16, float32, int8 or int4 (aliases fp16, bf16, fp32).
        block_size: token slots per page (vLLM's ``block_size``).

    Returns:
        The estimate; see :class:`KVSizeEstimate`.

    Raises:
        GrowPageError: a size is not a positive integer, or the dtype is unknown.
    """
    _require_sizes(layers=layers, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens, batch=batch,
                   block_size=block_size)
    dtype = canonical_dtype(dtype)
    data_bytes_per_token, scale_bytes_per_page = _element_bytes(layers, kv_heads, head_dim, dtype)
    pages_per_request = math.ceil(tokens / block_size)
    bytes_per_page = block_size * data_bytes_per_token + scale_bytes_per_page
    # A partly filled last page still carries its full set of scales.
    bytes_per_request = tokens * data_bytes_per_token + pages_per_request * scale_bytes_per_page
    allocated_bytes_per_request = pages_per_request * bytes_per_page

    return KVSizeEstimate(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tokens=tokens,
        batch=batch,
        dtype=dtype,
        block_size=block_size,
        data_bytes_per_token=data_bytes_per_token,
        scale_bytes_per_page=scale_bytes_per_page,
        bytes_per_token=data_bytes_per_token + Fraction(scale_bytes_per_page, block_size),
        bytes_per_page=bytes_per_page,
        pages_per_request=pages_per_request,
        pages_per_batch=batch * pages_per_request,
        bytes_per_request=bytes_per_request,
        bytes_per_batch=batch * bytes_per_request,
        allocated_bytes_per_request=allocated_bytes_per_request,
        allocated_bytes_per_batch=batch * allocated_bytes_per_request,
        formula=_formula(layers, kv_heads, head_dim, dtype, block_size, data_bytes_per_token,
                         scale_bytes_per_page),
    )


_SIZE_HINTS = {
    "layers": "the model's num_hidden_layers",
    "kv_heads": "the model's num_key_value_heads",
    "head_dim": "the model's head_dim (hidden_size / num_attention_heads)",
    "tokens": "prompt plus generated tokens per request",
    "batch": "the number of concurrent requests",
    "block_size": "token slots per page, e.g. 16",
}


def _require_sizes(**sizes: int) -> None:
    """Each of ``sizes`` is a positive integer; the error says where the right value comes from."""
    for name, value in sizes.items():
        _require_positive(name, value, _SIZE_HINTS[name])


def _element_bytes(layers: int, kv_heads: int, head_dim: int, dtype: str) -> tuple[int, int]:
    """``(data bytes per token, scale bytes per page)`` of a model's K and V in ``dtype`` (canonical).

    Quantized pages carry one scale per layer, tensor (K, V) and KV head; unquantized pages none.
    """
    # A head vector is packed on its own (two int4 per byte), so an odd int4 head_dim rounds up.
    bytes_per_head_vector = math.ceil(head_dim * DTYPE_BITS[dtype] / 8)
    data_bytes_per_token = layers * kv_heads * KV_TENSORS_PER_LAYER * bytes_per_head_vector
    scale_bytes_per_page = 0
    if dtype in QUANTIZED_DTYPES:
        scale_bytes_per_page = layers * KV_TENSORS_PER_LAYER * kv_heads * SCALE_BYTES
    return data_bytes_per_token, scale_bytes_per_page


def quoted_example_note(estimate: KVSizeEstimate) -> str | None:
    """A correction when ``estimate`` is a widely quoted worked example, else ``None``.

    That example prices 32 layers x 32 KV heads x head_dim 128, FP16, 128 + 512 tokens at about 1.8 GB
    per request and 14 GB for a batch of 8; the true figures are 320 MiB and 2.5 GiB.
    """
    is_quoted_example = (
        (estimate.layers, estimate.kv_heads, estimate.head_dim, estimate.tokens) == (32, 32, 128, 640)
        and estimate.dtype in ("float16", "bfloat16")
    )
    if not is_quoted_example:
        return None
    return (
        "note: this example is often quoted at ~1.8 GB per request and 14 GB for "
        f"batch 8; it is {format_bytes(estimate.bytes_per_request)} and "
        f"{format_bytes(8 * estimate.bytes_per_request)}."
    )


def format_bytes(num_bytes: float | Fraction) -> str:
    """Formats a byte count with binary units: ``524288`` -> ``"512 KiB"``, at most 2 decimals."""
    value = float(num_bytes)
    unit_index = 0
    while abs(value) >= 1024 and unit_index < len(_BINARY_UNITS) - 1:
        value /= 1024
        unit_index += 1
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {_BINARY_UNITS[unit_index]}"


def format_exact_bytes(num_bytes: int | Fraction) -> str:
    """Formats an exact byte count with thousands separators (``"524,288"``; ``"11,542.5"``)."""
    value = _whole_or_float(Fraction(num_bytes))
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.4f}".rstrip("0").rstrip(".")


def _formula(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: str,
    block_size: int,
    data_bytes_per_token: int,
    scale_bytes_per_page: int,
) -> str:
    element_bytes = _whole_or_float(Fraction(DTYPE_BITS[dtype], 8))
    text = (
        f"{layers} layers x {kv_heads} KV heads x {head_dim} head_dim x 2 (K and V) x "
        f"{element_bytes} B ({dtype}) = {data_bytes_per_token:,} B per token"
    )
    if scale_bytes_per_page:
        text += (
            f" + scales: {layers} layers x {kv_heads} KV heads x 2 (K and V) x {SCALE_BYTES} B "
            f"(float16) = {scale_bytes_per_page:,} B per {block_size}-token page"
        )
    return text


def _require_positive(name: str, value: Any, meaning: str) -> None:
    # bool is an int subclass; True must not pass as "1 layer".
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        flag = "--" + name.replace("_", "-")
        raise GrowPageError(
            f"{name} must be a positive whole number, got {value!r}; set {flag} to {meaning}"
        )


def _did_you_mean(name: str, choices: Any) -> str:
    matches = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def _whole_or_float(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)
