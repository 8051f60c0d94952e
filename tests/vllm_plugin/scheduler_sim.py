"""A small stand-in of vLLM 0.32's scheduler loop, driving GrowPage's scheduler agent through its hooks.

What it keeps of vLLM (``vllm/v1/core/sched/scheduler.py``), so the agent sees what it sees there:

- running requests first, in order: a decoding request whose blocks are full takes one block for
  its next token, and when the pool has none vLLM preempts its newest running request (blocks
  freed, recomputed from scratch later, back at the head of the queue), until the block is there;
- then, only if nothing was preempted this step, waiting requests in queue order while
  ``len(running)`` is under ``max_num_active_reqs`` and their prompt's blocks are free; a prompt is
  computed in one step (no chunked prefill);
- every scheduled request computes its tokens and samples one; a request that has its
  ``max_tokens`` finishes and frees its blocks.

Blocks are sized from the *physical* length (``num_computed_tokens - growpage_dropped``), as the
agent's ``allocate_slots`` wrapper sizes them. The worker side is not simulated: compaction plans
are taken as carried out, and readings and attention needs come from the scenario.
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Callable

from growpage.vllm_plugin.scheduler_hooks import build_agent
from growpage.vllm_plugin.wire import DROPPED_ATTRIBUTE, WorkerReport


class Block:
    """vLLM's KVCacheBlock as the agent reads it (``ref_cnt`` > 1: shared through the prefix cache)."""

    def __init__(self, block_id: int, ref_cnt: int = 1, block_hash: object = None):
        self.block_id, self.ref_cnt, self.block_hash = block_id, ref_cnt, block_hash


class BlockPool:
    """vLLM's BlockPool as the agent uses it: a null block plus ``usable`` blocks."""

    def __init__(self, usable: int):
        self.num_gpu_blocks = usable + 1
        self.free = collections.deque(range(1, usable + 1))

    def get_num_free_blocks(self) -> int:
        return len(self.free)

    def take(self, count: int) -> list[Block]:
        return [Block(self.free.popleft()) for _ in range(count)]

    def free_blocks(self, blocks) -> None:
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free.append(block.block_id)

    def _maybe_evict_cached_block(self, block) -> bool:
        block.block_hash = None
        return True


