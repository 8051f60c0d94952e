"""The shape of a Llama-family model, read from a Hugging Face folder's JSON, and its RoPE frequencies.

Read by hand (no ``transformers.AutoConfig``) so serving needs neither transformers nor its config
migrations; both the 4.x layout (``rope_theta``, ``rope_scaling``) and the 5.x one
(``rope_parameters``) are understood.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from growpage.engine.model_folder import read_config
from growpage.errors import GrowPageError

_DEFAULT_ROPE_THETA = 10_000.0


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Context extension of RoPE: ``linear`` (divide frequencies by ``factor``) or ``llama3``.

    ``llama3`` leaves high frequencies alone, divides low ones by ``factor`` and blends in between
    (Llama 3.1 report, §3.4; the same formula as transformers' ``_compute_llama3_parameters``).
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise GrowPageError(f"RoPE scaling {self.rope_type!r} is not supported (only linear and llama3); "
                                "choose another model with --model")
        if self.factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise GrowPageError(f"invalid rope scaling {self}: need factor > 0 and high_freq_factor > low_freq_factor")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """What :class:`~growpage.engine.llama.LlamaModel` needs to know about a checkpoint.

    Attributes:
        num_layers: decoder layers.
        hidden_size: width of the residual stream.
        intermediate_size: width of the SwiGLU MLP.
        num_q_heads: query heads per layer.
        num_kv_heads: key/value heads per layer (GQA: ``num_q_heads`` is a multiple of it).
        head_dim: channels per head.
        vocab_size: rows of the embedding and of the logits.
        rope_theta: RoPE base wavelength.
        rope_scaling: context extension, or None for plain RoPE.
        rms_norm_eps: added to the mean square before the reciprocal square root.
        max_position_embeddings: longest context (tokens) the model was trained for.
        tie_word_embeddings: the LM head reuses the embedding matrix.
        eos_token_ids: every token that ends generation (config.json and generation_config.json).
        bos_token_id: the beginning-of-sequence token, if any.
    """

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float = _DEFAULT_ROPE_THETA
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_q_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise GrowPageError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_q_heads % self.num_kv_heads:
            raise GrowPageError(f"model config: {self.num_q_heads} query heads are not a multiple of "
                                f"{self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise GrowPageError(f"model config: RoPE needs an even head_dim, got {self.head_dim}")

    @classmethod
    def from_folder(cls, folder: Path) -> LlamaConfig:
        """Reads ``config.json`` (and ``generation_config.json`` for extra EOS tokens)."""
        raw = read_config(folder)
        if raw.get("hidden_act", "silu") != "silu" or raw.get("attention_bias") or raw.get("mlp_bias"):
            raise GrowPageError(f"{folder}: only SiLU MLPs without biases are supported (Llama-family)")
        num_q_heads = int(raw["num_attention_heads"])
        rope = raw.get("rope_parameters") or {}
        scaling = raw.get("rope_scaling") or rope
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        generation_path = folder / "generation_config.json"
        generation = json.loads(generation_path.read_text(encoding="utf-8")) if generation_path.is_file() else {}
        return cls(
            num_layers=int(raw["num_hidden_layers"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_q_heads=num_q_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_q_heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // num_q_heads),
            vocab_size=int(raw["vocab_size"]),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", _DEFAULT_ROPE_THETA))),
            rope_scaling=None if rope_type == "default" else RopeScaling(
                rope_type=rope_type,
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
                high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
                original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=_token_ids(raw.get("eos_token_id"), generation.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id", generation.get("bos_token_id")),
        )


def rope_inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    """RoPE's angular frequency per channel pair, in radians per position.

    Computed exactly as transformers does (float32, same operation order) so that positions encode
    bit-identically and greedy outputs can be compared token for token.

    Returns:
        ``[head_dim // 2]`` float32.
    """
    dim = config.head_dim
    inverse_frequencies = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inverse_frequencies
    if scaling.rope_type == "linear":
        return inverse_frequencies / scaling.factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelength = old_context / scaling.low_freq_factor
    high_freq_wavelength = old_context / scaling.high_freq_factor
    wavelength = 2 * math.pi / inverse_frequencies
    scaled = torch.where(wavelength > low_freq_wavelength, inverse_frequencies / scaling.factor, inverse_frequencies)
    smooth = (old_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) * ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled)


def _token_ids(*values: object) -> tuple[int, ...]:
    ids: list[int] = []
    for value in values:
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
