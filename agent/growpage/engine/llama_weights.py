"""Reads a Hugging Face Llama checkpoint into :class:`~growpage.engine.llama.LlamaModel`'s fused layout.

Hugging Face stores ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` separately; the
model multiplies by their row-wise concatenations (``qkv_proj``, ``gate_up_proj``), so a layer runs
two GEMMs where transformers runs five.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from growpage.engine.llama_config import LlamaConfig
from growpage.errors import GrowPageError

# Old checkpoints saved RoPE's frequency table; it is derived from the config, never loaded.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_FUSED_PARTS = {
    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_RENAMED_PARTS = {
    "o_proj": "self_attn.o_proj",
    "down_proj": "mlp.down_proj",
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attention_layernorm",
}


def load_fused_state_dict(files: list[Path], config: LlamaConfig, dtype: torch.dtype,
                          device: str | torch.device) -> dict[str, torch.Tensor]:
    """The model's state dict, from checkpoint files, cast to ``dtype`` on ``device``.

    Raises:
        GrowPageError: a tensor is missing, unexpected, or of the wrong shape for ``config``.
    """
    source = _read_all(files)
    state: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        try:
            return source.pop(name)
        except KeyError:
            raise GrowPageError(f"checkpoint {files[0].parent} lacks {name}; the folder is incomplete or "
                                "not Llama-family. Run `gpctl model prepare --force`.") from None

    state["embed_tokens.weight"] = take("model.embed_tokens.weight")
    state["norm.weight"] = take("model.norm.weight")
    if config.tie_word_embeddings:
        source.pop("lm_head.weight", None)  # some tied checkpoints store a copy anyway
        state["lm_head.weight"] = state["embed_tokens.weight"]
    else:
        state["lm_head.weight"] = take("lm_head.weight")
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}."
        for fused, parts in _FUSED_PARTS.items():
            state[f"layers.{layer}.{fused}.weight"] = torch.cat([take(f"{prefix}{part}.weight") for part in parts])
        for ours, theirs in _RENAMED_PARTS.items():
            state[f"layers.{layer}.{ours}.weight"] = take(f"{prefix}{theirs}.weight")
    unexpected = sorted(name for name in source if not _IGNORED.fullmatch(name))
    if unexpected:
        raise GrowPageError(f"checkpoint {files[0].parent} has tensors a Llama model doesn't use "
                            f"({', '.join(unexpected[:3])}, ...); it is not a plain Llama-family model")
    _check_shapes(state, config)
    return {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}


def _read_all(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        if path.suffix == ".safetensors":
            # deferred: safetensors is the engine extra's; only a .safetensors folder needs it
            from safetensors.torch import load_file

            tensors.update(load_file(path, device="cpu"))
        else:
            tensors.update(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    return tensors


def _check_shapes(state: dict[str, torch.Tensor], config: LlamaConfig) -> None:
    q_width, kv_width = config.num_q_heads * config.head_dim, config.num_kv_heads * config.head_dim
    expected = {
        "embed_tokens.weight": (config.vocab_size, config.hidden_size),
        "lm_head.weight": (config.vocab_size, config.hidden_size),
        "norm.weight": (config.hidden_size,),
        "layers.0.qkv_proj.weight": (q_width + 2 * kv_width, config.hidden_size),
        "layers.0.o_proj.weight": (config.hidden_size, q_width),
        "layers.0.gate_up_proj.weight": (2 * config.intermediate_size, config.hidden_size),
        "layers.0.down_proj.weight": (config.hidden_size, config.intermediate_size),
    }
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise GrowPageError(f"checkpoint tensor {name} has shape {tuple(state[name].shape)}, config.json "
                                f"implies {shape}; config and weights don't belong together")