@dataclasses.dataclass
class Request:
    """vLLM's ``Request`` as the agent reads it."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    sampling_params: types.SimpleNamespace
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    status: object = None
    spec_token_ids: tuple = ()
    prompt_token_ids: tuple = ()

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclasses.dataclass(frozen=True)
class Arrival:
    """A request of the scenario: it arrives at ``step``."""

    step: int
    request_id: str
    prompt_tokens: int
    max_tokens: int
    extra_args: dict = dataclasses.field(default_factory=dict)


class Scheduler:
    """The stand-in (see the module docstring); ``agent`` is GrowPage's, built as vLLM builds it."""

    def __init__(self, growpage: dict, *, usable_blocks: int, block_size: int, max_num_seqs: int = 16,
                 max_model_len: int = 4096):
        self.block_size = block_size
        self.vllm_config = types.SimpleNamespace(
            additional_config={"growpage": {"exporter_port": -1, **growpage}},
            cache_config=types.SimpleNamespace(block_size=block_size), compilation_config=None,
            use_v2_model_runner=False,
            parallel_config=types.SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
            model_config=types.SimpleNamespace(served_model_name="m", model="m"),
            device_config=types.SimpleNamespace(device_type="cpu"))
        self.single = types.SimpleNamespace(req_to_blocks={}, num_cached_block={})
        self.kv_cache_manager = types.SimpleNamespace(
            block_pool=BlockPool(usable_blocks), coordinator=types.SimpleNamespace(single_type_managers=[self.single]))
        spec = types.SimpleNamespace(page_size_bytes=block_size * 256, block_size=block_size)
        self.kv_cache_config = types.SimpleNamespace(
            kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec, layer_names=["l0", "l1"])])
        self.scheduler_config = types.SimpleNamespace(async_scheduling=False, max_num_seqs=max_num_seqs)
        self.max_num_active_reqs = max_num_seqs
        self.max_model_len = max_model_len
        self.running: list[Request] = []
        self.waiting: collections.deque[Request] = collections.deque()
        self.finished: list[Request] = []
        self.preemptions = 0
        self.agent = build_agent(self, start_telemetry=False)

    @property
    def blocks(self) -> dict[str, list[Block]]:
        return self.single.req_to_blocks

    def add(self, arrival: Arrival) -> None:
        self.waiting.append(Request(arrival.request_id, arrival.prompt_tokens, arrival.max_tokens,
                                    types.SimpleNamespace(extra_args=dict(arrival.extra_args))))

    def step(self, report: Callable[[list[Request]], WorkerReport] | None = None) -> dict:
        """One engine step; what it did (admitted, preempted, finished, the admission limit)."""
        agent = self.agent
        agent.before_schedule(self)
        limit = self.max_num_active_reqs
        scheduled, preempted = self._schedule_running()
        admitted = [] if preempted else self._admit()
        agent.after_schedule(self, types.SimpleNamespace(
            num_scheduled_tokens={r.request_id: self._new_tokens(r) for r in scheduled + admitted}))
        for request in scheduled + admitted:
            request.num_computed_tokens += self._new_tokens(request)
            request.num_output_tokens += 1
        if report is not None:
            agent.take_report(report(self.running))
        done = [r for r in self.running if r.num_output_tokens >= r.max_tokens]
        for request in done:
            self.running.remove(request)
            request.status = types.SimpleNamespace(name="FINISHED_LENGTH_CAPPED")
            self._free(request)
            agent.on_free(request)
            self.finished.append(request)
        return {"limit": limit, "admitted": [r.request_id for r in admitted], "preempted": preempted,
                "finished": [r.request_id for r in done]}

    def idle(self) -> bool:
        return not self.running and not self.waiting

    # ---- vLLM's schedule(), reduced ---------------------------------------------------------------
    @staticmethod
    def _new_tokens(request: Request) -> int:
        return request.num_tokens - request.num_computed_tokens

    def _physical(self, request: Request) -> int:
        return request.num_computed_tokens - getattr(request, DROPPED_ATTRIBUTE, 0)

    def _allocate(self, request: Request, tokens: int) -> bool:
        """Blocks for ``tokens`` physical tokens (the agent's allocate_slots wrapper's sizing)."""
        held = self.blocks.setdefault(request.request_id, [])
        needed = -(-tokens // self.block_size) - len(held)
        if needed > self.kv_cache_manager.block_pool.get_num_free_blocks():
            return False
        if needed > 0:
            held.extend(self.kv_cache_manager.block_pool.take(needed))
            self.agent.on_allocated(request.request_id, needed, 1e-5)
        return True

    def _schedule_running(self) -> tuple[list[Request], list[str]]:
        scheduled: list[Request] = []
        preempted: list[str] = []
        index = 0
        while index < len(self.running):
            request = self.running[index]
            while not self._allocate(request, self._physical(request) + self._new_tokens(request)):
                victim = self.running.pop()  # vLLM preempts its newest running request
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                scheduled.append(request)
                index += 1
        return scheduled, preempted

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        while self.waiting and len(self.running) < self.max_num_active_reqs:
            request = self.waiting[0]
            if not self._allocate(request, request.num_tokens):
                self.blocks.pop(request.request_id, None)
                break
            self.waiting.popleft()
            self.running.append(request)
            admitted.append(request)
        return admitted

    def _preempt(self, request: Request) -> None:
        self._free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.preemptions += 1
        self.agent.on_preempt(request)
        self.waiting.appendleft(request)

    def _free(self, request: Request) -> None:
        blocks = self.blocks.pop(request.request_id, [])
        self.kv_cache_manager.block_pool.free_blocks(reversed(blocks))


def run(scheduler: Scheduler, arrivals: list[Arrival], readings: Callable[[str, int], tuple[float, float]],
        *, attention_tokens: Callable[[str, int], int] | None = None, max_steps: int = 5000) -> list[dict]:
    """Every arrival to its end; one record per step. ``readings(request_id, step)`` is the
    (density, entropy) the worker reports, ``attention_tokens`` the attention need."""
    pending = sorted(arrivals, key=lambda a: a.step)
    steps: list[dict] = []

    def report(running: list[Request]) -> WorkerReport:
        step = len(steps)
        return WorkerReport(
            readings={r.request_id: readings(r.request_id, step) for r in running}, ready_to_compact=True,
            observer_state="active", steps=1, steps_observed=1,
            attention_tokens=({r.request_id: attention_tokens(r.request_id, step) for r in running}
                              if attention_tokens is not None else {}))

    while pending or not scheduler.idle():
        if len(steps) >= max_steps:
            raise AssertionError(f"not idle after {max_steps} steps: {len(scheduler.running)} running, "
                                 f"{len(scheduler.waiting)} waiting")
        while pending and pending[0].step <= len(steps):
            scheduler.add(pending.pop(0))
        steps.append(scheduler.step(report))
    return steps

