"""A plain PyTorch Llama-family decoder whose attention is supplied by the caller.

The model owns everything but attention: embeddings, RMSNorm, RoPE, the Q/K/V/O projections, the
SwiGLU MLP and the LM head. Each layer hands its RoPE'd queries and keys, and its values, to an
``attend`` callback, so the engine can store K/V in GrowPage's paged pool (and observe, grow or
compress it) without this file knowing about pages. Tokens of many requests are flattened into one
``[N]`` row axis; which rows see which keys is the callback's business.

Numerics follow transformers' ``LlamaForCausalLM`` operation for operation (RMSNorm in float32,
RoPE by ``rotate_half``, logits by ``F.linear``) so the reference engine can be checked token for token
against it. Q/K/V and gate/up are fused into one matmul each at load time (two GEMMs per layer instead
of five); every output is still the same dot product, and on CPU the results match transformers' separate
projections bit for bit. NOTE: only for the same number of rows: MKL picks GEMM kernels by shape, so
the same token in a batch of another size can differ in the last bits of float32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from growpage.engine.llama_config import LlamaConfig, rope_inverse_frequencies
from growpage.engine.llama_weights import load_fused_state_dict
from growpage.engine.model_folder import weight_files
from growpage.errors import GrowPageError

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``attend(layer, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]``; q and k carry RoPE."""


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain; statistics in float32 whatever the weight dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden] -> [N, hidden]`` in the input dtype."""
        input_dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden.to(input_dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates channel pairs ``(i, i + D/2)`` of every head by its position's angle.

    Args:
        x: ``[N, heads, D]``.
        cos, sin: ``[N, D]``, the angles duplicated over both halves.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class DecoderLayer(nn.Module):
    """Pre-norm attention block then pre-norm SwiGLU block, each added to the residual stream."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        q_width, kv_width = config.num_q_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.qkv_proj = nn.Linear(config.hidden_size, q_width + 2 * kv_width, bias=False)
        self.o_proj = nn.Linear(q_width, config.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``[N, hidden] -> [N, hidden]``; ``attend(q, k, v)`` is this layer's attention."""
        config = self.config
        num_rows, q_width = hidden.shape[0], config.num_q_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim
        qkv = self.qkv_proj(self.input_layernorm(hidden))
        q = qkv[:, :q_width].view(num_rows, config.num_q_heads, config.head_dim)
        k = qkv[:, q_width:q_width + kv_width].view(num_rows, config.num_kv_heads, config.head_dim)
        v = qkv[:, q_width + kv_width:].view(num_rows, config.num_kv_heads, config.head_dim)
        attended = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.contiguous())
        hidden = hidden + self.o_proj(attended.reshape(num_rows, q_width))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(hidden)).chunk(2, dim=-1)
        return hidden + self.down_proj(F.silu(gate) * up)


class LlamaModel(nn.Module):
    """Llama-family causal LM over flattened token rows, with attention delegated to a callback."""

    rope_inverse_frequencies: torch.Tensor  # a non-persistent buffer: follows .to(device), never saved

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("rope_inverse_frequencies", rope_inverse_frequencies(config), persistent=False)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> LlamaModel:
        """Loads a Hugging Face Llama-family folder's weights directly (no transformers at run time).

        Args:
            folder: holds ``config.json`` and ``*.safetensors`` (or ``pytorch_model*.bin``) weights.
            dtype: parameter dtype; float32 reproduces transformers on CPU exactly.
            device: where the parameters live.

        Raises:
            GrowPageError: the folder's config or weights don't describe a supported model.
        """
        folder = Path(folder)
        config = LlamaConfig.from_folder(folder)
        files = weight_files(folder)
        if not files:
            raise GrowPageError(f"{folder} has no weights. Run `gpctl model prepare`, or pass a complete folder.")
        with torch.device("meta"):  # no throwaway random init: loading assigns the real tensors
            model = cls(config)
        state = load_fused_state_dict(files, config, dtype=dtype, device=device)
        model.load_state_dict(state, strict=True, assign=True)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight  # assign=True replaced the shared Parameter
        model.rope_inverse_frequencies = rope_inverse_frequencies(config).to(device)
        return model.eval().requires_grad_(False)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn,
                logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Runs every layer over ``N`` token rows and returns logits for the rows asked for.

        Args:
            token_ids: ``[N]`` long, tokens of one or many requests, flattened.
            positions: ``[N]`` long, each token's position within its own request (drives RoPE).
            attend: per layer, ``(layer, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]``.
                q and k already carry RoPE; the callback stores k/v as it likes and applies the
                causal (and per-request) visibility. It must return the model's dtype.
            logits_rows: ``[M]`` long indices into the N rows (e.g. each request's last token), or
                None for all rows.

        Returns:
            ``[M, vocab_size]`` float32 logits.
        """
        hidden = self.embed_tokens(token_ids)
        # Angles in float32 exactly as transformers forms them: position × frequency, per element.
        angles = positions[:, None].float() * self.rope_inverse_frequencies[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(hidden.dtype), angles.sin().to(hidden.dtype)
        for layer_index, layer in enumerate(self.layers):
            hidden = layer(hidden, cos, sin,
                           lambda q, k, v, layer_index=layer_index: attend(layer_index, q, k, v))
        if logits_rows is not None:
            hidden = hidden[logits_rows]
        return self.lm_head(self.norm(hidden)).float()
