"""Stage 1 (monitor) inside one vLLM worker: observe attention, summarise, decide, export.

Per step (driven by :mod:`growpage.vllm_plugin.runner_hooks` around ``execute_model``):

1. ``begin_step``: admit new requests (namespace and requested mode from
   ``SamplingParams.extra_args``), release finished and preempted ones.
2. per observed layer, ``observe_layer`` (from the attention backend, after vLLM's own kernel):
   for every request that samples this step, the newest query of ``observed_heads`` sampled heads
   against the request's cached keys (exact logits: RoPE is applied, keys read from the paged cache)
   -> :func:`~growpage.core.summaries.summarize_attention` -> one row per request.
3. ``end_step``: fold the layer-mean observation into the :class:`SummaryBank`; for each request
   that took a new block beyond its grant, run :func:`growpage.core.policy.decide` and record the
   decision it *would* take (monitor: vLLM's plain paging is what happens); poll telemetry.

In ``monitor`` KV and outputs are never touched. In ``enforce`` the observer also owns the worker's
:class:`~growpage.vllm_plugin.compactor.WorkerCompactor` (it applies the scheduler's compaction
plans, and the sampled-head attention it sees accumulates into per-token scores for the keep set);
the scheduler decides enforced requests' boundaries, so the observer records those decisions from
``SchedulerOutput.growpage`` instead of deciding itself, and sends its summary readings back.
Every entry point catches its own faults, counts them as
``growpage_agent_errors_total{component="plugin"}`` and lets vLLM carry on.

Admission, the boundary routine, the observed layers, the fault guard and the gauges are the
shared :class:`~growpage.core.controller.GrowthController`'s; this class supplies what only the
worker sees (the paged cache, the batch rows) and is the
:class:`~growpage.core.controller.StatsSource` :class:`~growpage.telemetry.TelemetryAgent` reads.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import GrowthController, PoolView, Reading, ceil_div
from growpage.core.devices import device_name
from growpage.core.stats import PoolGauges, StatsSnapshot
from growpage.core.summaries import SummaryBank, summarize_attention
from growpage.kv_size import kv_token_bytes
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin import scoring
from growpage.vllm_plugin.compactor import WorkerCompactor
from growpage.vllm_plugin.enforcer import OUTPUT_ATTRIBUTE
from growpage.vllm_plugin.settings import MODE_ARG, PluginSettings, request_namespace

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

PLUGIN_COMPONENT = "plugin"
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclasses.dataclass
class TrackedRequest:
    """What the observer keeps per running request beyond the controller's state (the summary row,
    lengths and blocks; summaries live in the bank)."""

    request_id: str
    row: int
    namespace: str | None
    mode: Mode
    prompt_tokens: int
    grant_pages: int
    seq_len: int = 0  # logical (vLLM's num_computed_tokens + this step's tokens)
    physical_len: int = 0  # tokens in the request's blocks (< seq_len once enforce evicted)
    pages_held: int = 0


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
    last_tokens: torch.Tensor  # [R] each request's newest query token in the batch
    block_rows: torch.Tensor  # [R, M] block-table rows, cut to the longest request
    lengths_t: torch.Tensor  # [R]
    valid: torch.Tensor  # [R, max_len] key slots inside each request
    key_positions: torch.Tensor  # [R, max_len] slot index, -1 past the request
    enforced: bool  # some observed request is enforced: accumulate compaction scores
    token_mass: torch.Tensor | None = None  # [R, max_len] attention summed over observed layers
    pending: list[_PendingLayer] = dataclasses.field(default_factory=list)  # layers observed, not yet scored


# One observed layer of this step: its cache view and its requests' newest sampled queries.
_PendingLayer = scoring.ObservedLayer


def layer_index(layer_name: str) -> int | None:
    """``model.layers.7.self_attn.attn`` -> 7."""
    match = _LAYER_INDEX.search(layer_name)
    return int(match.group(1)) if match else None


class VllmObserver:
    """The monitor of one worker process. See the module docstring.

    Args:
        config: GrowPage's config (``block_size`` = vLLM's).
        settings: the plugin's own settings.
        num_layers: decoder layers of the model.
        max_requests: summary rows (vLLM's ``max_num_seqs``).
        model: the served model name (the ``model`` label).
        engine_version: vLLM's version (``growpage_build_info``).
        rank: this worker's tensor-parallel rank. Every rank observes its own heads and compacts;
            only rank 0 serves metrics (the others would repeat its counts).
        clock: monotonic seconds.
    """

    def __init__(self, config: GrowPageConfig, settings: PluginSettings, *, num_layers: int,
                 max_requests: int, model: str, engine_version: str, rank: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.controller = GrowthController(config, num_layers=num_layers, clock=clock, logger=logger)
        self.config = self.controller.config
        self.settings = settings
        self.clock = clock
        self.model = model
        self.engine_version = engine_version
        self.rank = rank
        self.exports = rank == 0
        self.device = torch.device("cpu")  # the KV cache's, once seen
        self.stats = self.controller.stats
        # active until the first write shows the cache layout cannot be read (note_kv_write)
        self.stats.set_component_state("observer", "active")
        self.summaries = SummaryBank(config, max_requests)
        self.observed_layers = self.controller.observed_layers
        self.num_layers = num_layers
        self.requests: dict[str, TrackedRequest] = {}
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self.runner: Any = None
        self._in_step = False
        self._step: list[_LayerObservation] = []
        self._step_seq_lens: dict[str, int] | None = None
        self._step_batch: tuple[list[str], list[int], list[int], torch.Tensor] | None = None
        self._step_plan: _StepRows | bool | None = None  # False: nobody to observe this step
        self._layout: kv_keys.BlockLayout | None = None
        self._layout_failed = False
        self.num_pages = 0
        self.token_bytes = 0
        self.telemetry: Any = None
        self._telemetry_failed = False
        self.steps_observed = 0
        self._heads_by_count: dict[int, torch.Tensor] = {}
        self._wanted_layers: dict[str, bool] = {}
        self._steps_begun = 0
        self._observe_this_step = True
        # Stage 2: physical state of enforced requests (None unless the deployment runs enforce).
        self.compactor = WorkerCompactor(config, rank) if config.mode is Mode.ENFORCE else None
        self.degraded_total: dict[tuple[str, str], int] = {}
        self.pending_readings: dict[str, tuple[float, float]] = {}

    # ---- fault isolation --------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return device_name(self.device)

    def fault(self, what: str) -> None:
        """Count a caught fault (component ``plugin``); log the first one with its traceback."""
        self.controller.fault(PLUGIN_COMPONENT, f"{what} failed; vLLM carries on unchanged")

    def disable(self, reason: str, why: str) -> None:
        """Stop observing in this process for good, and say so (``growpage_agent_active`` = 0 with
        ``reason``, one error log line); vLLM runs unchanged and the exporter keeps serving."""
        self._layout_failed = True
        self.stats.set_component_state("observer", reason)
        logger.error("growpage: attention observation is off in pid %d (%s): %s", os.getpid(), reason, why)

    def guarded(self, what: str, function: Callable, *args, **kwargs) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception:
            self.fault(what)
            return None

    # ---- request lifecycle (runner hook) ------------------------------------------------------------
    def begin_step(self, runner: Any, scheduler_output: Any) -> None:
        self.runner = runner
        self._in_step = True
        self._step = []
        self._step_seq_lens = None
        self._step_batch = None
        self._step_plan = None
        self._steps_begun += 1
        self._observe_this_step = self._steps_begun % self.settings.observe_every_steps == 0
        for request_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._release(request_id, "finished")
        for request_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self._release(request_id, "preempted")
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            self._admit(new)
        payload = getattr(scheduler_output, OUTPUT_ATTRIBUTE, None)
        if payload is not None:
            self._record_enforcement(payload)

    def begin_compaction(self, runner: Any, scheduler_output: Any) -> None:
        """Stage 2, before ``_update_states``: apply the scheduler's plans (enforce only)."""
        if self.compactor is not None:
            self.compactor.begin_step(runner, scheduler_output, self._layout)

    def adjust_inputs(self, runner: Any) -> None:
        """Stage 2, after ``_prepare_inputs``: physical ``seq_lens`` and ``slot_mapping``."""
        if self.compactor is not None:
            self.compactor.adjust_inputs(runner)

    @property
    def ready_to_compact(self) -> bool:
        """Whether this worker can move tokens (the cache layout is known and supported)."""
        return self._layout is not None and not self._layout_failed

    def take_readings(self) -> dict[str, tuple[float, float]]:
        """``{req_id: (sts_density, lts_entropy)}`` of enforced requests, for the scheduler."""
        readings, self.pending_readings = self.pending_readings, {}
        return readings

    def _record_enforcement(self, payload: dict) -> None:
        """Count what the scheduler-side enforcer decided and did (it has no exporter of its own)."""
        state = payload.get("enforcer_state")
        if state:
            self.stats.set_component_state("enforcer", str(state))
        for _ in range(int(payload.get("errors", 0))):
            self.stats.record_error(PLUGIN_COMPONENT)
        granted = int(payload.get("pages_granted", 0))
        if granted:
            self.stats.record_grant(granted, 0.0)
        for event in payload.get("decisions", ()):
            self.stats.record_decision(event)
            if event.bytes_in:
                self.stats.record_compression(event.bytes_in, event.bytes_out)
        for decided, enforced in payload.get("degraded", ()):
            key = (decided, enforced)
            self.degraded_total[key] = self.degraded_total.get(key, 0) + 1

    def _admit(self, new: Any) -> None:
        if new.req_id in self.requests:
            self._release(new.req_id, "preempted")
        extra = getattr(getattr(new, "sampling_params", None), "extra_args", None) or {}
        namespace = request_namespace(extra)
        mode = self.controller.mode_for(namespace, extra.get(MODE_ARG))
        if mode is Mode.OFF or not self._free_rows:
            return
        row = self._free_rows.pop()
        self.summaries.reset([row])
        prompt_tokens = len(new.prompt_token_ids or ())
        prompt_pages = ceil_div(prompt_tokens, self.config.block_size)
        self.controller.admit(new.req_id, prompt_tokens=prompt_tokens, namespace=namespace, mode=mode,
                              cached_tokens=int(getattr(new, "num_computed_tokens", 0) or 0),
                              pages_granted=prompt_pages)
        self.requests[new.req_id] = TrackedRequest(
            new.req_id, row, namespace, mode, prompt_tokens,
            grant_pages=self.controller.grant_pages(prompt_tokens), pages_held=prompt_pages)

    def _release(self, request_id: str, reason: str) -> None:
        if self.compactor is not None:
            self.compactor.forget(request_id)
        tracked = self.requests.pop(request_id, None)
        if tracked is None:
            return
        self._refresh_readings([tracked])
        self._free_rows.append(tracked.row)
        self.controller.release(request_id, reason, num_tokens=tracked.seq_len)

    # ---- attention (backend hook) -------------------------------------------------------------------
    def wants_layer(self, layer_name: str) -> bool:
        if not self._in_step or not self.requests or self._layout_failed or not self._observe_this_step:
            return False
        wanted = self._wanted_layers.get(layer_name)
        if wanted is None:  # a layer's name never changes: parse it once
            index = layer_index(layer_name)
            wanted = self._wanted_layers[layer_name] = index is not None and index in self.observed_layers
        return wanted

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
            self.stats.record_error(PLUGIN_COMPONENT)
            self.stats.set_component_state("observer", "unsupported_cache_layout")
            logger.error("growpage: this attention backend's KV cache layout (dtype %s, shape %s) does not "
                         "round-trip; attention observation and compaction are off in pid %d (vLLM runs "
                         "unchanged)", kv_cache.dtype, tuple(kv_cache.shape), os.getpid())
            return
        self._layout = layout
        self.stats.set_component_state("observer", "active")
        self.num_pages = int(kv_cache.shape[0])
        self.device = kv_cache.device
        if self.summaries.device != kv_cache.device:  # summaries live beside the cache (nothing observed yet)
            self.summaries = SummaryBank(self.config, self.summaries.max_requests, kv_cache.device)
        self.token_bytes = kv_token_bytes(self.num_layers, num_kv_heads, head_dim, kv_cache.element_size())

    def observe_layer(self, impl: Any, query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any) -> None:
        """Observe the newest query of each sampling request in one layer.

        Args:
            impl: vLLM's attention impl (``num_heads``, ``num_kv_heads``, ``scale``).
            query: ``[num_tokens, num_heads, head_dim]`` with RoPE applied.
            kv_cache: ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]``.
            metadata: the backend's attention metadata (read only where the runner's host-side
                batch state is missing; see :meth:`_batch_view`).
        """
        if self.settings.fault_injection == "observe":
            raise RuntimeError("growpage fault injection: observe")
        if self._layout is None:
            return
        plan = self._step_rows(metadata, kv_cache.device, query.device)
        if plan is None:
            return
        heads = self._sampled_heads(impl.num_heads)
        kv_heads = heads // max(1, impl.num_heads // impl.num_kv_heads)
        # Only the newest queries are taken now (a copy: the next layer reuses vLLM's buffers); the
        # keys stay in the cache, and every observed layer is scored at once at the end of the step.
        query_rows = query.index_select(0, plan.last_tokens).index_select(1, heads.to(query.device))
        plan.pending.append(_PendingLayer(kv_cache, query_rows, float(impl.scale), kv_heads))

    def flush_observations(self) -> None:
        """Score this step's observed layers together (:func:`~growpage.vllm_plugin.scoring.score_step`):
        only the sampled heads' keys, in chunks of requests and blocks whose transient memory stays
        under ``observe_chunk_mib``, softmax and summaries per chunk (exact: each request's softmax
        is its own), on the cache's device without waiting for it. The cache still holds this
        step's keys (nothing writes it before the next step). Called by ``end_step``."""
        plan = self._step_plan
        if not isinstance(plan, _StepRows) or not plan.pending or self._layout is None:
            return
        pending, plan.pending = plan.pending, []
        scores = scoring.score_step(
            pending, plan.block_rows, plan.lengths, self._layout,
            cap_bytes=self.settings.observe_chunk_mib * 2 ** 20, token_mass=plan.enforced,
            summarize=functools.partial(summarize_attention, num_bins=self.config.sts_num_bins))
        plan.token_mass = scores.token_mass  # compaction scores: per token, head mean, summed over layers
        assert scores.bin_mass is not None and scores.entropy is not None
        for layer in range(len(pending)):
            self._step.append(_LayerObservation(plan.rows, scores.bin_mass[layer], scores.entropy[layer]))

    def _step_rows(self, metadata: Any, device: torch.device, query_device: torch.device) -> _StepRows | None:
        """Who this step observes, and their index tensors, built at the step's first observed layer
        and reused by the others (the batch is the same in every layer)."""
        if self._step_plan is not None:
            return self._step_plan or None
        assert self._layout is not None
        req_ids, starts, seq_lens, block_table = self._batch_view(metadata)
        num_rows = min(len(req_ids), len(seq_lens), len(starts) - 1)
        dropped = self.compactor.dropped if self.compactor is not None else {}
        # logical lengths (seq_lens are physical for compacted requests)
        self._step_seq_lens = {req_ids[i]: int(seq_lens[i]) + dropped.get(req_ids[i], 0) for i in range(num_rows)}
        batch_rows, rows, lengths, observed = [], [], [], []
        for i in range(num_rows):
            tracked = self.requests.get(req_ids[i])
            seq_len = int(seq_lens[i])
            if tracked is None or seq_len + dropped.get(req_ids[i], 0) < tracked.prompt_tokens:
                continue  # a non-final prefill chunk
            batch_rows.append(i)
            rows.append(tracked.row)
            lengths.append(seq_len)
            observed.append(tracked)
        if not rows:
            self._step_plan = False
            return None
        max_len = max(lengths)
        index = torch.tensor(batch_rows, dtype=torch.long, device=block_table.device)
        block_rows = block_table.index_select(0, index)[:, :-(-max_len // self._layout.block_size)]
        lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
        positions = torch.arange(max_len, device=device).expand(len(rows), max_len)
        valid = positions < lengths_t[:, None]
        self._step_plan = _StepRows(
            rows=rows, lengths=lengths, observed=observed, max_len=max_len,
            last_tokens=torch.tensor([starts[i + 1] - 1 for i in batch_rows], dtype=torch.long, device=query_device),
            block_rows=block_rows, lengths_t=lengths_t, valid=valid, key_positions=positions.masked_fill(~valid, -1),
            enforced=self.compactor is not None and any(t.mode is Mode.ENFORCE for t in observed))
        return self._step_plan

    def _lengths_without_observing(self) -> None:
        """On a step no layer observed, the requests' logical lengths from the runner's host
        mirrors, so boundaries are still counted on time."""
        runner = self.runner
        if runner is None or not isinstance(getattr(runner, "optimistic_seq_lens_cpu", None), torch.Tensor):
            return
        req_ids, _, seq_lens, _ = self._batch_view(None)
        dropped = self.compactor.dropped if self.compactor is not None else {}
        self._step_seq_lens = {r: int(n) + dropped.get(r, 0) for r, n in zip(req_ids, seq_lens, strict=False)}

    def _batch_view(self, metadata: Any) -> tuple[list[str], list[int], list[int], torch.Tensor]:
        """This step's request ids, query starts, physical ``seq_lens`` and block table, read once
        per step.

        Starts and lengths come from the model runner's host mirrors (``query_start_loc.cpu``,
        ``optimistic_seq_lens_cpu``, which the compactor keeps physical), so a GPU step never waits
        on a device-to-host copy; the block table is the backend's own (``FLASH_ATTN``,
        ``TRITON_ATTN``, ``CPU_ATTN``) or, where the metadata has none (``FLASHINFER``), the
        runner's table for the first KV cache group. Metadata fields are the fallback.
        """
        if self._step_batch is not None:
            return self._step_batch
        runner = self.runner
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
        block_table = getattr(metadata, "block_table", None)
        if not isinstance(block_table, torch.Tensor):
            block_table = batch.block_table.block_tables[0].get_device_tensor(num_reqs)
        self._step_batch = (req_ids, starts, seq_lens, block_table)
        return self._step_batch

    def _sampled_heads(self, num_heads: int) -> torch.Tensor:
        """The sampled query heads, evenly spaced (built once per head count: this runs every layer)."""
        heads = self._heads_by_count.get(num_heads)
        if heads is None:
            count = min(self.settings.observed_heads, num_heads)
            heads = torch.tensor(sorted({i * num_heads // count for i in range(count)}), dtype=torch.long)
            self._heads_by_count[num_heads] = heads
        return heads

    # ---- end of step ----------------------------------------------------------------------------------
    def end_step(self) -> None:
        self._in_step = False
        self.guarded("attention observation", self.flush_observations)
        plan = self._step_plan
        if isinstance(plan, _StepRows) and plan.token_mass is not None and self.compactor is not None:
            for n, tracked in enumerate(plan.observed):
                if tracked.mode is Mode.ENFORCE:
                    self.compactor.add_scores(tracked.request_id, plan.token_mass[n, :plan.lengths[n]])
        self._step_plan = None
        if self._step:
            rows = self._step[0].rows
            same = [o for o in self._step if o.rows == rows]
            bin_mass = torch.stack([o.bin_mass for o in same]).mean(0)
            entropy = torch.stack([o.entropy for o in same]).mean(0)
            self.summaries.observe(torch.tensor(rows, dtype=torch.long, device=self.summaries.device),
                                   bin_mass.to(self.summaries.device), entropy.to(self.summaries.device))
            self.steps_observed += 1
        self._step = []
        if self._step_seq_lens is None and self.requests:  # no layer observed this step
            self.guarded("step lengths", self._lengths_without_observing)
        if self._step_seq_lens:
            self._advance(self._step_seq_lens)
        self._step_seq_lens = None
        self._ensure_telemetry()
        if self.telemetry is not None:
            self.telemetry.on_step()

    def _advance(self, seq_lens: dict[str, int]) -> None:
        block_size = self.config.block_size
        crossing: list[tuple[TrackedRequest, int]] = []
        for request_id, seq_len in seq_lens.items():
            tracked = self.requests.get(request_id)
            if tracked is None:
                continue
            tracked.seq_len = max(tracked.seq_len, seq_len)
            tracked.physical_len = self.compactor.physical_length(request_id, tracked.seq_len) \
                if self.compactor is not None else tracked.seq_len
            pages = ceil_div(tracked.physical_len, block_size)
            if tracked.mode is Mode.ENFORCE:
                tracked.pages_held = pages  # the scheduler decided and counted this boundary
                continue
            if pages > tracked.pages_held:
                added = pages - tracked.pages_held
                if tracked.pages_held >= tracked.grant_pages:
                    crossing.append((tracked, added))
                else:
                    self.stats.record_grant(added, 0.0)
                    tracked.pages_held = pages
        enforced = [t for t in self.requests.values() if t.mode is Mode.ENFORCE and t.request_id in seq_lens]
        if enforced:
            for tracked, reading in zip(enforced, self.summaries.read([t.row for t in enforced]), strict=True):
                self.pending_readings[tracked.request_id] = (reading.sts_density, reading.lts_entropy)
        if crossing:
            self._refresh_readings([t for t, _ in crossing])
            for tracked, added in crossing:
                self._decide(tracked, added)

    def _decide(self, tracked: TrackedRequest, added: int) -> None:
        """Monitor: run the contract on a boundary vLLM's paging has already crossed; record what
        GrowPage would have done."""
        config = self.config
        evictable = tracked.seq_len - config.sink_tokens - config.recent_window_tokens
        call = self.controller.decide(
            tracked.request_id, pages_held=tracked.pages_held,
            pool=PoolView(max(0, self.num_pages - self._pages_used())),
            can_quantize=False,  # kv_cache_dtype is deployment-wide in vLLM: no per-request quantization
            can_evict=evictable >= config.evict_min_pages * config.block_size)
        tracked.pages_held += added  # monitor: vLLM's plain paging took the block(s)
        self.stats.record_grant(added, 0.0)
        self.controller.record_decision(call, kind=call.decision.action, enforced=False,
                                        pages_after=tracked.pages_held)

    def _refresh_readings(self, tracked: list[TrackedRequest]) -> None:
        """Hand the controller the latest summaries of ``tracked`` (those observed at least once)."""
        for request, reading in zip(tracked, self.summaries.read([t.row for t in tracked]), strict=True):
            if reading.steps_observed:
                self.controller.update_reading(request.request_id,
                                               Reading(reading.sts_density, reading.lts_entropy))

    def _pages_used(self) -> int:
        return sum(t.pages_held for t in self.requests.values())

    # ---- stats source for TelemetryAgent ---------------------------------------------------------------
    def make_stats(self) -> StatsSnapshot:
        """Get-and-reset stats (the TelemetryAgent is the only caller)."""
        return self.controller.make_stats(self._gauges())

    def _gauges(self) -> PoolGauges:
        tracked = list(self.requests.values())
        self._refresh_readings(tracked)
        used = sum(t.pages_held for t in tracked)
        live = sum(t.physical_len or t.seq_len for t in tracked)
        block_size = self.config.block_size
        return self.controller.pool_gauges(
            num_pages=self.num_pages, pages_free=max(0, self.num_pages - used), pages_reserved=0,
            pages_used=used, live_tokens=live, granted_token_slots=used * block_size,
            used_token_slots=used * block_size, logical_bytes=sum(t.seq_len for t in tracked) * self.token_bytes,
            stored_bytes=live * self.token_bytes, tracked=[t.request_id for t in tracked])

    def _ensure_telemetry(self) -> None:
        if self.telemetry is not None or self._telemetry_failed or not self.exports:
            return
        try:
            from growpage.telemetry import TelemetryAgent

            self.telemetry = TelemetryAgent.from_env(self, model=self.model, engine="vllm",
                                                     engine_version=self.engine_version)
            if self.compactor is not None:
                from growpage.vllm_plugin.metrics import DegradedDecisionsCollector

                self.telemetry.registry.register(DegradedDecisionsCollector(self, self.model))
        except Exception:
            self._telemetry_failed = True
            self.fault("starting telemetry")
            return
        if self.settings.exporter_enabled:
            try:
                exporter = self.telemetry.serve(self.settings.exporter_port, self.settings.exporter_host)
                logger.info("growpage: /metrics/growpage served at %s (pid %d)", exporter.url, os.getpid())
            except OSError:
                self.fault(f"binding the exporter to port {self.settings.exporter_port}")


