"""The observer's and the compactor's cost at a serving geometry, before and after chunked scoring.

One observed step scores, for every observed request, the newest query of ``observed_heads``
sampled heads in each of ``observed_layers`` layers against all of the request's keys in the paged
cache (:func:`growpage.vllm_plugin.scoring.score_step`). This module times that step and measures
its transient memory on a synthetic cache laid out as vLLM lays it out
(:mod:`growpage.tooling.synthetic`), for:

- ``after``: what the observer runs (sampled keys only, chunks under a byte cap);
- ``before``: the previous path, kept here as the reference: every needed block copied whole (K
  and V of every head), the sampled keys picked out of the copies, all requests and layers upcast
  to float32 at once, one softmax.

Peak transient memory is ``torch.cuda.max_memory_allocated`` above the memory held before the step
on CUDA (``measured``). On CPU it is computed from the tensors each path holds at once
(``analytic``: :func:`before_bytes`, :func:`growpage.vllm_plugin.scoring.chunk_bytes`), and a
size whose analytic ``before`` peak exceeds ``max_bytes`` is not run (reported as skipped).

Only the observed layers' caches are allocated (the step reads no other layer), and where the
requests' blocks would not fit in ``pool_bytes`` they share a pool of physical blocks (each request
its own random rows into it): the gathers and transients are the same as with distinct blocks.

Imports torch and GrowPage's torch-only modules only (``keys``, ``scoring``, ``synthetic``), so the
torch-only GPU checks run it without vLLM or GrowPage's other dependencies.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from growpage.tooling.synthetic import flash_write, layer_caches
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin import scoring

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class ObservationGeometry:
    """A model's attention geometry and what the plugin observes of it (its defaults: 3 observed
    layers, 4 sampled query heads). The default is an 8B model (Llama-3-8B-like)."""

    num_layers: int = 32
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    observed_layers: int = 3
    observed_heads: int = 4
    dtype: torch.dtype = torch.bfloat16
    layout: str = "LBNHC"

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def sampled_kv_heads(self) -> torch.Tensor:
        """``[H]`` the KV head each sampled query head reads (the observer's even spacing)."""
        count = min(self.observed_heads, self.num_q_heads)
        heads = torch.tensor(sorted({i * self.num_q_heads // count for i in range(count)}), dtype=torch.long)
        return heads // max(1, self.num_q_heads // self.num_kv_heads)

    def kv_bytes(self, tokens: int, layers: int | None = None) -> int:
        """K and V bytes of ``tokens`` tokens in ``layers`` layers (all by default)."""
        layers = self.num_layers if layers is None else layers
        return tokens * layers * 2 * self.num_kv_heads * self.head_dim * self.element_bytes


def whole_block_scores(layers: Sequence[scoring.ObservedLayer], block_rows: torch.Tensor, lengths: Sequence[int],
                       layout: kv_keys.BlockLayout, summarize: scoring.Summarize) -> tuple[torch.Tensor, ...]:
    """The previous observation path (reference for ``before``): ``(entropy [L, R], bin_mass [L, R, B],
    token_mass [R, max_len])``."""
    device = layers[0].cache.device
    max_len = max(lengths)
    span = int(layout.key_index.max()) + 1
    index = layout.key_index.index_select(0, layers[0].kv_heads.to(device))  # [H, bs, hd]
    rows = block_rows.long().clamp(0, layers[0].cache.shape[0] - 1)
    num_requests, num_blocks = rows.shape
    picked = []
    for layer in layers:
        cache = layer.cache
        windows = torch.as_strided(kv_keys.storage_of(cache), (cache.shape[0], span), (layout.block_stride, 1),
                                   cache.storage_offset())
        picked.append(windows.index_select(0, rows.reshape(-1))[:, index])  # whole blocks, then the keys
    stacked = torch.stack(picked).view(len(layers), num_requests, num_blocks, *index.shape)
    heads, block_size, head_dim = index.shape
    keys = stacked.permute(0, 1, 3, 2, 4, 5).reshape(len(layers), num_requests, heads, num_blocks * block_size,
                                                     head_dim)
    del picked, stacked
    k = keys[:, :, :, :max_len].float()
    del keys
    q = torch.stack([layer.query for layer in layers]).float()
    scales = torch.tensor([layer.scale for layer in layers], device=device).view(-1, 1, 1, 1)
    lengths_t = torch.tensor(list(lengths), device=device)
    positions = torch.arange(max_len, device=device).expand(num_requests, max_len)
    valid = positions < lengths_t[:, None]
    logits = torch.einsum("lrhd,lrhkd->lrhk", q, k) * scales
    probs = torch.softmax(logits.masked_fill(~valid[None, :, None, :], float("-inf")), dim=-1)
    token_mass = probs.mean(2).sum(0)
    bins, entropy = summarize(probs.flatten(0, 1), positions.masked_fill(~valid, -1).repeat(len(layers), 1),
                              lengths_t.repeat(len(layers)))
    return entropy.view(len(layers), -1), bins.view(len(layers), num_requests, -1), token_mass


def before_bytes(geometry: ObservationGeometry, layout: kv_keys.BlockLayout, requests: int, tokens: int) -> int:
    """Peak transient bytes of :func:`whole_block_scores` (the largest set of tensors alive at once).

    ``Ks`` sampled keys (``L * R * H * tokens * head_dim``) and ``W`` one layer's whole-block copy:
    gathering holds ``Ks`` keys plus ``W``; stacking and reshaping ``3 Ks`` keys; upcasting ``Ks``
    keys plus ``Ks`` floats; scoring ``Ks`` floats plus four float copies of the probabilities.
    """
    element = geometry.element_bytes
    heads = len(geometry.sampled_kv_heads())
    blocks = -(-tokens // geometry.block_size)  # per request
    sampled = geometry.observed_layers * requests * heads * blocks * geometry.block_size * geometry.head_dim
    whole = requests * blocks * (int(layout.key_index.max()) + 1) * element
    probs = geometry.observed_layers * requests * heads * tokens * scoring.FLOAT_BYTES
    return max(sampled * element + whole, 3 * sampled * element, sampled * (element + scoring.FLOAT_BYTES),
               sampled * scoring.FLOAT_BYTES + 4 * probs)


def entropy_and_bins(num_bins: int) -> scoring.Summarize:
    """A stand-in for :func:`growpage.core.summaries.summarize_attention` with the same tensor work
    (for callers that import torch only); its results are compared, never used."""

    def summarize(probs: torch.Tensor, key_positions: torch.Tensor,
                  lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        token_mass = probs.mean(dim=1)
        valid = key_positions >= 0
        bins = (key_positions.clamp_min(0) * num_bins // lengths.clamp_min(1)[:, None]).clamp_(0, num_bins - 1)
        bin_mass = torch.zeros(probs.shape[0], num_bins, device=probs.device)
        bin_mass.scatter_add_(1, bins, torch.where(valid, token_mass, torch.zeros_like(token_mass)))
        entropy = -(probs * torch.log(probs.clamp_min(1e-12))).sum(-1).mean(-1)
        return bin_mass, entropy

    return summarize


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``, the device drained around each."""
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _timed(fn: Callable[[], object], repeats: int, device: torch.device) -> tuple[float, int | None]:
    """Median seconds of ``fn`` and, on CUDA, its peak bytes above what was allocated before."""
    fn()  # warm-up (allocator, kernels)
    peak = None
    if device.type == "cuda":
        _sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    return median_time(fn, repeats, device), peak


def _synthetic_step(geometry: ObservationGeometry, requests: int, tokens: int, device: torch.device,
                    pool_bytes: int, generator: torch.Generator
                    ) -> tuple[list[scoring.ObservedLayer], torch.Tensor, kv_keys.BlockLayout, bool]:
    """The observed layers (caches filled with random keys, queries), each request's block row, the
    probed layout, and whether the pool had to be smaller than every request at once."""
    blocks_per_request = -(-tokens // geometry.block_size)
    wanted = requests * blocks_per_request
    per_block = geometry.kv_bytes(geometry.block_size, geometry.observed_layers)
    pool = max(blocks_per_request, min(wanted, pool_bytes // per_block))
    caches = layer_caches(geometry.layout, geometry.observed_layers, pool, geometry.num_kv_heads,
                          geometry.block_size, geometry.head_dim, geometry.dtype, device)
    for cache in caches:  # random K and V (the fill order of the storage does not matter)
        kv_keys.storage_of(cache).normal_(generator=generator)
    rows = torch.stack([torch.randperm(pool, generator=generator, device=device)[:blocks_per_request]
                        for _ in range(requests)])
    probe = layer_caches(geometry.layout, 1, 2, geometry.num_kv_heads, geometry.block_size, geometry.head_dim,
                         geometry.dtype, device)[0]
    layout = kv_keys.probe_layout(flash_write, probe, geometry.num_kv_heads, geometry.block_size, geometry.head_dim)
    assert layout is not None
    kv_heads = geometry.sampled_kv_heads()
    layers = [scoring.ObservedLayer(cache, torch.randn(requests, len(kv_heads), geometry.head_dim, device=device,
                                                       generator=generator).to(geometry.dtype),
                                    geometry.head_dim ** -0.5, kv_heads) for cache in caches]
    return layers, rows, layout, pool < wanted


def measure_observation(geometry: ObservationGeometry, requests: int, tokens: int, *, device: str = "cpu",
                        cap_bytes: int = scoring.DEFAULT_CAP_BYTES, max_bytes: int = 3 * GIB,
                        pool_bytes: int = 2 * GIB, repeats: int = 3, num_bins: int = 8,
                        summarize: scoring.Summarize | None = None, seed: int = 0) -> dict:
    """One observed step at ``requests`` x ``tokens``, before and after (see the module docstring).

    Returns:
        JSON-ready: ms per observed step and peak transient bytes (``memory``: measured or
        analytic) for both paths, the chunks ``after`` took, and whether ``before`` was skipped.
    """
    torch_device = torch.device(device)
    generator = torch.Generator(device=torch_device).manual_seed(seed)
    layers, rows, layout, shared = _synthetic_step(geometry, requests, tokens, torch_device, pool_bytes, generator)
    lengths = [tokens] * requests
    summarize = summarize or entropy_and_bins(num_bins)

    def after():
        return scoring.score_step(layers, rows, lengths, layout, cap_bytes=cap_bytes, summarize=summarize,
                                  token_mass=True)

    after_s, after_peak = _timed(after, repeats, torch_device)
    scores = after()
    analytic_before = before_bytes(geometry, layout, requests, tokens)
    result = {
        "requests": requests, "tokens": tokens, "layout": geometry.layout,
        "observed_layers": geometry.observed_layers, "sampled_heads": len(geometry.sampled_kv_heads()),
        "blocks_shared": shared,
        "memory": "measured" if after_peak is not None else "analytic",
        "cap_bytes": cap_bytes, "after_chunks": scores.chunks,
        "after_ms": round(after_s * 1e3, 2),
        "after_peak_bytes": after_peak if after_peak is not None else scores.planned_bytes,
        "after_planned_bytes": scores.planned_bytes,
        "before_analytic_bytes": analytic_before,
    }
    if analytic_before > max_bytes:
        result.update(before_ms=None, before_peak_bytes=analytic_before,
                      before_skipped=f"analytic peak {analytic_before / GIB:.1f} GiB > max_bytes "
                                     f"{max_bytes / GIB:.1f} GiB")
        return result
    before_s, before_peak = _timed(lambda: whole_block_scores(layers, rows, lengths, layout, summarize),
                                   repeats, torch_device)
    reference = whole_block_scores(layers, rows, lengths, layout, summarize)
    assert scores.entropy is not None and scores.token_mass is not None
    result.update(before_ms=round(before_s * 1e3, 2),
                  before_peak_bytes=before_peak if before_peak is not None else analytic_before,
                  max_abs_diff_token_mass=float((scores.token_mass - reference[2]).abs().max()),
                  max_abs_diff_entropy=float((scores.entropy - reference[0]).abs().max()))
    return result


def measure_compaction(geometry: ObservationGeometry, tokens: int, *, device: str = "cpu", repeats: int = 3,
                       max_bytes: int = 3 * GIB, seed: int = 0) -> dict:
    """One request's compaction: keep every other token of ``tokens``, moving K and V of the
    survivors to the front in every layer (:func:`growpage.vllm_plugin.keys.move_tokens_in_layers`).

    Returns:
        JSON-ready: ms per compaction, bytes moved, and its transient bytes (analytic: the gathered
        tokens, plus two long offsets per moved element where the layout has no strided view);
        not run when the cache plus that transient would exceed ``max_bytes``.
    """
    torch_device = torch.device(device)
    probe = layer_caches(geometry.layout, 1, 2, geometry.num_kv_heads, geometry.block_size, geometry.head_dim,
                         geometry.dtype, torch_device)[0]
    layout = kv_keys.probe_layout(flash_write, probe, geometry.num_kv_heads, geometry.block_size, geometry.head_dim)
    assert layout is not None
    moved_elements = geometry.num_layers * ((tokens + 1) // 2) * 2 * geometry.num_kv_heads * geometry.head_dim
    strided = layout.key_tiles is not None and layout.value_tiles is not None
    analytic = moved_elements * (geometry.element_bytes + (0 if strided else 2 * 8))
    result = {"tokens": tokens, "tokens_moved": (tokens + 1) // 2, "layers": geometry.num_layers,
              "bytes_moved": moved_elements * geometry.element_bytes, "analytic_peak_bytes": analytic}
    if analytic + geometry.kv_bytes(tokens) > max_bytes:
        return {**result, "ms": None, "memory": "analytic", "peak_bytes": analytic,
                "skipped": f"cache and transient {(analytic + geometry.kv_bytes(tokens)) / GIB:.1f} GiB > max_bytes"}
    blocks = -(-tokens // geometry.block_size)
    caches = layer_caches(geometry.layout, geometry.num_layers, blocks, geometry.num_kv_heads, geometry.block_size,
                          geometry.head_dim, geometry.dtype, torch_device)
    kv_keys.storage_of(caches[0]).normal_(generator=torch.Generator(device=torch_device).manual_seed(seed))
    slots = torch.arange(tokens, device=torch_device)
    src, dst = slots[::2], slots[:(tokens + 1) // 2]
    moved = [0]

    def compact():
        moved[0] = kv_keys.move_tokens_in_layers(caches, src, dst, layout)

    seconds, peak = _timed(compact, repeats, torch_device)
    assert moved[0] == result["bytes_moved"]
    return {**result, "ms": round(seconds * 1e3, 2), "memory": "measured" if peak is not None else "analytic",
            "peak_bytes": peak if peak is not None else analytic}
