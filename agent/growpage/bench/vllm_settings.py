"""``gpctl bench vllm``'s settings: what each part runs, in one record every part reads.

Apart from :mod:`growpage.bench.vllm` (which runs the parts) so that the parts
(:mod:`~growpage.bench.goodput`, :mod:`~growpage.bench.sweep`, :mod:`~growpage.bench.headline`,
:mod:`~growpage.bench.forecast`) import their settings without importing the runner back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from growpage.core.methods import VLLM_CAP_NAMES
from growpage.vllm_plugin.settings import resolved_settings

SWEEP_METHODS = ("growpage", *VLLM_CAP_NAMES)
COVERAGE_MARK = "+cov"  # in a sweep variant's name: a point of GrowPage's coverage axis
VARIANT_MARK = "/"  # in a sweep variant's name: the settings variant it ran (``growpage@2/heads``)


@dataclasses.dataclass(frozen=True)
class SweepVariant:
    """More plugin settings for some methods' points: ``label[@method,method]:key=value,key=value``.

    Attributes:
        label: the suffix of the points' names (``growpage@2/<label>``).
        settings: ``additional_config["growpage"]`` keys added to those points.
        methods: the swept methods it applies to (empty: all of them).
    """

    label: str
    settings: Mapping[str, Any]
    methods: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> SweepVariant:
        """``heads:keep_sets=kv_head`` or ``rkv@growpage:redundancy_weight=0.9`` (values read as
        JSON where they parse: 2, 0.9, true). Raises ValueError with the expected form."""
        head, separator, pairs = text.partition(":")
        label, _, methods = head.partition("@")
        settings: dict[str, Any] = {}
        for pair in filter(None, pairs.split(",")):
            key, equals, value = pair.partition("=")
            if not equals or not key:
                settings = {}
                break
            try:
                settings[key] = json.loads(value)
            except json.JSONDecodeError:
                settings[key] = value
        if not separator or not label or not settings or VARIANT_MARK in label or COVERAGE_MARK in label:
            raise ValueError(f"sweep variant {text!r} is not LABEL[@METHOD,...]:KEY=VALUE[,KEY=VALUE]; "
                             "e.g. heads:keep_sets=kv_head or rkv@growpage:redundancy_weight=0.9")
        unknown = sorted(set(filter(None, methods.split(","))) - set(SWEEP_METHODS))
        if unknown:
            raise ValueError(f"sweep variant {text!r} names {unknown[0]!r}; its methods are among "
                             f"{', '.join(SWEEP_METHODS)}")
        return cls(label, settings, tuple(filter(None, methods.split(","))))

    def applies_to(self, method: str) -> bool:
        return not self.methods or method in self.methods


VARIANTS = ("vllm", "growpage", "limit")
PARTS = ("pressure", "overhead", "sampling", "retrieval", "accuracy", "sweep", "headline", "forecast", "mixed")


@dataclasses.dataclass(frozen=True)
class VllmBenchSettings:
    """Workload sizes. Defaults: about 12 minutes on 2 CPU cores (8 engine starts).

    Attributes:
        requests: concurrent reasoning requests per trace.
        max_tokens: new tokens per request.
        kv_blocks: the KV space of ``vllm`` and ``growpage``, in blocks (one is vLLM's null block).
        base_pages: GrowPage's floor per request, in blocks; None: the shipped floor
            (:func:`~growpage.vllm_plugin.settings.default_base_pages`, 128 tokens), so every part
            runs the defaults ``gpctl serve`` ships unless told otherwise.
        seeds: one trace per seed.
        block_size: vLLM's block size.
        overhead_batch, overhead_tokens, repeats: the monitor-overhead workload.
        growpage: more ``additional_config["growpage"]`` keys for the GrowPage runs (none: the
            shipped defaults, as ``gpctl serve`` and ``make run`` start them).
        threads: ``OMP_NUM_THREADS`` for the engines (None: the environment's).
        parts: ``pressure`` (the traces), ``overhead``, ``sampling`` (monitor sampled against full
            observation), ``retrieval`` (retrieval under KV pressure)
            and/or ``accuracy`` (full KV's accuracy on every retrieval family).
        repeats: also the interleaved rounds of every pressure, retrieval, headline and forecast variant.
        retrieval_families, retrieval_context_tokens, retrieval_depths: the retrieval workload
            (``growpage.bench.tasks``; one request per family, length and depth, seed ``seeds[0]``).
        retrieval_kv_share: its KV space as a share of what every request needs at once (the
            ``mixed`` part's too).
        mixed_reasoning: reasoning prompts (``max_tokens`` each) the ``mixed`` part sends among the
            retrieval questions (:mod:`growpage.bench.mixed`).
        sweep_pages: the floors of GrowPage and the fixed caps' budgets of the ``sweep`` part
            (:mod:`growpage.bench.sweep`), in blocks.
        sweep_coverage: ``attention_coverage`` values run as more GrowPage points of the ``sweep``
            part, at the lowest of ``sweep_pages`` (none by default).
        sweep_methods: the methods of the ``sweep`` part (GrowPage and the fixed caps by default).
        sweep_variants: more settings run as more points of the ``sweep`` part
            (:class:`SweepVariant`: ablations in one interleaved run).
        tuned_max_num_seqs: the ``max_num_seqs`` values vLLM alone also runs with in the
            ``headline`` part (:mod:`growpage.bench.headline`); the best is *tuned vLLM alone*.
        headline_caps_at_floor: the ``headline`` part also runs each fixed cap at GrowPage's floor.
        headline_coverage: ``attention_coverage`` values the ``headline`` part also runs GrowPage at
            (``growpage@coverageC``, the shipped defaults otherwise): the operator's table of speed
            against NLL increase, and where half the attainable gain is bought (none by default).
        headline_variants: more settings the ``headline`` part also runs GrowPage with
            (``growpage/<label>``, the shipped defaults otherwise), interleaved with the rest: an
            A/B of a setting against the defaults in the same rounds.
        headline_skip: variants the ``headline`` part leaves out (``monitor``, ``growpage@room``, a
            ``CAP@eq``...: a shorter run when their answer is already known); ``vllm``, ``growpage``
            and ``limit`` always run, as the verdict reads them.
        retrieval_skip: variants the ``retrieval`` and ``mixed`` parts leave out (each ``CAP@N``,
            ``vllm@seqsN``, ``growpage@projected``, ``limit``); ``vllm`` and ``growpage`` always run.
    """

    requests: int = 16
    max_tokens: int = 192
    kv_blocks: int = 40
    base_pages: int | None = None
    seeds: tuple[int, ...] = (0, 1)
    block_size: int = 32
    overhead_batch: int = 8
    overhead_tokens: int = 128
    repeats: int = 3
    growpage: dict = dataclasses.field(default_factory=dict)
    threads: int | None = None
    parts: tuple[str, ...] = ("pressure", "overhead", "sampling")
    retrieval_families: tuple[str, ...] = ("code", "multikey")
    retrieval_context_tokens: tuple[int, ...] = (512, 1024)
    retrieval_depths: tuple[float, ...] = (0.1, 0.35, 0.65, 0.9)
    retrieval_kv_share: float = 0.25
    mixed_reasoning: int = 8
    sweep_pages: tuple[int, ...] = (2, 4, 6)
    sweep_coverage: tuple[float, ...] = ()
    sweep_methods: tuple[str, ...] = SWEEP_METHODS
    sweep_variants: tuple[SweepVariant, ...] = ()
    tuned_max_num_seqs: tuple[int, ...] = (4, 6)
    headline_caps_at_floor: bool = False
    headline_coverage: tuple[float, ...] = ()
    headline_variants: tuple[SweepVariant, ...] = ()
    headline_skip: tuple[str, ...] = ()
    retrieval_skip: tuple[str, ...] = ()

    @classmethod
    def quick(cls) -> VllmBenchSettings:
        return cls(requests=6, max_tokens=80, kv_blocks=14, seeds=(0,), overhead_batch=2,
                   overhead_tokens=16, repeats=1, retrieval_families=("code",), retrieval_context_tokens=(512,),
                   sweep_pages=(2,), tuned_max_num_seqs=(2,), mixed_reasoning=2)

    def growpage_config(self, mode: str = "enforce") -> dict:
        """``additional_config["growpage"]`` of a GrowPage run: the shipped defaults in ``mode``, with
        ``base_pages`` where set and :attr:`growpage`'s keys over them."""
        floor = {} if self.base_pages is None else {"base_pages": self.base_pages}
        return {"mode": mode, **floor, **self.growpage}

    @property
    def floor_pages(self) -> int:
        """GrowPage's floor in blocks as its runs resolve it (the fixed caps' budget at the floor)."""
        return int(resolved_settings(self.growpage_config(), self.block_size)["growpage"]["base_pages"])

    def limit_blocks(self, prompt_tokens: int) -> int:
        """Blocks for every request at full length (plus vLLM's null block)."""
        per_request = -(-(prompt_tokens + self.max_tokens) // self.block_size)
        return self.requests * per_request + 1
