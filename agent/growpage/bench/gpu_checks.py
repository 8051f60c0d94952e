"""Checks of GrowPage's paged-cache code on a device, with torch alone (no vLLM, nothing downloaded).

For every ``KVCacheLayout`` the CUDA backends use (:mod:`~growpage.tooling.synthetic`) in
float16 and bfloat16, on the chosen device:

- ``probe``: the layout is learned from the backends' store (:func:`~.synthetic.flash_write`);
- ``read``: keys read through it equal a dense copy of what was written;
- ``move``: moving K and V of some tokens in every layer at once lands them where a dense copy
  says, and writes nothing else;
- ``move_per_head``: the same with each KV head moving its own tokens (per-head keep sets);
- ``scoring``: the chunked scores (:func:`~growpage.vllm_plugin.scoring.score_step`) equal dense
  softmax attention, with a cap so small every request and block is its own chunk and with one
  chunk, per request and per KV head;
- ``redundancy``: R-KV's key redundancy (:mod:`~growpage.vllm_plugin.redundancy`) on the device
  equals the CPU's, read from the cache.

Then the observation and compaction cost at an 8B geometry (:mod:`growpage.bench.observation`):
milliseconds and peak memory, before and after chunked scoring. Run it through
``scripts/gpu-torch-checks.sh`` (or ``python scripts/gpu_torch_checks.py``), which imports only this
module's torch-only dependencies; ``--device cpu --quick`` is the suite's smoke run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from growpage.bench import observation
from growpage.tooling.synthetic import LAYOUT_ORDERS, flash_write, layer_caches
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin import scoring
from growpage.vllm_plugin.redundancy import key_redundancy

# modules a torch-only machine lacks; none may be imported by these checks
FORBIDDEN_MODULES = ("vllm", "yaml", "typer", "prometheus_client", "fastapi", "transformers")
FULL_SIZES = ((16, 2048), (16, 8192), (128, 2048), (128, 8192))
QUICK_SIZES = ((4, 64), (8, 200))
QUICK_GEOMETRY = observation.ObservationGeometry(num_layers=4, num_q_heads=8, num_kv_heads=4, head_dim=32)
CHECKS = ("probe", "read", "scoring", "move", "move_per_head", "redundancy")


def _request_caches(layout_name: str, dtype: torch.dtype, device: torch.device, lengths: list[int],
                    layers: int = 3, heads: int = 3, block_size: int = 16,
                    head_dim: int = 64) -> tuple[list[torch.Tensor], torch.Tensor, list[list[torch.Tensor]],
                                                 list[list[torch.Tensor]]]:
    """Caches holding random K/V of ``len(lengths)`` requests, their block rows, and dense copies."""
    blocks_per_request = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_per_request) + 2
    caches = layer_caches(layout_name, layers, num_blocks, heads, block_size, head_dim, dtype, device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    order = torch.randperm(num_blocks, generator=generator)
    width = max(blocks_per_request)
    rows = torch.zeros(len(lengths), width, dtype=torch.long)
    used = 0
    for request, count in enumerate(blocks_per_request):
        rows[request, :count] = order[used:used + count]
        used += count
    keys: list[list[torch.Tensor]] = [[] for _ in lengths]
    values: list[list[torch.Tensor]] = [[] for _ in lengths]
    for cache in caches:
        for request, length in enumerate(lengths):
            slots = rows[request, torch.arange(length) // block_size] * block_size + torch.arange(length) % block_size
            k = torch.randn(length, heads, head_dim, generator=generator).to(dtype)
            v = torch.randn(length, heads, head_dim, generator=generator).to(dtype)
            flash_write(k.to(device), v.to(device), cache, slots.to(device))
            keys[request].append(k)
            values[request].append(v)
    return caches, rows.to(device), keys, values


def check_layout(layout_name: str, dtype: torch.dtype, device: torch.device) -> dict[str, bool]:
    """Every check of :data:`CHECKS` for one layout and dtype (see the module docstring)."""
    heads, block_size, head_dim = 3, 16, 64
    lengths = [70, 33, 16]
    caches, rows, keys, values = _request_caches(layout_name, dtype, device, lengths)
    results: dict[str, bool] = {}
    layout = kv_keys.probe_layout(flash_write, caches[0], heads, block_size, head_dim)
    results["probe"] = layout is not None and layout.key_index.device.type == device.type
    if layout is None:
        return results
    sampled = torch.tensor([0, 2])
    results["read"] = all(
        torch.equal(kv_keys.read_keys_batched(cache, rows, sampled, layout)[request, :, :length].cpu(),
                    keys[request][index][:, sampled].transpose(0, 1))
        for index, cache in enumerate(caches) for request, length in enumerate(lengths))
    results["scoring"] = _check_scoring(caches, rows, lengths, keys, layout, device)
    results["redundancy"] = _check_redundancy(caches, rows, lengths[0], keys, layout)
    results["move"] = _check_move(caches, rows, keys, values, layout, block_size)
    caches, rows, keys, values = _request_caches(layout_name, dtype, device, lengths)  # unmoved again
    results["move_per_head"] = _check_move(caches, rows, keys, values, layout, block_size, per_head=True)
    return results


def _check_redundancy(caches: list[torch.Tensor], rows: torch.Tensor, length: int, keys: list[list[torch.Tensor]],
                      layout: Any) -> bool:
    """R-KV's redundancy of request 0's keys, read from the cache on the device, equals the CPU's."""
    heads = torch.arange(caches[0].shape[1], device=caches[0].device)
    read = torch.stack([kv_keys.read_keys(cache, rows[0], length, heads, layout) for cache in caches])
    dense = torch.stack([layer_keys.transpose(0, 1) for layer_keys in keys[0]])  # [L, H, length, hd]
    on_device = key_redundancy(read, cap_bytes=4096).cpu()  # small blocks of rows: the chunked path too
    return bool(torch.allclose(on_device, key_redundancy(dense), atol=1e-5))


