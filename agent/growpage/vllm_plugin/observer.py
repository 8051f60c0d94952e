"""Attention observation inside one vLLM worker: what only the worker can see.

Per step (driven by :mod:`growpage.vllm_plugin.worker_hooks` around the worker's ``execute_model``):

1. ``begin_step``: track new requests (a summary row each; namespace and requested mode from
   ``SamplingParams.extra_args``), release finished and preempted ones.
2. per observed layer, ``observe_layer`` (from the attention backend, after vLLM's own kernel):
   the newest query of ``observed_heads`` sampled heads of every request that samples this step
   (RoPE applied); at the end of the step ``flush_observations`` scores them against the keys read
   from the paged cache (exact logits) -> :func:`~growpage.core.summaries.summarize_attention`.
3. ``end_step``: fold the layer-mean observation into the :class:`SummaryBank`; in ``enforce``
   accumulate per-token attention for the compactor's keep sets.

After the step the worker's :class:`~growpage.vllm_plugin.wire.WorkerReport` (readings, observer
state, counts) rides back to the scheduler on ``ModelRunnerOutput``: admission, boundaries,
decisions, the pool's gauges and the exporter are the scheduler agent's
(:mod:`~growpage.vllm_plugin.scheduler_agent`). KV and outputs are never touched here except by the
:class:`~growpage.vllm_plugin.compactor.WorkerCompactor` in ``enforce``. Every entry point catches
its own faults, counts them (reported as ``growpage_agent_errors_total{component="plugin"}``) and
lets vLLM carry on.

**The one seam per model runner: where a step's batch is read.** Both of vLLM's GPU runners (V1
``GPUModelRunner``, which the CPU runner subclasses, and Model Runner V2
``vllm.v1.worker.gpu.model_runner.GPUModelRunner``, the default on CUDA) are driven by the worker's
``execute_model`` and call the same attention backends; they differ in where a step's batch lives
while attention runs:

- V1 keeps a persistent ``input_batch`` (``req_ids`` in row order) and host mirrors of the query
  starts (``query_start_loc.cpu``) and lengths (``optimistic_seq_lens_cpu``);
- V2 builds an ``InputBatch`` per step in ``prepare_inputs`` and keeps it in a local variable, so
  :func:`remember_v2_batch` (wrapped around ``prepare_inputs`` by the worker hooks) keeps a handle
  on the runner for the length of the step. Its lengths are the host arrays
  ``num_computed_tokens_np + num_scheduled_tokens`` (no device read).

The block table is the attention metadata's where the backend has one (FlashAttention, Triton,
CPU), else V1's own table. Everything here reads host state: no device-to-host copy per step.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import torch

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import observed_layer_indices
from growpage.core.devices import device_name, to_device
from growpage.core.faults import FaultGuard
from growpage.core.methods import build_method
from growpage.core.summaries import SummaryBank, readings_from, summarize_attention
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin import scoring
from growpage.vllm_plugin.compaction import TokenScores
from growpage.vllm_plugin.compactor import WorkerCompactor
from growpage.vllm_plugin.keep_board import KeepBoard
from growpage.vllm_plugin.own_time import OwnTime
from growpage.vllm_plugin.settings import MODE_ARG, PluginSettings, request_namespace
from growpage.vllm_plugin.skipped_queries import SkippedQueries, TakenQuery
from growpage.vllm_plugin.support import ACTIVE
from growpage.vllm_plugin.vllm_types import (
    AttentionImpl,
    CompactingRunner,
    ModelRunner,
    NewRequestData,
    V1ModelRunner,
    V2InputBatch,
)
from growpage.vllm_plugin.wire import PAYLOAD_ATTRIBUTE, PLUGIN_COMPONENT, StepPayload, WorkerReport, append_enforce_log
from growpage.vllm_plugin.worker_requests import TrackedRequest, WorkerRequests

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


# ---- the step's batch, per model runner (the module docstring) ------------------------------------
V2_BATCH_ATTRIBUTE = "_growpage_input_batch"  # on a V2 runner: the step's InputBatch

BatchView = tuple[list[str], list[int], list[int], torch.Tensor]


def remember_v2_batch(runner: ModelRunner, input_batch: V2InputBatch) -> None:
    """Keep the V2 step's ``InputBatch`` on its runner until the next ``prepare_inputs``."""
    runner.__dict__[V2_BATCH_ATTRIBUTE] = input_batch


def batch_view(runner: Any, metadata: object) -> BatchView:
    """This step's request ids (batch row order), query starts, physical ``seq_lens`` and block table.

    ``runner`` is either model runner, told apart by the V2 batch remembered on it; ``metadata`` is
    the attention backend's.

    Raises:
        RuntimeError: the runner keeps no batch GrowPage knows how to read, or no block table can be
            found for it (counted as a fault by the caller; vLLM carries on).
    """
    # runner is Any: no type tells V1 from V2 here (the remembered batch does), and _v1_view reads V1's
    v2_batch = getattr(runner, "__dict__", {}).get(V2_BATCH_ATTRIBUTE)
    if v2_batch is not None:
        return _v2_view(v2_batch, metadata)
    return _v1_view(runner, metadata)


