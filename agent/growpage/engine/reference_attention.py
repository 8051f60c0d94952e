"""Dense, contiguous attention for one sequence: the yardstick paged attention is checked against.

:class:`DenseKVCache` appends each step's keys and values per layer and attends with
``scaled_dot_product_attention`` the way transformers' SDPA path does (``enable_gqa``; ``is_causal``
for a first prefill, no mask for one query), so :func:`generate_greedy` reproduces
``LlamaForCausalLM.generate(do_sample=False)`` token for token. It is a test and debugging aid: memory
grows with every token and every step concatenates the whole cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from growpage.engine.llama import AttendFn, LlamaModel


class DenseKVCache:
    """Per-layer ``[Hkv, T, D]`` keys and values of a single sequence; ``attend`` is the model callback."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def num_tokens(self) -> int:
        """Tokens cached so far (layer 0's count; every layer holds the same after a forward)."""
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Appends ``k``/``v`` and attends the new rows to every cached token at or before them.

        Args:
            layer: decoder layer index.
            q: ``[N, Hq, D]`` queries of the N newest tokens, RoPE applied.
            k, v: ``[N, Hkv, D]`` their keys (RoPE applied) and values.

        Returns:
            ``[N, Hq, D]``.
        """
        num_new = q.shape[0]
        past_keys, past_values = self.keys[layer], self.values[layer]
        keys, values = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, N, D]
        if past_keys is not None and past_values is not None:  # set together, per layer
            keys, values = torch.cat((past_keys, keys), dim=1), torch.cat((past_values, values), dim=1)
        self.keys[layer], self.values[layer] = keys, values
        num_past = keys.shape[1] - num_new
        mask = None
        if num_new > 1 and num_past > 0:  # a chunk after cached tokens: causal, offset by the past
            mask = torch.ones(num_new, keys.shape[1], dtype=torch.bool, device=q.device).tril(num_past)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask,
            is_causal=num_new > 1 and num_past == 0, enable_gqa=True)
        return out[0].transpose(0, 1)


def attend_per_request(caches: list[DenseKVCache], rows_per_request: list[int]) -> AttendFn:
    """A model callback for flattened rows: request ``i``'s next ``rows_per_request[i]`` rows use ``caches[i]``."""
    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        parts = zip(caches, q.split(rows_per_request), k.split(rows_per_request), v.split(rows_per_request),
                    strict=True)
        return torch.cat([cache.attend(layer, *qkv) for cache, *qkv in parts])
    return attend


def generate_greedy(model: LlamaModel, prompts: list[list[int]], max_new_tokens: int,
                    stop_token_ids: tuple[int, ...] | None = None) -> list[list[int]]:
    """Greedy decoding of several prompts, flattened into one forward per step: the reference output.

    Each request has its own :class:`DenseKVCache`; a request leaves the batch when it stops.

    Args:
        model: the model to run.
        prompts: token ids per request (already chat-templated).
        max_new_tokens: most tokens to generate per request.
        stop_token_ids: end a request on any of these (kept in its output, as transformers does);
            default ``model.config.eos_token_ids``.

    Returns:
        Per request, the generated token ids without the prompt.
    """
    stop = set(model.config.eos_token_ids if stop_token_ids is None else stop_token_ids)
    caches = [DenseKVCache(model.config.num_layers) for _ in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    pending = {request: list(prompt) for request, prompt in enumerate(prompts) if max_new_tokens > 0}
    while pending:
        requests = list(pending)
        rows_per_request = [len(pending[request]) for request in requests]
        token_ids = torch.tensor([token for request in requests for token in pending[request]])
        positions = torch.cat([torch.arange(caches[request].num_tokens, caches[request].num_tokens + num_rows)
                               for request, num_rows in zip(requests, rows_per_request, strict=True)])
        last_rows = torch.tensor(rows_per_request).cumsum(0) - 1
        logits = model(token_ids, positions, attend_per_request([caches[r] for r in requests], rows_per_request),
                       logits_rows=last_rows)
        for request, next_token in zip(requests, logits.argmax(-1).tolist(), strict=True):
            outputs[request].append(next_token)
            if next_token in stop or len(outputs[request]) >= max_new_tokens:
                del pending[request]
            else:
                pending[request] = [next_token]
    return outputs
