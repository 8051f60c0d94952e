"""Factories for core tests: a manager on a tiny model geometry and a driver that feeds it."""

from __future__ import annotations

import math

import torch

from growpage.config import GrowPageConfig
from growpage.engine.kv.manager import GrowPageManager, SlotStatus

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 2, 2, 4, 8
SCALE = 1.0 / math.sqrt(HEAD_DIM)


class FakeClock:
    """Seconds under the test's control (the growth throttle reads time through it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_manager(num_pages: int = 64, clock=None, method=None, **config) -> GrowPageManager:
    defaults = dict(mode="enforce", block_size=4, base_pages=4, sink_tokens=2, recent_window_tokens=4,
                    lts_update_interval_steps=4, lts_window_steps=16, kv_dtype="float32",
                    observed_layers=LAYERS, max_growth_rate=1000.0)
    defaults.update(config)
    return GrowPageManager(GrowPageConfig(**defaults), num_layers=LAYERS, num_kv_heads=KV_HEADS,
                           head_dim=HEAD_DIM, num_pages=num_pages, max_requests=16,
                           clock=clock or FakeClock(), **({"method": method} if method else {}))


class Driver:
    """Runs engine steps with random Q/K/V and keeps a dense copy of every K/V it wrote."""

    def __init__(self, manager: GrowPageManager, seed: int = 0):
        self.manager = manager
        self.generator = torch.Generator().manual_seed(seed)
        self.kv: dict[str, dict[int, torch.Tensor]] = {}  # request -> position -> [L, 2, H, D]

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator)

    def admit(self, request_id: str, prompt_tokens: int, **kwargs):
        admission = self.manager.admit(request_id, prompt_tokens, **kwargs)
        self.kv.setdefault(request_id, {})
        return admission

    def step(self, batch: list[tuple[str, int]]):
        """One step; returns ``(outputs, queries)``, each ``{request: [layers, n, q_heads, dim]}``."""
        for request_id, count in batch:
            status = self.manager.ensure_slots(request_id, count)
            if status is not SlotStatus.OK:
                raise RuntimeError(f"{request_id}: {status}")
        plan = self.manager.plan_step(batch)
        max_queries = max(n for _, n in batch)
        outputs = {rid: [] for rid, _ in batch}
        starts = {rid: self.manager.requests[rid].logical_length - n for rid, n in batch}
        new_kv = {rid: self.randn(LAYERS, n, 2, KV_HEADS, HEAD_DIM) for rid, n in batch}
        queries = {rid: self.randn(LAYERS, n, Q_HEADS, HEAD_DIM) for rid, n in batch}
        for rid, n in batch:
            for i in range(n):
                self.kv[rid][starts[rid] + i] = new_kv[rid][:, i]
        for layer in range(LAYERS):
            query = torch.zeros(len(batch), max_queries, Q_HEADS, HEAD_DIM)
            for row, (rid, n) in enumerate(batch):
                query[row, :n] = queries[rid][layer]
            keys = torch.cat([new_kv[rid][layer, :, 0] for rid, _ in batch])
            values = torch.cat([new_kv[rid][layer, :, 1] for rid, _ in batch])
            out = self.manager.attend(layer, plan, query, keys, values, SCALE)
            for row, (rid, n) in enumerate(batch):
                outputs[rid].append(out[row, :n])
        self.manager.finish_step(plan)
        return {rid: torch.stack(chunks) for rid, chunks in outputs.items()}, queries

    def stored_positions(self, request_id: str) -> list[int]:
        store = self.manager.store
        positions = []
        for page in self.manager.requests[request_id].pages:
            positions.extend(store.positions[page, :store.fill[page]].tolist())
        return sorted(positions)


def dense_attention(kv: dict[int, torch.Tensor], positions: list[int], query: torch.Tensor,
                    query_positions: list[int], layer: int) -> torch.Tensor:
    """Reference causal GQA attention over exactly ``positions``: ``[n, q_heads, dim]``."""
    keys = torch.stack([kv[p][layer, 0] for p in positions])  # [K, H, D]
    values = torch.stack([kv[p][layer, 1] for p in positions])
    group = Q_HEADS // KV_HEADS
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", query, keys) * SCALE
    visible = torch.tensor(positions)[None, :] <= torch.tensor(query_positions)[:, None]
    logits = logits.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(logits, -1), values)


