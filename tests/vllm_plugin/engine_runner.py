"""Runs vLLM engines one after another in this process and prints one JSON result line per engine.

Started by ``conftest.py`` (a fresh interpreter keeps pytest's process free of vLLM state). Usage:
``python engine_runner.py SPEC.json``; the spec lists ``phases``, each an engine config and batches:
``{"name", "growpage", "engine": {LLM kwargs}, "env": {variables for this engine}, "batches": [{"name", "prompts", "max_tokens" (one or
one per prompt), "extra_args" (one per prompt)}], "scrape": bool}`` (scrape ``/metrics/growpage`` before the
first request and after the batches). Per phase it prints ``GROWPAGE_PHASE {...}``.
"""

import gc
import json
import os
import sys
import time
import urllib.request


def _scrape(llm, port: int) -> str:
    from vllm import SamplingParams

    for _ in range(2):  # the exporter polls once per interval: two small steps drain the batch's stats
        time.sleep(1.2)
        llm.generate(["ok"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/growpage", timeout=10).read().decode()


def run_phase(model: str, tmp: str, phase: dict) -> dict:
    from vllm import LLM, SamplingParams

    name = phase["name"]
    load_log = os.path.join(tmp, f"loads-{name}.log")
    enforce_log = os.path.join(tmp, f"enforce-{name}.log")
    os.environ["GROWPAGE_VLLM_LOAD_LOG"] = load_log  # spawned EngineCore and worker inherit these
    os.environ["GROWPAGE_VLLM_ENFORCE_LOG"] = enforce_log
    saved_env = {key: os.environ.get(key) for key in phase.get("env", {})}
    os.environ.update(phase.get("env", {}))  # e.g. one CPU per tensor-parallel worker
    # float32: vLLM's CPU kernels then take the `vec` path, whose outputs repeat exactly from engine
    # to engine; bf16 on AMX CPUs does not (runs were seen to part at near-ties), and these tests
    # compare token ids across engines. AMX itself is covered by the layout tests and the demo test.
    # On CUDA, float16 (FlashAttention has no float32 kernels).
    import torch

    engine = {"dtype": "float16" if torch.cuda.is_available() else "float32", "gpu_memory_utilization": 0.3, "enforce_eager": True, "block_size": 32,
              "max_model_len": 1024,
              "max_num_seqs": 16, "max_num_batched_tokens": 512, "seed": 0, "num_gpu_blocks_override": 256,
              **phase.get("engine", {})}
    if torch.cuda.is_available() and phase["growpage"].get("mode") == "enforce":
        engine.setdefault("async_scheduling", False)  # on by default on CUDA, and enforce needs it off
    started = time.monotonic()
    llm = LLM(model=model, additional_config={"growpage": phase["growpage"]}, **engine)
    result = {"name": name, "growpage": phase["growpage"], "start_s": time.monotonic() - started, "batches": {}}
    try:
        result["cudagraph_mode"] = str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode)
    except AttributeError:
        result["cudagraph_mode"] = "unknown"
    port = phase["growpage"].get("exporter_port", -1)
    if phase.get("scrape") and port > 0:  # the scheduler's exporter serves from start-up, before any request
        result["metrics_before"] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/growpage",
                                                          timeout=10).read().decode()
    try:
        for batch in phase["batches"]:
            count = len(batch["prompts"])
            extra = batch.get("extra_args") or [None] * count
            max_tokens = batch["max_tokens"] if isinstance(batch["max_tokens"], list) else [batch["max_tokens"]] * count
            params = [SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, extra_args=args)
                      for tokens, args in zip(max_tokens, extra, strict=True)]
            started = time.monotonic()
            outputs = llm.generate(batch["prompts"], params, use_tqdm=False)
            result["batches"][batch["name"]] = {
                "generate_s": time.monotonic() - started,
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
                "prompt_token_ids": [list(o.prompt_token_ids) for o in outputs],
                "texts": [o.outputs[0].text for o in outputs]}
        result["metrics"] = _scrape(llm, port) if phase.get("scrape") and port > 0 else ""
    finally:
        del llm
        gc.collect()
        time.sleep(1.0)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result["loads"] = _lines(load_log)
    result["enforce_log"] = [json.loads(line) for line in _lines(enforce_log, split=False)]
    return result


def _lines(path: str, split: bool = True) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return text.split() if split else text.splitlines()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as spec_file:
        spec = json.load(spec_file)
    for phase in spec["phases"]:
        print("GROWPAGE_PHASE " + json.dumps(run_phase(spec["model"], spec["tmp"], phase)), flush=True)