def _metadata_block_table(metadata: object) -> torch.Tensor | None:
    block_table = getattr(metadata, "block_table", None)
    return block_table if isinstance(block_table, torch.Tensor) else None


def _v1_view(runner: V1ModelRunner, metadata: Any) -> BatchView:
    # metadata is Any: its query_start_loc and seq_lens are read only where the runner keeps no host
    # copies of them, and FlashInfer's metadata has neither, so no Protocol of it would be true
    batch = runner.input_batch
    req_ids = list(batch.req_ids)
    num_reqs = len(req_ids)
    host_starts = getattr(getattr(runner, "query_start_loc", None), "cpu", None)
    host_lens = getattr(runner, "optimistic_seq_lens_cpu", None)
    if isinstance(host_starts, torch.Tensor) and isinstance(host_lens, torch.Tensor):
        starts = host_starts[:num_reqs + 1].tolist()
        seq_lens = host_lens[:num_reqs].tolist()
    else:
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
    block_table = _metadata_block_table(metadata)
    if block_table is None:  # FlashInfer's metadata has none: the runner's table of the first group
        block_table = batch.block_table.block_tables[0].get_device_tensor(num_reqs)
    return req_ids, starts, seq_lens, block_table


def _v2_view(input_batch: V2InputBatch, metadata: object) -> BatchView:
    num_reqs = int(input_batch.num_reqs)
    req_ids = list(input_batch.req_ids[:num_reqs])
    starts = [int(x) for x in input_batch.query_start_loc_np[:num_reqs + 1]]
    computed = input_batch.num_computed_tokens_np[:num_reqs]
    scheduled = input_batch.num_scheduled_tokens[:num_reqs]
    seq_lens = [int(c) + int(n) for c, n in zip(computed, scheduled, strict=True)]
    block_table = _metadata_block_table(metadata)
    if block_table is None:
        raise RuntimeError("Model Runner V2 with an attention backend whose metadata has no block table "
                           "(FlashInfer): GrowPage cannot read its keys; use FLASH_ATTN or TRITON_ATTN")
    return req_ids, starts, seq_lens, block_table


# ---- the observer -------------------------------------------------------------------------------


@dataclasses.dataclass
class _LayerObservation:
    rows: list[int]
    bin_mass: torch.Tensor
    entropy: torch.Tensor


@dataclasses.dataclass
class _StepRows:
    """The requests one step observes and the index tensors every observed layer reuses."""

    rows: list[int]  # summary rows
    lengths: list[int]  # physical tokens in the cache, this step's included
    observed: list[TrackedRequest]
    max_len: int
    query_tokens: torch.Tensor  # [R * W] each request's window of query tokens in the batch, newest last
    query_offsets: list[list[int]]  # [R][W] positions before the request's newest (0: newest, or a repeat)
    block_rows: torch.Tensor | None  # [R, M] block-table rows, cut to the longest request (observed steps)
    wants_token_mass: bool  # compaction scores (enforced requests) or the forecast's needs (monitored ones)
    token_mass: torch.Tensor | None = None  # [R, max_len] attention summed over observed layers
    # [R * W] rows of the skipped steps' pool forming each window (None: the step's own queries alone)
    window_sources: torch.Tensor | None = None
    # [R] decode steps each request's observation stands for (its window's distinct queries)
    window_steps: list[int] | None = None
    pending: list[_PendingLayer] = dataclasses.field(default_factory=list)  # layers observed, not yet scored


# One observed layer of this step: its cache view and its requests' newest sampled queries.
_PendingLayer = scoring.ObservedLayer


StepBatch = tuple[list[str], list[int], list[int], torch.Tensor]  # ids, query starts, seq_lens, block table


@dataclasses.dataclass
class _StepState:
    """The step now running: whether it is observed, who its first observed layer planned to
    observe (reused by the others), and the layers observed so far."""

    begun: int = 0  # steps begun since start
    running: bool = False  # between begin_step and end_step
    observed: bool = True  # this step is due to be observed
    layers: list[_LayerObservation] = dataclasses.field(default_factory=list)
    batch: StepBatch | None = None  # the runner's batch, read once per step
    plan: _StepRows | None = None  # who this step observes, once its first layer asked
    planned: bool = False  # the plan was made this step (None then: nobody to observe)

    def begin(self, stride: int) -> None:
        self.begun += 1
        self.running, self.observed = True, self.begun % stride == 0
        self.layers, self.batch, self.plan, self.planned = [], None, None, False


@dataclasses.dataclass
class _Counts:
    """What the worker counts, and where its last report left each count."""

    steps_tracked: int = 0  # steps that ran with a tracked request
    steps_observed: int = 0
    errors: int = 0  # faults caught in this worker
    reported: tuple[int, int, int] = (0, 0, 0)  # (steps_tracked, steps_observed, errors) at the last report
    # a rank other than the output rank: its report never reaches the scheduler, so each fault is
    # also published where the scheduler reads it (vllm_plugin.rank_faults)
    publish: Callable[[int], None] | None = None

    def count_error(self) -> None:
        self.errors += 1
        if self.publish is not None:
            try:
                self.publish(1)
            except OSError:  # the fault is caught and logged already; a board that fails drops the count only
                logger.debug("growpage: cannot publish a fault to the scheduler", exc_info=True)

    def since_report(self) -> tuple[int, int, int]:
        """The counts' increases since the last call, which becomes the new last report."""
        now = (self.steps_tracked, self.steps_observed, self.errors)
        last, self.reported = self.reported, now
        return now[0] - last[0], now[1] - last[1], now[2] - last[2]


