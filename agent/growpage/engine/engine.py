"""The reference engine: our Llama forward pass over GrowPage's paged KV, continuous batching.

``LLMEngine`` is synchronous and single-threaded (the server drives it from one thread):
``add_request`` → ``step`` (schedule, one forward over every scheduled chunk, sample, stop checks)
→ ``RequestOutput`` deltas. Attention for every layer goes through ``GrowPageManager.attend``, so
GrowPage observes, grows and compresses every request exactly as it would inside vLLM.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from growpage.config import GrowPageConfig
from growpage.core.methods import GROWPAGE, KVMethod
from growpage.engine.kv.kv_store import DTYPES
from growpage.engine.kv.manager import GrowPageManager
from growpage.engine.llama import LlamaModel
from growpage.engine.request import FinishReason, Request
from growpage.engine.sampling import InvalidRequest, SamplingFault, SamplingParams, make_generator, sample
from growpage.engine.scheduler import ScheduledChunk, Scheduler

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Engine settings (GrowPage's own live in ``GrowPageConfig``).

    Attributes:
        model_dir: a prepared HF Llama-family folder (``gpctl model prepare``).
        kv_cache_mib: memory for KV pages; the page count follows from the model geometry.
        num_pages: overrides ``kv_cache_mib`` when set.
        max_num_seqs: running requests at most.
        max_num_batched_tokens: tokens per step at most (chunked prefill shares it).
        enable_prefix_caching: share full prompt pages between requests.
        dtype: compute dtype of the model ("float32" on CPU).
        device: "cpu" or "cuda".
        served_model_name: the model id clients use (defaults to the folder name).
        max_model_len: the context a request may use (prompt + output), at most the model's; a
            shorter one lets a smaller KV pool hold a full-context request (vLLM's --max-model-len).
    """

    model_dir: str
    kv_cache_mib: int = 256
    num_pages: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    served_model_name: str | None = None
    max_model_len: int | None = None

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model_dir).name


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request (a delta; ``finished`` on the last one)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None  # set when this request failed (finish_reason "error")


