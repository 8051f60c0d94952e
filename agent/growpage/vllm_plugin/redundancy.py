"""R-KV's redundancy term: among a request's generated tokens, a key much like others is worth less.

R-KV (Cai et al., 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models") notes
that a reasoning trace repeats itself (restated steps, the same phrase again), so an eviction that
ranks by attention alone spends its budget on copies. It scores each candidate token ``j`` by

    Z_j = lambda * I_j - (1 - lambda) * R_j,

with ``I`` the attention importance (a distribution over the candidates) and ``R`` the redundancy:
per head, the cosine similarity ``S_ij`` of every pair of keys, the diagonal left out and, in each
row ``i``, the newest key more similar than :data:`SIMILARITY_THRESHOLD` not counted (so the newest
copy of a repeated phrase keeps its place); ``R_j = softmax_j(mean_i S_ij)``. R-KV uses ``lambda``
0.07-0.1 (``weight = 1 - lambda`` here).

Here the term applies to *generated* tokens only (the candidates of a compaction past the prompt;
the prompt keeps GrowPage's prompt-anchored ranking), and :func:`mix_redundancy` rescales the mixed
scores so the candidates keep their total attention mass: their order among themselves is R-KV's,
their weight against the prompt's tokens is unchanged. Keys are the observed layers' (their mean
similarity), with RoPE applied as the cache holds them, as R-KV reads them.

Pure torch; the similarity is computed a block of rows at a time (each row's corrections are its
own), so the transient memory stays under ``cap_bytes`` whatever the trace length.
"""

from __future__ import annotations

import torch

SIMILARITY_THRESHOLD = 0.5  # R-KV's: keys more similar than this are copies of each other
DEFAULT_CAP_BYTES = 64 * 2 ** 20
FLOAT_BYTES = 4


def key_redundancy(keys: torch.Tensor, threshold: float = SIMILARITY_THRESHOLD,
                   cap_bytes: int = DEFAULT_CAP_BYTES) -> torch.Tensor:
    """R-KV's redundancy of each key (see the module docstring).

    Args:
        keys: ``[L, H, D, head_dim]`` the candidates' keys in ``L`` layers and ``H`` heads.
        threshold: similarity above which two keys count as copies.
        cap_bytes: transient bytes of one block of similarity rows (at least one row is computed).

    Returns:
        ``[H, D]`` float32, each row a distribution over the ``D`` candidates (higher: more redundant).
    """
    num_layers, num_heads, count, _ = keys.shape
    normed = keys.float() / keys.float().norm(dim=-1, keepdim=True).clamp(min=1e-8)
    column_sums = torch.zeros(num_heads, count, device=keys.device)
    rows_per_block = max(1, cap_bytes // (3 * FLOAT_BYTES * num_heads * max(count, 1)))
    columns = torch.arange(count, device=keys.device)
    for layer in range(num_layers):
        for first in range(0, count, rows_per_block):
            rows = columns[first:first + rows_per_block]
            similarity = normed[layer, :, rows] @ normed[layer].transpose(-1, -2)  # [H, r, D]
            mine = rows[None, :, None] == columns[None, None, :]
            similar = (similarity > threshold) & ~mine
            newest = torch.where(similar, columns, -1).amax(-1, keepdim=True)  # [H, r, 1], -1: none
            similarity = similarity.masked_fill(mine | (columns == newest), 0.0)
            column_sums += similarity.sum(1)
    return (column_sums / (num_layers * max(count, 1))).softmax(-1)


def mix_redundancy(importance: torch.Tensor, redundancy: torch.Tensor, weight: float) -> torch.Tensor:
    """R-KV's mixed scores of one head's (or request's) candidates, with their total mass kept.

    ``importance - weight / (1 - weight) * (R - 1/D)`` in units of the candidates' mean-free
    distribution, scaled back by their total mass ``m``: ordered as R-KV's ``Z`` (an increasing
    affine map of it), summing to ``m`` as ``importance`` does.

    Args:
        importance: ``[D]`` the candidates' ranking scores (attention mass, >= 0).
        redundancy: ``[D]`` from :func:`key_redundancy` (a distribution).
        weight: R-KV's ``1 - lambda``, in ``[0, 1)``; 0 returns ``importance`` unchanged.
    """
    count = importance.numel()
    if weight <= 0.0 or count < 2:
        return importance
    mass = float(importance.sum())
    if mass <= 0.0:  # nothing observed among them: redundancy alone orders them
        return -redundancy
    share = importance.float() / mass
    return mass * (share - weight / (1.0 - weight) * (redundancy - 1.0 / count))
