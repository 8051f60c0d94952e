"""Runs vLLM engines one after another in this process and prints one JSON result line per engine.

Started by ``conftest.py`` (a fresh interpreter keeps pytest's process free of vLLM state). Usage:
``python engine_runner.py SPEC.json``; the spec lists ``phases``, each an engine config and batches:
``{"name", "growpage", "engine": {LLM kwargs}, "env": {variables for this engine}, "batches": [{"name",
"prompts", "max_tokens" (one or one per prompt), "extra_args" (one per prompt)}], "scrape": bool}``
(scrape ``/metrics/growpage`` before the first request and after the batches). Per phase it prints
``GROWPAGE_PHASE {...}``.
"""

import gc
import json
import os
import sys
import threading
import time
import urllib.request


def _scrape(llm, port: int) -> str:
    from vllm import SamplingParams

    for _ in range(2):  # the exporter polls once per interval: two small steps drain the batch's stats
        time.sleep(1.2)
        llm.generate(["ok"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/growpage", timeout=10).read().decode()


class _Collector:
    """An OTLP/HTTP trace collector on a loopback port, in this process: keeps every span it receives."""

    def __init__(self):
        import http.server
        import threading

        spans = self.spans = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    service = next((a.value.string_value for a in resource_spans.resource.attributes
                                    if a.key == "service.name"), "")
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            spans.append({"name": span.name, "service": service, "trace_id": span.trace_id.hex(),
                                          "span_id": span.span_id.hex(), "parent_span_id": span.parent_span_id.hex(),
                                          "events": [e.name for e in span.events]})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}/v1/traces"


def _traced_batch(llm, traced: dict, collector: _Collector) -> dict:
    """Requests carrying a client's ``traceparent``, then the spans the collector received for them."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=traced["max_tokens"], ignore_eos=True,
                            extra_args=traced.get("extra_args"))
    trace_ids = {}
    for index, prompt in enumerate(traced["prompts"]):
        trace_id = f"{index + 1:032x}"
        trace_ids[f"traced-{index}"] = trace_id
        engine.add_request(f"traced-{index}", prompt, params,
                           trace_headers={"traceparent": f"00-{trace_id}-{index + 1:016x}-01"})
    while engine.has_unfinished_requests():
        engine.step()
    wanted = set(trace_ids.values())
    for _ in range(100):  # both processes' batch processors flush within a few of their 100 ms delays
        names = {(s["trace_id"], s["name"]) for s in collector.spans if s["trace_id"] in wanted}
        if all((t, "llm_request") in names and (t, "growpage.request") in names for t in wanted):
            break
        time.sleep(0.1)
    return {"trace_ids": trace_ids, "spans": [s for s in collector.spans if s["trace_id"] in wanted]}


def _poll_while_starting(port: int, found: dict, stop) -> None:
    """Scrape ``port`` until it answers with a component still ``starting`` (the model is loading)."""
    while not stop.is_set():
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/growpage", timeout=2).read().decode()
        except OSError:  # not bound yet
            body = ""
        if 'reason="starting"' in body:
            found["body"] = body
            return
        stop.wait(0.1)


def _engine_args(phase: dict) -> dict:
    """vLLM's engine arguments for ``phase``: the suite's small engine, then the phase's own."""
    # float32: vLLM's CPU kernels then take the `vec` path, whose outputs repeat exactly from engine
    # to engine; bf16 on AMX CPUs does not (runs were seen to part at near-ties), and these tests
    # compare token ids across engines. AMX itself is covered by the layout tests and the demo test.
    # On CUDA, float16 (FlashAttention has no float32 kernels).
    import torch

    engine = {"dtype": "float16" if torch.cuda.is_available() else "float32", "gpu_memory_utilization": 0.3,
              "enforce_eager": True, "block_size": 32, "max_model_len": 1024,
              "max_num_seqs": 16, "max_num_batched_tokens": 512, "seed": 0, "num_gpu_blocks_override": 256,
              **phase.get("engine", {})}
    if torch.cuda.is_available() and phase["growpage"].get("mode") == "enforce":
        engine.setdefault("async_scheduling", False)  # on by default on CUDA, and enforce needs it off
    return engine


def _generate(llm, batch: dict) -> dict:
    """One batch, greedy and to its full length: its time, token ids, prompt token ids and texts."""
    from vllm import SamplingParams

    count = len(batch["prompts"])
    extra = batch.get("extra_args") or [None] * count
    max_tokens = batch["max_tokens"] if isinstance(batch["max_tokens"], list) else [batch["max_tokens"]] * count
    params = [SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, extra_args=args)
              for tokens, args in zip(max_tokens, extra, strict=True)]
    started = time.monotonic()
    outputs = llm.generate(batch["prompts"], params, use_tqdm=False)
    return {"generate_s": time.monotonic() - started,
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "prompt_token_ids": [list(o.prompt_token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs]}


def run_phase(model: str, tmp: str, phase: dict) -> dict:
    from vllm import LLM

    name = phase["name"]
    load_log = os.path.join(tmp, f"loads-{name}.log")
    enforce_log = os.path.join(tmp, f"enforce-{name}.log")
    os.environ["GROWPAGE_VLLM_LOAD_LOG"] = load_log  # spawned EngineCore and worker inherit these
    os.environ["GROWPAGE_VLLM_ENFORCE_LOG"] = enforce_log
    saved_env = {key: os.environ.get(key) for key in phase.get("env", {})}
    os.environ.update(phase.get("env", {}))  # e.g. one CPU per tensor-parallel worker
    engine = _engine_args(phase)
    collector = None
    if phase.get("traced"):  # vLLM traces to a collector in this process; GrowPage joins its spans
        collector = _Collector()
        os.environ.update(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", OTEL_BSP_SCHEDULE_DELAY="100")
        engine["otlp_traces_endpoint"] = collector.endpoint
        engine["disable_log_stats"] = False  # vLLM's request span is built from its request stats
    port = phase["growpage"].get("exporter_port", -1)
    starting: dict = {}
    stop_polling = threading.Event()
    if phase.get("scrape_during_start") and port > 0:  # what the exporter serves while vLLM loads the model
        threading.Thread(target=_poll_while_starting, args=(port, starting, stop_polling), daemon=True).start()
    started = time.monotonic()
    try:
        llm = LLM(model=model, additional_config={"growpage": phase["growpage"]}, **engine)
    finally:
        stop_polling.set()
    result = {"name": name, "growpage": phase["growpage"], "start_s": time.monotonic() - started, "batches": {},
              "metrics_starting": starting.get("body", "")}
    try:
        result["cudagraph_mode"] = str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode)
    except AttributeError:
        result["cudagraph_mode"] = "unknown"
    result["block_size"] = llm.llm_engine.vllm_config.cache_config.block_size  # what vLLM chose
    if phase.get("scrape") and port > 0:  # the scheduler's exporter serves from start-up, before any request
        result["metrics_before"] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/growpage",
                                                          timeout=10).read().decode()
    try:
        for batch in phase["batches"]:
            result["batches"][batch["name"]] = _generate(llm, batch)
        if collector is not None:
            result["traced"] = _traced_batch(llm, phase["traced"], collector)
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