class LLMEngine:
    """A continuous-batching engine for one model on one device."""

    def __init__(self, config: EngineConfig, growpage: GrowPageConfig, model: LlamaModel | None = None,
                 tokenizer: Any = None, *,
                 method: KVMethod = GROWPAGE, clock: Callable[[], float] = time.monotonic):
        """``method`` and ``clock`` exist for benchmarks: a baseline KV method in place of
        GrowPage's contract, and a deterministic clock for the growth throttle."""
        self.config = config
        self.growpage_config = growpage
        self.model = model or LlamaModel.from_pretrained(config.model_dir, dtype=DTYPES[config.dtype],
                                                         device=config.device)
        self.tokenizer = tokenizer or _load_tokenizer(config.model_dir)
        geometry = self.model.config
        num_pages = config.num_pages or self._pages_for_memory(config.kv_cache_mib)
        self.manager = GrowPageManager(
            growpage, num_layers=geometry.num_layers, num_kv_heads=geometry.num_kv_heads,
            head_dim=geometry.head_dim, num_pages=num_pages, device=config.device,
            compute_dtype=DTYPES[config.dtype], max_requests=config.max_num_seqs + 1,
            method=method, clock=clock)
        self.scheduler = Scheduler(self.manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   enable_prefix_caching=config.enable_prefix_caching)
        self.eos_token_ids = set(geometry.eos_token_ids)
        self.max_model_len = min(config.max_model_len or geometry.max_position_embeddings,
                                 geometry.max_position_embeddings)
        self.scale = geometry.head_dim ** -0.5
        self._ids = itertools.count()
        self.requests: dict[str, Request] = {}
        self.num_steps = 0
        # Counted for the server's logs and stats: requests failed alone by a per-request fault,
        # and requests cut short because the pool could not hold them (finish_reason "truncated").
        self.num_failed_requests = 0
        self.num_truncated_requests = 0

    def _pages_for_memory(self, kv_cache_mib: int) -> int:
        g = self.model.config
        itemsize = torch.empty((), dtype=DTYPES[self.growpage_config.kv_dtype]).element_size()
        page_bytes = g.num_layers * self.growpage_config.block_size * 2 * g.num_kv_heads * g.head_dim * itemsize
        return max(1, kv_cache_mib * 2**20 // page_bytes)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, *,
                    request_id: str | None = None, namespace: str | None = None,
                    mode: str | None = None, teacher_token_ids: Sequence[int] | None = None) -> str:
        """Queue a request; raises :class:`InvalidRequest` (HTTP 400) when it can never run.

        ``teacher_token_ids`` (evaluation only) forces the output: each step appends the teacher's
        token instead of the sampled one and records its log-probability and whether greedy
        decoding would have chosen it; the request ends with the teacher's last token.
        """
        if not prompt_token_ids:
            raise InvalidRequest("the prompt is empty; send at least one token")
        if len(prompt_token_ids) >= self.max_model_len:
            raise InvalidRequest(f"the prompt is {len(prompt_token_ids)} tokens; this model's context is "
                                 f"{self.max_model_len} tokens: shorten the prompt")
        pages = self.manager.pages_for_prompt(len(prompt_token_ids))
        if pages > self.manager.pool.num_pages:
            raise InvalidRequest(f"the prompt needs {pages} KV pages but the pool has "
                                 f"{self.manager.pool.num_pages}: shorten the prompt or lower base_pages")
        if teacher_token_ids is not None and not teacher_token_ids:
            raise InvalidRequest("teacher_token_ids is empty; pass at least one token or None")
        if mode is not None and mode not in ("off", "monitor", "enforce"):
            raise InvalidRequest(f"growpage mode must be off, monitor or enforce, got {mode!r}")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise InvalidRequest(f"request id {request_id!r} is already in flight")
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
                          namespace=namespace, mode=mode, generator=make_generator(params),
                          teacher_token_ids=list(teacher_token_ids) if teacher_token_ids else None)
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Cancel a request (e.g. its client disconnected); its pages go back at once."""
        request = self.scheduler.abort(request_id)
        self.requests.pop(request_id, None)
        return request is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def waiting_request_ids(self) -> list[str]:
        """Requests queued but not running (never admitted, or preempted and waiting to recompute)."""
        return [r.request_id for r in self.scheduler.waiting]

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward pass over every scheduled chunk, sample, check stops."""
        schedule = self.scheduler.schedule()
        outputs = [self._final_output(r) for r in schedule.evicted_unfittable]
        for request in schedule.evicted_unfittable:
            self.requests.pop(request.request_id, None)
            self.num_truncated_requests += 1
            logger.warning("request %s truncated after %d output tokens: the KV pool cannot hold it "
                           "(finish_reason 'truncated'); give the pool more memory or lower max_model_len",
                           request.request_id, len(request.output_token_ids))
        if not schedule.chunks:
            return outputs
        self.num_steps += 1
        logits = self._forward(schedule.chunks)
        sampled_chunks = [c for c in schedule.chunks if c.completes_known_tokens]
        for chunk in schedule.chunks:
            chunk.request.num_computed_tokens += chunk.num_tokens
            if chunk.request.first_scheduled_s is None:
                chunk.request.first_scheduled_s = time.monotonic()
            completes_prompt = chunk.start < len(chunk.request.prompt_token_ids) <= chunk.start + chunk.num_tokens
            if completes_prompt:
                self.manager.compress_prompt(chunk.request.request_id)
            # A compressed prompt's pages no longer match their hashes: never publish them.
            if (self.scheduler.enable_prefix_caching and chunk.request.num_preemptions == 0
                    and completes_prompt and not self.manager.method.compress_prompt):
                prompt_hashes = chunk.request.block_hashes[:len(chunk.request.prompt_token_ids)
                                                            // self.growpage_config.block_size]
                self.manager.publish_prefix(chunk.request.request_id, prompt_hashes)
        if sampled_chunks:
            tokens = sample(logits, [c.request.params for c in sampled_chunks],
                            [c.request.generator for c in sampled_chunks])
            tokens = self._teacher_force(logits, sampled_chunks, tokens)
            now = time.monotonic()
            for chunk, token in zip(sampled_chunks, tokens, strict=True):
                # A fault here belongs to one request: fail it and let the batch carry on.
                try:
                    if isinstance(token, Exception):
                        raise token
                    outputs.append(self._append_token(chunk.request, token, now))
                except Exception as error:
                    outputs.append(self._fail(chunk.request, error))
        return outputs

    def _fail(self, request: Request, error: Exception) -> RequestOutput:
        logger.warning("request %s failed alone (%s: %s); the rest of the batch carries on",
                       request.request_id, type(error).__name__, error)
        self.num_failed_requests += 1
        if not request.is_finished:
            self.scheduler.finish(request, FinishReason.ERROR)
        self.requests.pop(request.request_id, None)
        return dataclasses.replace(self._final_output(request), finish_reason=FinishReason.ERROR.value,
                                   error=f"generation failed for this request: {error}")

    @staticmethod
    def _teacher_force(logits: torch.Tensor, chunks: list[ScheduledChunk],
                       tokens: list[int | SamplingFault]) -> list[int | SamplingFault]:
        forced = [i for i, c in enumerate(chunks) if c.request.teacher_token_ids is not None]
        if not forced:
            return tokens
        tokens = list(tokens)
        rows = torch.tensor(forced, dtype=torch.long, device=logits.device)
        log_probs = torch.log_softmax(logits[rows].float(), dim=-1)
        greedy = log_probs.argmax(dim=-1).tolist()
        for index, row in enumerate(forced):
            request = chunks[row].request
            teacher = (request.teacher_token_ids or [])[len(request.output_token_ids)]  # forced rows have them
            request.teacher_logprobs.append(float(log_probs[index, teacher]))
            request.teacher_greedy_matches.append(greedy[index] == teacher)
            tokens[row] = teacher
        return tokens

    def _forward(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        batch = [(c.request.request_id, c.num_tokens) for c in chunks]
        plan = self.manager.plan_step(batch)
        device = self.config.device
        token_ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        cols: list[int] = []
        logits_rows: list[int] = []
        for row, chunk in enumerate(chunks):
            ids = chunk.request.all_token_ids[chunk.start:chunk.start + chunk.num_tokens]
            token_ids.extend(ids)
            positions.extend(range(chunk.start, chunk.start + chunk.num_tokens))
            rows.extend([row] * chunk.num_tokens)
            cols.extend(range(chunk.num_tokens))
            if chunk.completes_known_tokens:
                logits_rows.append(len(token_ids) - 1)
        row_index = torch.tensor(rows, device=device)
        col_index = torch.tensor(cols, device=device)
        max_queries = max(c.num_tokens for c in chunks)
        g = self.model.config

        def attend(layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            padded = query.new_zeros(len(chunks), max_queries, g.num_q_heads, g.head_dim)
            padded[row_index, col_index] = query
            out = self.manager.attend(layer, plan, padded, key, value, self.scale)
            return out[row_index, col_index].to(query.dtype)

        with torch.inference_mode():
            logits = self.model(torch.tensor(token_ids, device=device), torch.tensor(positions, device=device),
                                attend, torch.tensor(logits_rows, dtype=torch.long, device=device))
        self.manager.finish_step(plan)
        return logits

    def _append_token(self, request: Request, token: int, now: float) -> RequestOutput:
        request.output_token_ids.append(token)
        request.token_times_s.append(now)
        if request.first_token_s is None:
            request.first_token_s = now
        previous_text = request.output_text
        text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        reason = None
        if token in self.eos_token_ids and not request.params.ignore_eos:
            reason = FinishReason.STOP
        for stop in request.params.stop:
            # Search from just before the new text so a stop string split across tokens is found.
            index = text.find(stop, max(0, len(previous_text) - len(stop)))
            if index != -1:
                text, reason = text[:index], FinishReason.STOP
                break
        teacher_done = (request.teacher_token_ids is not None
                        and len(request.output_token_ids) >= len(request.teacher_token_ids))
        if reason is None and (len(request.output_token_ids) >= request.params.max_tokens
                               or request.num_tokens >= self.max_model_len or teacher_done):
            reason = FinishReason.LENGTH
        # Hold back a trailing replacement char: the next token may complete a UTF-8 sequence.
        visible = text if reason is not None or not text.endswith("\ufffd") else text[:-1]
        if len(visible) < len(previous_text):
            visible = previous_text
        request.output_text = visible
        if reason is not None:
            self.scheduler.finish(request, reason)
            self.requests.pop(request.request_id, None)
        return RequestOutput(request_id=request.request_id, new_token_ids=[token],
                             new_text=visible[len(previous_text):], finished=reason is not None,
                             finish_reason=reason.value if reason else None,
                             num_prompt_tokens=len(request.prompt_token_ids),
                             num_output_tokens=len(request.output_token_ids))

    def _final_output(self, request: Request) -> RequestOutput:
        return RequestOutput(request_id=request.request_id, new_token_ids=[], new_text="", finished=True,
                             finish_reason=request.finish_reason.value if request.finish_reason else None,
                             num_prompt_tokens=len(request.prompt_token_ids),
                             num_output_tokens=len(request.output_token_ids))

    # ---- convenience --------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 **kwargs: Any) -> list[Request]:
        """Run prompts to completion (offline use, tests, benchmarks); returns finished requests."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp, **kwargs) for p, sp in zip(prompts, params_list, strict=True)]
        tracked = {rid: self.requests[rid] for rid in ids}
        while self.has_unfinished_requests():
            self.step()
        return [tracked[rid] for rid in ids]


def _load_tokenizer(model_dir: str) -> Any:
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
