"""The engine phases the tests in this folder share (see ``conftest.py``) and what they send."""

from __future__ import annotations

import os
import socket

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "List three colours:"]
MAX_TOKENS = 80
SHORT_TOKENS = 40  # with a prompt of <= 10 tokens: never past CAP_BLOCKS * 32
PREEMPT_TOKENS = 72
SHARED_PREFIX = ("You are a careful assistant for a small bakery. Answer in plain sentences, mention prices in "
                 "euros, keep each answer short, and never invent products that are not on the menu. The menu "
                 "has bread, croissants, apple pie, lemon cake and coffee. Question: ")
PREFIX_PROMPTS = [SHARED_PREFIX + q for q in ("What do you sell?", "How much is a croissant?",
                                              "Do you have cake?", "Is the coffee fresh?")]
MONITOR = {"base_pages": 2, "recent_window_tokens": 16, "sink_tokens": 4}
CAP_BLOCKS = 2
CAPPED = "capped"
TP_RANKS = 3
TP_THREADS_BIND = "0|1|0"
TP_FAULTY_RANK_INJECTION = "report@rank2"
PREEMPT_BLOCKS = 12  # 8 requests x 2 blocks do not fit: vLLM preempts
# Every boundary evicts: no growth past base_pages (even where the pool holds every request), low LTS
# is always "narrow demand", and no attention need raises the floor (vLLM's default
# attention_coverage would keep these short prompts whole).
# vLLM's own admission, observing every step, as these engines were built to check; the defaults
# (auto, one step in four) run in enforce_admission and make run.
EVICTING = {"mode": "enforce", "base_pages": CAP_BLOCKS, "recent_window_tokens": 16, "sink_tokens": 4,
            "growth_coefficient": 0.0, "lts_grow_threshold": 100.0, "attention_coverage": 0.0, "admission": "vllm",
            "observe_every_steps": 1, "grow_with_room_for_all": False, "compression_gate": False}


PER_HEAD_REDUNDANT = {"keep_sets": "kv_head", "shared_keep_fraction": 0.5, "redundancy_weight": 0.9}


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main_batch() -> dict:
    """The batch every engine runs, in one ``generate``: the same rows everywhere keep numerics equal.

    Rows (see :data:`ROWS`): ``A_capped``, the 4 ``PROMPTS`` in namespace ``capped``; ``A``, 2 of them
    with no namespace (monitored in the enforce engine); ``A_short``, 2 in ``capped`` but short
    enough never to reach the cap; ``P_capped``, 3 ``PREFIX_PROMPTS`` in ``capped`` (they share
    the first block of their prompt).
    """
    capped = {"growpage_namespace": CAPPED}
    prompts = PROMPTS + PROMPTS[:2] + PROMPTS[2:] + PREFIX_PROMPTS[:3]
    max_tokens = [MAX_TOKENS] * 6 + [SHORT_TOKENS] * 2 + [MAX_TOKENS] * 3
    extra_args = [capped] * 4 + [None] * 2 + [capped] * 5
    return {"name": "main", "prompts": prompts, "max_tokens": max_tokens, "extra_args": extra_args}


ROWS = {"A_capped": slice(0, 4), "A": slice(4, 6), "A_short": slice(6, 8), "P_capped": slice(8, 11)}