class _Sampling:
    """Which layers and query heads the observer reads, and how often: fixed at start-up, with the
    per-layer answer and the head tensors cached (this runs in every layer of every step).

    Args:
        observed_layers: the decoder layers observed (evenly spaced).
        observed_heads: query heads sampled per layer.
        per_kv_head: sample at least one query head per KV head (per-head keep sets).
        stride: steps per observed step.
        readings_every: observed steps between two readings of the observed requests.
    """

    def __init__(self, observed_layers: frozenset[int], observed_heads: int, per_kv_head: bool, stride: int,
                 readings_every: int):
        self.observed_layers = observed_layers
        self.observed_heads = observed_heads
        self.per_kv_head = per_kv_head
        self.stride = stride
        self.readings_every = readings_every
        self._wanted_layers: dict[str, bool] = {}
        self._heads_by_count: dict[int, torch.Tensor] = {}
        self._heads_on_device: dict[tuple[int, str], torch.Tensor] = {}

    def wants(self, layer_name: str) -> bool:
        wanted = self._wanted_layers.get(layer_name)
        if wanted is None:  # a layer's name never changes: parse it once
            index = layer_index(layer_name)
            wanted = self._wanted_layers[layer_name] = index is not None and index in self.observed_layers
        return wanted

    def heads(self, num_heads: int, num_kv_heads: int) -> torch.Tensor:
        """The sampled query heads, evenly spaced; with per-head keep sets evenly spaced within each
        KV head's group, at least one per group (built once per head count)."""
        heads = self._heads_by_count.get(num_heads)
        if heads is None:
            heads = torch.tensor(sampled_heads(num_heads, num_kv_heads, self.observed_heads, self.per_kv_head),
                                 dtype=torch.long)
            self._heads_by_count[num_heads] = heads
        return heads

    def on(self, heads: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``heads`` on ``device``, copied once per device (not once per observed layer)."""
        key = (heads.data_ptr(), str(device))
        cached = self._heads_on_device.get(key)
        if cached is None:
            cached = self._heads_on_device[key] = heads.to(device)
        return cached


def query_window(spans: list[tuple[int, int]], window_tokens: int) -> tuple[list[int], list[list[int]]]:
    """Which query tokens of the batch each observed request is scored by, and their offsets.

    A request's ``(start, end)`` span holds its query tokens this step: one while it decodes, the
    chunk of its prompt at the step that ends the prompt. It is scored by its last
    ``min(window_tokens, end - start)`` queries (an observation window: the end of a prompt, where
    the question usually is, says which of its tokens matter); the step's window is the widest of
    them, and a request with fewer repeats its newest query (offset 0, which changes no mean).

    Returns:
        ``[R * W]`` batch token indices, each request's newest last, and ``[R][W]`` offsets (how
        many positions each lies before the request's newest).
    """
    widths = [max(1, min(window_tokens, end - start)) for start, end in spans]
    window = max(widths, default=1)
    tokens: list[int] = []
    offsets: list[list[int]] = []
    for (_, end), width in zip(spans, widths, strict=True):
        request_offsets = [0] * (window - width) + list(range(width - 1, -1, -1))
        offsets.append(request_offsets)
        tokens += [end - 1 - offset for offset in request_offsets]
    return tokens, offsets


def sampled_heads(num_heads: int, num_kv_heads: int, count: int, every_kv_head: bool) -> list[int]:
    """``count`` query heads to observe, evenly spaced (ascending); with ``every_kv_head``, plus the
    first head of each KV head's group that none of them reads (per-head keep sets need every KV
    head's own attention). The packaged model's 4 of 9 heads already read all 3 KV heads."""
    count = min(count, num_heads)
    heads = {i * num_heads // count for i in range(count)}
    if every_kv_head and num_kv_heads > 0 and num_heads % num_kv_heads == 0:
        group = num_heads // num_kv_heads
        heads |= {kv * group for kv in range(num_kv_heads) if kv not in {h // group for h in heads}}
    return sorted(heads)


def rotating_sample(count: int, limit: int, turn: int, first: Sequence[int] = ()) -> list[int]:
    """``limit`` of ``count`` positions (ascending): ``first`` (up to ``limit`` of them: requests
    whose prompt ends this step, whose scores start there), then the others from ``turn`` times
    the slots left on, wrapping, so successive turns cover every position in turn
    (``observe_max_requests``)."""
    if count <= limit:
        return list(range(count))
    chosen = list(dict.fromkeys(first))[:limit]
    taken = set(chosen)
    others = [position for position in range(count) if position not in taken]
    slots = min(limit - len(chosen), len(others))
    start = (turn * slots) % len(others) if others else 0
    chosen += [others[(start + n) % len(others)] for n in range(slots)]
    return sorted(chosen)


def _v1(runner: ModelRunner) -> CompactingRunner:
    """The runner as the compactor reads it: V1's (or the CPU runner's) persistent batch. Under
    Model Runner V2 the scheduler does not enforce (:func:`~growpage.vllm_plugin.support.enforce_blocker`),
    so no plan arrives and the compactor reads nothing of the runner (and V2's inputs are not
    rewritten: only V1's ``_prepare_inputs`` is hooked for that)."""
    return typing.cast("CompactingRunner", runner)


def layer_index(layer_name: str) -> int | None:
    """``model.layers.7.self_attn.attn`` -> 7."""
    match = _LAYER_INDEX.search(layer_name)
    return int(match.group(1)) if match else None


class VllmObserver:
    """The attention observer of one worker process. See the module docstring.

    Args:
        config: GrowPage's config (``block_size`` = vLLM's).
        settings: the plugin's own settings.
        num_layers: decoder layers of the model.
        max_requests: summary rows (vLLM's ``max_num_seqs``).
        rank: this worker's tensor-parallel rank. Every rank observes its own heads and compacts;
            the output rank's report is the one the scheduler receives.
        publish_faults: called with each new fault on a rank whose report the scheduler never
            receives (:class:`~growpage.vllm_plugin.rank_faults.RankFaultPublisher`; None: rank 0).
        keep_board: under tensor parallelism, where enforce's ranks share their token rankings
            (:mod:`~growpage.vllm_plugin.keep_board`; None: each rank's own heads choose).
    """

    def __init__(self, config: GrowPageConfig, settings: PluginSettings, *, num_layers: int,
                 max_requests: int, rank: int = 0,
                 publish_faults: Callable[[int], None] | None = None, keep_board: KeepBoard | None = None):
        self.config = config
        self.settings = settings
        self.rank = rank
        self.device = torch.device("cpu")  # the KV cache's, once seen
        # "active" until the first write shows the cache layout cannot be read (note_kv_write)
        self.state = ACTIVE
        self.counts = _Counts(publish=publish_faults)
        self.faults = FaultGuard(self._count_fault, logger,
                                 suffix="vLLM carries on unchanged; further faults are counted in "
                                        "growpage_agent_errors_total, not logged")
        self.own_time = OwnTime()  # what GrowPage costs this worker's steps (reported to the scheduler)
        self.summaries = SummaryBank(config, max_requests)
        self.requests = WorkerRequests(max_requests)
        self.runner: object = None  # vLLM's model runner of this step (its batch is read once per step)
        self.step = _StepState()
        self._layout: kv_keys.BlockLayout | None = None
        self._layout_failed = False
        # enforce: the worker's physical state (None unless the deployment runs enforce)
        method = build_method(settings.method)
        scores = TokenScores(method)
        self.compactor = (WorkerCompactor(config, rank, scores, settings.redundancy_weight,
                                          settings.shared_keep_fraction, settings.compaction_chunk_mib * 2 ** 20,
                                          keep_board)
                          if config.mode is Mode.ENFORCE else None)
        # per-head keep sets need each KV head's own scores (and a sampled query head reading it)
        per_kv_head = self.compactor is not None and scores.scored and settings.keep_sets == "kv_head"
        stride = settings.observation_stride(config.mode)
        self.sampling = _Sampling(observed_layer_indices(num_layers, config.observed_layers), settings.observed_heads,
                                  per_kv_head, stride, settings.readings_every_observed(stride))
        # the newest queries of the steps the stride skips, scored at the next observed step
        self.skipped = SkippedQueries(self.sampling.stride - 1 if settings.observe_skipped_steps else 0)
        self._attention_coverage = method.attention_coverage(config)  # the floor that follows attention
        # monitor's forecast of enforce (vllm_plugin.forecast) needs what enforce's floors follow: each
        # monitored request's attention need, from the same scores enforce keeps (no compaction here)
        self.forecast_scores = (TokenScores(method)
                                if config.mode is not Mode.OFF and self._attention_coverage > 0 and scores.scored
                                else None)

    @property
    def observed_layers(self) -> frozenset[int]:
        return self.sampling.observed_layers

    @property
    def errors_total(self) -> int:
        """Faults caught in this worker since start."""
        return self.counts.errors

    # ---- fault isolation --------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return device_name(self.device)

    def fault(self, what: str) -> None:
        """Count a caught fault (reported to the scheduler); log the first one with its traceback."""
        self.faults.fault(PLUGIN_COMPONENT, f"{what} failed in the worker", log_key="worker")

    def _fault_injected(self, site: str) -> bool:
        """The test hook (``fault_injection``): ``site`` on every rank, or ``site@rankN`` on rank N only."""
        what, _, rank = self.settings.fault_injection.partition("@rank")
        return what == site and (not rank or rank == str(self.rank))

    def _count_fault(self, _component: str) -> None:
        self.counts.count_error()

    def disable(self, reason: str, why: str) -> None:
        """Stop observing in this process for good, and say so (``growpage_agent_active`` = 0 with
        ``reason``, one error log line); vLLM runs unchanged."""
        self._layout_failed = True
        self.state = reason
        logger.error("growpage: attention observation is off in pid %d (%s): %s", os.getpid(), reason, why)

    def guarded(self, what: str, function: Callable[_Params, _Result], *args: _Params.args,
                **kwargs: _Params.kwargs) -> _Result | None:
        """Run ``function``, timed as GrowPage's own work; a fault is counted, logged once, never raised
        (vLLM carries on)."""
        with self.own_time.own():
            return self.faults.call(PLUGIN_COMPONENT, f"{what} failed in the worker", function, *args, **kwargs)

    # ---- request lifecycle (worker hook) ------------------------------------------------------------
    def begin_step(self, runner: object, scheduler_output: object) -> None:
        self.runner = runner
        self.step.begin(self.sampling.stride)
        self._collect_readings()
        for request_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._release(request_id)
        for request_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self._release(request_id, preempted=True)
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            self._admit(new)
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        for request_id in getattr(cached, "resumed_req_ids", None) or ():
            self._resume(request_id)
        if self.step.observed and _prompts_only(scheduler_output):
            # nothing is compressed at this step's decode boundaries (the pool holds every request,
            # or the compression gate is idle), so only a prompt's end (below) is worth its cost
            self.step.observed = False
        scored_modes = self._scored_modes
        if not self.step.observed and scored_modes:
            # a scored prompt's end is always observed, whatever the stride: prompt-anchored scores
            # start from it (what enforce's keep sets rank by, and the forecast's attention need); a
            # compaction of a prompt whose end went unobserved keeps its newest tokens, not its needle
            self.step.observed = self._ends_a_scored_prompt(scheduler_output, scored_modes)
        if self.requests and int(getattr(scheduler_output, "total_num_scheduled_tokens", 1) or 0) > 0:
            self.counts.steps_tracked += 1

    @property
    def _scored_modes(self) -> frozenset[Mode]:
        """The modes whose requests keep prompt-anchored scores: enforce's (ranked by the compactor)
        and monitor's (the forecast's attention need)."""
        enforce = self.compactor is not None and self.compactor.scores.scored
        return frozenset({Mode.ENFORCE} if enforce else ()) | frozenset(
            {Mode.MONITOR} if self.forecast_scores is not None else ())

    def _ends_a_scored_prompt(self, scheduler_output: object, modes: frozenset[Mode]) -> bool:
        """Whether this step computes the last prompt token of a request in ``modes``, whose scores
        start there."""
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        computed = {new.req_id: int(getattr(new, "num_computed_tokens", 0) or 0)
                    for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ()}
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        computed.update(zip(getattr(cached, "req_ids", None) or (),
                            (int(n) for n in getattr(cached, "num_computed_tokens", None) or ()), strict=False))
        for request_id, tokens in scheduled.items():
            tracked = self.requests.get(request_id)
            if (tracked is not None and tracked.mode in modes and request_id in computed
                    and computed[request_id] < tracked.prompt_tokens <= computed[request_id] + int(tokens)):
                return True
        return False

    def begin_compaction(self, runner: ModelRunner, scheduler_output: object) -> None:
        """Enforce, before the runner updates its states: apply the scheduler's plans."""
        if self.compactor is not None:
            self.compactor.begin_step(_v1(runner), scheduler_output, self._layout)

    def adjust_inputs(self, runner: ModelRunner) -> None:
        """Enforce, after the runner prepared its inputs: physical ``seq_lens`` and ``slot_mapping``."""
        if self.compactor is not None:
            self.compactor.adjust_inputs(_v1(runner))

    @property
    def wants_eager_step(self) -> bool:
        """Whether the step now starting is due to be observed, so it must not replay a full CUDA
        graph (which runs no Python: :mod:`~growpage.vllm_plugin.graph_steps`)."""
        return self.step.running and self.step.observed and bool(self.requests) and not self._layout_failed

    @property
    def ready_to_compact(self) -> bool:
        """Whether this worker can move tokens (the cache layout is known and supported)."""
        return self._layout is not None and not self._layout_failed

    def take_report(self) -> WorkerReport:
        """What the scheduler learns from this worker since its last report."""
        if self.settings.fault_injection and self._fault_injected("report"):
            raise RuntimeError("growpage fault injection: report")
        self._collect_readings()
        readings, needs = self.requests.take_pending()
        steps, observed, errors = self.counts.since_report()
        own_seconds, step_seconds = self.own_time.since_report()
        return WorkerReport(readings=readings, ready_to_compact=self.ready_to_compact, observer_state=self.state,
                            errors=errors, steps=steps, steps_observed=observed, attention_tokens=needs,
                            own_seconds=own_seconds, step_seconds=step_seconds)

    def _admit(self, new: NewRequestData) -> None:
        if new.req_id in self.requests:
            self._release(new.req_id)
        extra = getattr(getattr(new, "sampling_params", None), "extra_args", None) or {}
        namespace = request_namespace(extra)
        tracked = self.requests.admit(new.req_id, namespace, self.config.mode_for(namespace, extra.get(MODE_ARG)),
                                      prompt_tokens=len(new.prompt_token_ids or ()))
        if tracked is not None:
            self.summaries.reset([tracked.row])

    def _resume(self, request_id: str) -> None:
        """Track a request again that vLLM resumed after a preemption. Model Runner V1 resends it as a
        cached request (``resumed_req_ids``), not a new one: without this the agent would stay blind to
        it for the rest of its life. Its KV is recomputed, so its summaries start over in a fresh row."""
        tracked = self.requests.resume(request_id)
        if tracked is not None:
            self.summaries.reset([tracked.row])

    def _release(self, request_id: str, preempted: bool = False) -> None:
        """Forget a request here and in the compactor's and forecast's scores (``preempted``: the
        table keeps it aside to resume)."""
        if self.compactor is not None:
            self.compactor.forget(request_id)
        if self.forecast_scores is not None:
            self.forecast_scores.forget(request_id)
        self.requests.release(request_id, preempted)

    # ---- attention (backend hook) -------------------------------------------------------------------
    def wants_layer(self, layer_name: str) -> bool:
        if not self.step.running or not self.requests or self._layout_failed:
            return False
        if not self.step.observed and not self.skipped.max_steps:
            return False
        return self.sampling.wants(layer_name)

    def note_kv_write(self, kv_cache: torch.Tensor, key: torch.Tensor, slot_mapping: torch.Tensor,
                      write: kv_keys.CacheWrite, *, num_kv_heads: int, block_size: int, head_dim: int) -> None:
        """Learn the cache layout once per process from the backend's own ``write`` (see
        :mod:`~growpage.vllm_plugin.keys`), and check it against the keys vLLM just wrote."""
        if self._layout is not None or self._layout_failed:
            return
        written = (slot_mapping[: key.shape[0]] >= 0).nonzero()
        if written.numel() == 0:
            return
        layout = kv_keys.probe_layout(write, kv_cache, num_kv_heads, block_size, head_dim)
        if layout is not None:
            token = int(written[0, 0])
            stored = kv_keys.read_token(kv_cache, int(slot_mapping[token]), layout).float()
            if not torch.allclose(stored, key[token].to(kv_cache.dtype).float(), atol=1e-3, rtol=1e-2):
                layout = None
        if layout is None:
            self._layout_failed = True
            self.counts.count_error()
            self.state = "unsupported_cache_layout"
            logger.error("growpage: this attention backend's KV cache layout (dtype %s, shape %s) does not "
                         "round-trip; attention observation and compaction are off in pid %d (vLLM runs "
                         "unchanged)", kv_cache.dtype, tuple(kv_cache.shape), os.getpid())
            return
        self._layout = layout
        self.state = ACTIVE
        self.device = kv_cache.device
        if self.summaries.device != kv_cache.device:  # summaries live beside the cache (nothing observed yet)
            self.summaries = SummaryBank(self.config, self.summaries.max_requests, kv_cache.device)

    def observe_layer(self, impl: AttentionImpl, query: torch.Tensor, kv_cache: torch.Tensor,
                      metadata: object) -> None:
        """Observe the newest query of each sampling request in one layer.

        Args:
            impl: vLLM's attention impl (``num_heads``, ``num_kv_heads``, ``scale``).
            query: ``[num_tokens, num_heads, head_dim]`` with RoPE applied.
            kv_cache: ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]``.
            metadata: the backend's attention metadata (read only where the runner's host-side
                batch state is missing; see :meth:`_batch_view`).
        """
        if self.settings.fault_injection and self._fault_injected("observe"):
            raise RuntimeError("growpage fault injection: observe")
        if self._layout is None:
            return
        plan = self._step_rows(metadata, query.device)
        if plan is None:
            return
        heads = self.sampling.heads(impl.num_heads, impl.num_kv_heads)
        kv_heads = heads // max(1, impl.num_heads // impl.num_kv_heads)
        # Only the newest queries are taken now (a copy: the next layer reuses vLLM's buffers); the
        # keys stay in the cache, and every observed layer is scored at once at the end of the step.
        query_rows = query.index_select(0, plan.query_tokens).index_select(1, self.sampling.on(heads, query.device))
        if not self.step.observed:  # a skipped step: its newest queries wait for the next observed one
            self.skipped.take(kv_cache.data_ptr(), query_rows)
            return
        if plan.window_sources is not None:
            query_rows = self.skipped.pool(kv_cache.data_ptr(), query_rows).index_select(0, plan.window_sources)
        window = len(plan.query_offsets[0])
        if window > 1:  # [R * W, H, hd] -> [R, H, W, hd]
            query_rows = query_rows.view(len(plan.rows), window, *query_rows.shape[1:]).transpose(1, 2)
        plan.pending.append(_PendingLayer(kv_cache, query_rows, float(impl.scale), kv_heads))

    def flush_observations(self) -> None:
        """Score this step's observed layers together (:func:`~growpage.vllm_plugin.scoring.score_step`):
        only the sampled heads' keys, in chunks of requests and blocks whose transient memory stays
        under ``observe_chunk_mib``, softmax and summaries per chunk (exact: each request's softmax
        is its own), on the cache's device without waiting for it. The cache still holds this
        step's keys (nothing writes it before the next step). Called by ``end_step``."""
        plan = self.step.plan
        if not isinstance(plan, _StepRows) or not plan.pending or self._layout is None:
            return
        pending, plan.pending = plan.pending, []
        assert plan.block_rows is not None  # built for every observed step
        scores = scoring.score_step(
            pending, plan.block_rows, plan.lengths, self._layout,
            cap_bytes=self.settings.observe_chunk_mib * 2 ** 20, token_mass=plan.wants_token_mass,
            mass_by_kv_head=self.sampling.per_kv_head,
            summarize=functools.partial(summarize_attention, num_bins=self.config.sts_num_bins),
            query_offsets=plan.query_offsets, summarize_newest=plan.window_sources is not None)
        # compaction scores: per token (and KV head), head mean, summed over layers
        plan.token_mass = scores.token_mass
        if self.compactor is not None and len(self.compactor.key_caches) != len(pending):
            self.compactor.key_caches = [layer.cache for layer in pending]  # redundancy reads their keys
        assert scores.bin_mass is not None and scores.entropy is not None
        for layer in range(len(pending)):
            self.step.layers.append(_LayerObservation(plan.rows, scores.bin_mass[layer], scores.entropy[layer]))

    def _step_rows(self, metadata: object, query_device: torch.device) -> _StepRows | None:
        """Who this step observes, and their index tensors, built at the step's first observed layer
        and reused by the others (the batch is the same in every layer)."""
        if self.step.planned:
            return self.step.plan
        self.step.planned = True
        assert self._layout is not None
        req_ids, starts, seq_lens, block_table = self._batch_view(metadata)
        num_rows = min(len(req_ids), len(seq_lens), len(starts) - 1)
        dropped = self.compactor.dropped if self.compactor is not None else {}
        batch_rows, lengths, observed = [], [], []
        rows: list[int] = []
        prompt_ends: list[int] = []  # positions in rows whose prompt's last token is in this step
        for i in range(num_rows):
            tracked = self.requests.get(req_ids[i])
            seq_len = int(seq_lens[i])
            logical = seq_len + dropped.get(req_ids[i], 0)
            if tracked is None or logical < tracked.prompt_tokens:
                continue  # a non-final prefill chunk
            if logical - (starts[i + 1] - starts[i]) < tracked.prompt_tokens:
                prompt_ends.append(len(rows))
            batch_rows.append(i)
            rows.append(tracked.row)
            lengths.append(seq_len)
            observed.append(tracked)
        if not rows:
            return None
        if len(rows) > self.settings.observe_max_requests:
            keep = rotating_sample(len(rows), self.settings.observe_max_requests, self.counts.steps_observed,
                                   first=prompt_ends)
            batch_rows, rows, lengths = ([values[n] for n in keep] for values in (batch_rows, rows, lengths))
            observed = [observed[n] for n in keep]
        max_len = max(lengths)
        # logical lengths and tokens compacted away: whether a skipped step's query still sees its keys
        cut = [dropped.get(t.request_id, 0) for t in observed]
        logical_lengths = [length + gone for length, gone in zip(lengths, cut, strict=True)]
        if not self.step.observed:  # a skipped step takes each request's newest query, scores nothing
            self.skipped.begin_skipped_step({
                t.request_id: TakenQuery(t, logical_lengths[n], cut[n], n) for n, t in enumerate(observed)})
            newest = to_device([starts[i + 1] - 1 for i in batch_rows], query_device)
            self.step.plan = _StepRows(rows=rows, lengths=lengths, observed=observed, max_len=max_len,
                                       query_tokens=newest, query_offsets=[[0]] * len(rows), block_rows=None,
                                       wants_token_mass=False)
            return self.step.plan
        # host-built indices, copied without waiting for the device (no sync on the step's hot path)
        index = to_device(batch_rows, block_table.device)
        block_rows = block_table.index_select(0, index)[:, :-(-max_len // self._layout.block_size)]
        tokens, offsets = query_window([(starts[i], starts[i + 1]) for i in batch_rows],
                                       self.settings.observation_window_tokens)
        window = self.skipped.plan(observed, [t.request_id for t in observed], logical_lengths, cut, offsets)
        self.step.plan = _StepRows(
            rows=rows, lengths=lengths, observed=observed, max_len=max_len,
            query_tokens=to_device(tokens, query_device), query_offsets=window.offsets if window.kept else offsets,
            block_rows=block_rows, wants_token_mass=any(self._keeps_scores(t) for t in observed),
            window_sources=to_device(window.sources, query_device) if window.kept else None,
            window_steps=window.queries if window.kept else None)
        return self.step.plan

    def _batch_view(self, metadata: object) -> StepBatch:
        """This step's request ids, query starts, physical ``seq_lens`` and block table, read once
        per step from the runner (either model runner: :func:`batch_view`)."""
        if self.step.batch is None:
            self.step.batch = batch_view(self.runner, metadata)
        return self.step.batch

    # ---- end of step ----------------------------------------------------------------------------------
    def end_step(self) -> None:
        """Score the step's observed layers, fold them into the summaries, keep compaction scores,
        and queue the observed requests' readings for the scheduler."""
        self.step.running = False
        self.guarded("attention observation", self.flush_observations)
        if self.step.observed:
            self.skipped.clear()  # scored now, or never to be (their requests left the window)
        plan = self.step.plan
        if isinstance(plan, _StepRows) and plan.token_mass is not None:
            for n, tracked in enumerate(plan.observed):
                mass = plan.token_mass[n, ..., :plan.lengths[n]]
                steps = plan.window_steps[n] if plan.window_steps is not None else 1
                if tracked.mode is Mode.ENFORCE and self.compactor is not None:
                    self.compactor.add_scores(tracked.request_id, mass, steps)
                elif tracked.mode is Mode.MONITOR and self.forecast_scores is not None:
                    self.forecast_scores.add(tracked.request_id, mass, steps)
        self.step.plan = None
        layers = self.step.layers
        if layers:
            rows = layers[0].rows
            same = [o for o in layers if o.rows == rows]
            bin_mass = torch.stack([o.bin_mass for o in same]).mean(0)
            entropy = torch.stack([o.entropy for o in same]).mean(0)
            self.summaries.observe(to_device(rows, self.summaries.device),
                                   bin_mass.to(self.summaries.device), entropy.to(self.summaries.device))
            self.counts.steps_observed += 1
            if isinstance(plan, _StepRows):
                self._queue_readings(plan.observed)
        self.step.layers = []

    def _keeps_scores(self, tracked: TrackedRequest) -> bool:
        """Whether ``tracked``'s per-token attention is kept: an enforced request's for its compactions,
        a monitored one's for the forecast's attention need."""
        if tracked.mode is Mode.ENFORCE:
            return self.compactor is not None
        return tracked.mode is Mode.MONITOR and self.forecast_scores is not None

    def _queue_attention_need(self, tracked: TrackedRequest) -> None:
        """The tokens the request's attention needs (``attention_coverage``), for its floor (enforced)
        or the forecast's (monitored)."""
        request_id = tracked.request_id
        if tracked.mode is Mode.MONITOR:
            assert self.forecast_scores is not None
            self.requests.attention_tokens[request_id] = self.forecast_scores.tokens_for_coverage(
                request_id, self._attention_coverage, self.config.sink_tokens, self.config.recent_window_tokens)
            return
        assert self.compactor is not None
        tokens = self.compactor.scores.tokens_for_coverage(request_id, self._attention_coverage,
                                                           self.config.sink_tokens, self.config.recent_window_tokens)
        self.requests.attention_tokens[request_id] = tokens
        append_enforce_log(self.compactor.log_path, {"attention_need": request_id, "tokens": tokens,
                                                     "dropped": self.compactor.dropped.get(request_id, 0)})

    def _queue_readings(self, observed: list[TrackedRequest]) -> None:
        """The observed requests' summaries and attention needs for the scheduler's next decisions:
        every ``readings_every`` observed steps (``readings_every_steps``), and at a request's first
        observation.

        A reading is a dozen small tensor operations and one device-to-host copy (about 3 ms on a
        loaded 2-core CPU, several per cent of a decode step), so it is not taken every step. A
        request's floor follows its attention need, which grows as it decodes: read once in 32
        engine steps (the default before ``readings_every_steps`` counted engine steps) the floor
        lagged a block behind and enforce compacted some of what the request still read
        (+0.025-0.031 nats/token against +0.004-0.012 at the default 8; docs/BENCHMARKS.md). The
        copy never waits for the device: it lands in pinned memory and is collected at the next
        step or report that finds it done (:meth:`_collect_readings`).
        """
        due = self.counts.steps_observed % self.sampling.readings_every == 0
        wanted = [t for t in observed if due or t.request_id not in self.requests.read_once]
        if not wanted:
            return
        self.requests.reading_copies.append(([t.request_id for t in wanted],
                                             self.summaries.read_later([t.row for t in wanted])))
        for tracked in wanted:
            self.requests.read_once.add(tracked.request_id)
            if self._attention_coverage > 0 and self._keeps_scores(tracked):
                self._queue_attention_need(tracked)

    def _collect_readings(self) -> None:
        """Readings whose copy has landed, oldest first (a newer one overwrites an older one),
        for requests still tracked; a copy still in flight waits for the next call."""
        copies = self.requests.reading_copies
        while copies and copies[0][1].ready():
            request_ids, copy = copies.pop(0)
            for request_id, reading in zip(request_ids, readings_from(copy.tolist()), strict=True):
                if request_id in self.requests:
                    self.requests.readings[request_id] = (reading.sts_density, reading.lts_entropy)


def _prompts_only(scheduler_output: object) -> bool:
    """Whether the scheduler says nothing is compressed at this step's decode boundaries
    (:attr:`~growpage.vllm_plugin.wire.StepPayload.prompts_only`: enforce's, or in monitor the
    forecast's, which runs enforce's gate on its shadows)."""
    payload = getattr(scheduler_output, PAYLOAD_ATTRIBUTE, None)
    return isinstance(payload, StepPayload) and payload.prompts_only