def _check_scoring(caches: list[torch.Tensor], rows: torch.Tensor, lengths: list[int], keys: list[list[torch.Tensor]],
                   layout: Any, device: torch.device) -> bool:
    """Chunked scores equal dense softmax attention, with one chunk and with the smallest chunks."""
    generator = torch.Generator(device="cpu").manual_seed(1)
    kv_heads = torch.tensor([0, 0, 1, 2])  # query heads sharing a KV head, as with grouped queries
    scale = 64 ** -0.5
    queries = [torch.randn(len(lengths), len(kv_heads), 64, generator=generator).to(caches[0].dtype) for _ in caches]
    layers = [scoring.ObservedLayer(cache, query.to(device), scale, kv_heads)
              for cache, query in zip(caches, queries, strict=True)]
    summarize = observation.entropy_and_bins(8)
    mass = torch.zeros(len(lengths), max(lengths))
    entropy = torch.zeros(len(caches), len(lengths))
    for index, query in enumerate(queries):
        for request, length in enumerate(lengths):
            k = keys[request][index].float()[:, kv_heads].permute(1, 0, 2)  # [H, length, hd]
            probs = torch.softmax(torch.einsum("hd,hkd->hk", query[request].float(), k) * scale, dim=-1)
            mass[request, :length] += probs.mean(0)
            entropy[index, request] = -(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()
    ok = True
    for cap in (1, scoring.DEFAULT_CAP_BYTES):
        # one chunk under the default cap, whatever the device's chunk cost (cut by padding or not)
        scores = scoring.score_step(layers, rows, lengths, layout, cap_bytes=cap, chunk_cost=2 ** 30,
                                    summarize=summarize, token_mass=True)
        assert scores.token_mass is not None and scores.entropy is not None
        ok &= torch.allclose(scores.token_mass.cpu(), mass, atol=1e-5)
        ok &= torch.allclose(scores.entropy.cpu(), entropy, atol=1e-4)
        ok &= scores.chunks == (len(lengths) if cap == 1 else 1)
        by_head = scoring.score_step(layers, rows, lengths, layout, cap_bytes=cap, token_mass=True,
                                     mass_by_kv_head=True).token_mass
        assert by_head is not None  # KV head 0 is read by two sampled heads, 1 and 2 by one each
        ok &= torch.allclose((by_head.cpu() * torch.tensor([2.0, 1.0, 1.0])[None, :, None]).sum(1) / 4, mass,
                             atol=1e-5)
    return bool(ok)


def _check_move(caches: list[torch.Tensor], rows: torch.Tensor, keys: list[list[torch.Tensor]],
                values: list[list[torch.Tensor]], layout: Any, block_size: int, per_head: bool = False) -> bool:
    """Every other token of request 0 to the front of its blocks, in every layer at once; with
    ``per_head``, KV head ``h`` keeps every other token starting at ``h % 2`` (its own keep set)."""
    row = rows[0].cpu()
    length, heads = keys[0][0].shape[:2]
    slots = row[torch.arange(length) // block_size] * block_size + torch.arange(length) % block_size
    count = length // 2
    keep = torch.stack([torch.arange(head % 2 if per_head else 0, length, 2)[:count] for head in range(heads)])
    before = kv_keys.storage_of(caches[0]).clone()
    device = caches[0].device
    src, dst = (slots[keep], slots[:count].expand(heads, -1)) if per_head else (slots[keep[0]], slots[:count])
    moved = kv_keys.move_tokens_in_layers(caches, src.to(device), dst.to(device), layout)
    ok = moved == len(caches) * count * 2 * keys[0][0][0].numel() * caches[0].element_size()
    touched = torch.zeros(before.numel(), dtype=torch.bool, device=device)
    for index, cache in enumerate(caches):
        for position in range(count):
            slot = int(slots[position])
            for head in range(heads):
                token = int(keep[head, position])
                ok &= torch.equal(kv_keys.read_token(cache, slot, layout)[head].cpu(), keys[0][index][token, head])
                ok &= torch.equal(kv_keys.read_token(cache, slot, layout, value=True)[head].cpu(),
                                  values[0][index][token, head])
            block, offset = divmod(slot, block_size)
            base = cache.storage_offset() + block * layout.block_stride
            for index_table in (layout.key_index, layout.value_index):
                touched[base + index_table[:, offset].flatten()] = True
    after = kv_keys.storage_of(caches[0])
    ok &= torch.equal(after[~touched], before[~touched])
    return bool(ok)


def run_checks(device: str, quick: bool, log: Callable[[str], None] = print) -> dict:
    """Every correctness check, then the measurements. Returns a JSON-ready report (``ok``)."""
    torch_device = torch.device(device)
    started = time.monotonic()
    checks = {}
    for layout_name in LAYOUT_ORDERS:
        for dtype in (torch.float16, torch.bfloat16):
            name = f"{layout_name}-{str(dtype).removeprefix('torch.')}"
            checks[name] = check_layout(layout_name, dtype, torch_device)
            passed = all(checks[name].values()) and len(checks[name]) == len(CHECKS)
            log(f"{'PASS' if passed else 'FAIL'} {name} {checks[name]}")
    geometry = QUICK_GEOMETRY if quick else observation.ObservationGeometry()
    sizes = QUICK_SIZES if quick else FULL_SIZES
    cpu = torch_device.type == "cpu"
    measurements = []
    for requests, tokens in sizes:
        measured = observation.measure_observation(
            geometry, requests, tokens, device=device, repeats=1 if quick or cpu else 5,
            cap_bytes=64 * 2 ** 10 if quick else scoring.DEFAULT_CAP_BYTES,
            max_bytes=(3 if cpu else 60) * observation.GIB, pool_bytes=(2 if cpu else 40) * observation.GIB)
        measurements.append(measured)
        log(f"observe {requests}x{tokens}: after {measured['after_ms']} ms {measured['after_peak_bytes']:,} B "
            f"({measured['after_chunks']} chunks), before {measured['before_ms']} ms "
            f"{measured['before_peak_bytes']:,} B ({measured['memory']})")
    compaction = [observation.measure_compaction(geometry, tokens, device=device, repeats=1 if quick else 3,
                                                 max_bytes=(3 if cpu else 60) * observation.GIB)
                  for tokens in sorted({t for _, t in sizes})]
    for measured in compaction:
        log(f"compact {measured['tokens']} tokens: {measured['ms']} ms, {measured['peak_bytes']:,} B "
            f"({measured['memory']})")
    imported = sorted(name for name in FORBIDDEN_MODULES if name in sys.modules)
    ok = all(all(result.values()) and len(result) == len(CHECKS) for result in checks.values()) and not imported
    ok &= all(m.get("max_abs_diff_token_mass", 0.0) < 1e-4 for m in measurements)
    return {"ok": bool(ok), "device": device,
            "device_name": torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu",
            "torch_version": torch.__version__, "quick": quick, "checks": checks,
            "geometry": {k: str(v) for k, v in vars(geometry).items()}, "observation": measurements,
            "compaction": compaction, "forbidden_modules_imported": imported,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes (the test suite's smoke run)")
    parser.add_argument("--output", help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --device cpu", file=sys.stderr)
        return 2
    report = run_checks(args.device, args.quick)
    text = json.dumps(report, indent=2)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    print(text)
    print("PASS" if report["ok"] else "FAIL")
    return 0 if report["ok"] else 1