def phases(which: str | None = None) -> list[dict]:
    """The engines, in order. ``which="all"`` (``GROWPAGE_VLLM_TEST_ENGINES=all``) adds a monitor deployment."""
    which = which if which is not None else os.environ.get("GROWPAGE_VLLM_TEST_ENGINES", "")
    batch = main_batch()
    engines = [
        {"name": "off", "growpage": {"mode": "off", **MONITOR, "exporter_port": _free_port()}, "batches": [batch],
         "scrape": True},
        {"name": "enforce_cap", "batches": [batch], "scrape": True,
         "growpage": {**EVICTING, "enforce_namespaces": [CAPPED], "exporter_port": _free_port()},
         # after the batch, requests with a client's traceparent while vLLM traces (--otlp-traces-endpoint)
         "traced": {"prompts": PROMPTS[:2], "max_tokens": MAX_TOKENS, "extra_args": {"growpage_namespace": CAPPED}}},
        # the same contract at its default where the pool (vLLM's default space) holds every request at
        # its full length: nothing can be bought, so it must grow and leave the cache alone
        {"name": "enforce_room", "batches": [batch], "scrape": True,
         "growpage": {**EVICTING, "grow_with_room_for_all": True, "exporter_port": _free_port()}},
        # per-KV-head keep sets and R-KV's redundancy term, under preemption (vLLM's own admission,
        # which admits on prompts alone and so preempts)
        {"name": "enforce_preempt",
         "growpage": {**EVICTING, "exporter_port": -1, **PER_HEAD_REDUNDANT, "admission": "vllm"},
         "batches": [{"name": "main", "prompts": PROMPTS * 2, "max_tokens": PREEMPT_TOKENS}],
         "engine": {"num_gpu_blocks_override": PREEMPT_BLOCKS, "max_model_len": PREEMPT_BLOCKS * 32 - 32}},
        # the same pressure with the compression gate on (the plugin's default): 2-block requests
        # recompute for next to nothing and no compaction has spared a request's pages, so the gate
        # stays idle and vLLM preempts as it would alone, with no KV moved
        {"name": "enforce_gated", "growpage": {**EVICTING, "exporter_port": _free_port(), "compression_gate": True},
         "scrape": True,
         "batches": [{"name": "main", "prompts": PROMPTS * 2, "max_tokens": PREEMPT_TOKENS}],
         "engine": {"num_gpu_blocks_override": PREEMPT_BLOCKS, "max_model_len": PREEMPT_BLOCKS * 32 - 32}},
        # the same pressure under growth-aware admission: no preemption
        {"name": "enforce_admission", "growpage": {**EVICTING, "exporter_port": _free_port(), "admission": "projected",
                                                   "observe_every_steps": None},  # the default stride
         "scrape": True,
         "batches": [{"name": "main", "prompts": PROMPTS * 2, "max_tokens": PREEMPT_TOKENS}],
         "engine": {"num_gpu_blocks_override": PREEMPT_BLOCKS, "max_model_len": PREEMPT_BLOCKS * 32 - 32}},
    ]
    # Tensor parallelism: the packaged model's 9 query / 3 KV heads split over 3 ranks (2 does not
    # divide them); vLLM's CPU build binds one CPU per worker, and this machine has 2, so two share.
    gpus = _cuda_devices()
    if gpus == 0 or gpus >= TP_RANKS:
        # rank 2's reports fail (a report the scheduler never receives: nothing else changes), so its
        # faults must reach the scheduler's metrics another way
        engines.append({"name": "enforce_tp3", "batches": [batch], "scrape": True,
                        "growpage": {**EVICTING, "enforce_namespaces": [CAPPED], "exporter_port": _free_port(),
                                     "fault_injection": TP_FAULTY_RANK_INJECTION},
                        "engine": {"tensor_parallel_size": TP_RANKS},
                        "env": {} if gpus else {"VLLM_CPU_OMP_THREADS_BIND": TP_THREADS_BIND}})
    if gpus:  # CUDA graphs: vLLM's default mode, then piecewise (what gpctl serve and deploy/ pass)
        small = {"name": "main", "prompts": PROMPTS, "max_tokens": SHORT_TOKENS}
        for name, compilation in (("monitor_cudagraph_default", {}),
                                  ("monitor_piecewise", {"cudagraph_mode": "PIECEWISE"})):
            engines.append({"name": name, "batches": [small], "scrape": True,
                            "growpage": {"mode": "monitor", "exporter_port": _free_port(), **MONITOR},
                            "engine": {"enforce_eager": False, "compilation_config": compilation}})
        # an fp8 KV cache stores keys scaled: observation must say it is unsupported, never fail
        engines.append({"name": "monitor_fp8_kv", "batches": [small], "scrape": True,
                        "growpage": {"mode": "monitor", "exporter_port": _free_port(), **MONITOR},
                        "engine": {"kv_cache_dtype": "fp8"}})
    if which == "all":
        engines.insert(1, {"name": "monitor", "batches": [batch], "scrape": True,
                           "growpage": {"mode": "monitor", "exporter_port": _free_port(), **MONITOR}})
    return engines


DEFAULT_BLOCK_TOKENS = 8  # a few tokens: these engines check that vLLM starts and serves


def default_block_phases() -> list[dict]:
    """Two engines at vLLM's *own* block size (128 on CPU; no ``block_size`` passed) with the plugin's
    default settings: ``off``, then ``monitor``. Every other engine here runs at 32, where the
    default floor happened to be valid; at 128 it once stopped vLLM from starting. The monitor engine
    is also scraped while it loads the model (``scrape_during_start``)."""
    batch = {"name": "main", "prompts": PROMPTS[:2], "max_tokens": DEFAULT_BLOCK_TOKENS}
    engine = {"block_size": None, "num_gpu_blocks_override": 16}  # 16 blocks of 128: 2,048 tokens
    return [{"name": f"default_block_{mode}", "growpage": {"mode": mode, "exporter_port": _free_port()},
             "batches": [batch], "scrape": True, "engine": engine, "scrape_during_start": mode == "monitor"}
            for mode in ("off", "monitor")]


def rows(run: dict, name: str, field: str = "token_ids") -> list:
    """One slice of the main batch's results (see :func:`main_batch`)."""
    return run["batches"]["main"][field][ROWS[name]]


def samples(metrics: str, name: str) -> dict[str, float]:
    """``{series: value}`` of one metric family in a text exposition."""
    values = {}
    for line in metrics.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values
