"""One enforcing vLLM engine with KV cache events on, and a subscriber that reads them as a router does.

Started by ``test_vllm_kv_events.py`` in a fresh interpreter: ``python kv_events_runner.py MODEL TMP``.
The subscriber connects a ZMQ SUB socket to the engine's publisher (``kv_events_config`` with the zmq
publisher, as vLLM's router's ``kv_aware`` policy does), decodes each ``KVEventBatch`` and keeps the
block hashes it believes are cached: ``BlockStored`` adds, ``BlockRemoved`` removes,
``AllBlocksCleared`` empties. After the batch it prints one ``GROWPAGE_KV_EVENTS {...}`` line: what
the subscriber believes, what the engine's prefix cache really holds (EngineCore runs in this process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the event counts and the compactions GrowPage logged.
"""

import json
import os
import sys
import threading

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
SHARED_PREFIX = ("You are a careful assistant for a small bakery. Answer in plain sentences, mention prices in "
                 "euros, keep each answer short, and never invent products that are not on the menu. The menu "
                 "has bread, croissants, apple pie, lemon cake and coffee. Question: ")
PREFIX_PROMPTS = [SHARED_PREFIX + q for q in ("What do you sell?", "How much is a croissant?")]
MAX_TOKENS = 72  # past the 2-block cap (64 tokens): every request is compacted at least once
# Every boundary evicts down to 2 blocks (engine_cases.EVICTING)
GROWPAGE = {"mode": "enforce", "base_pages": 2, "recent_window_tokens": 16, "sink_tokens": 4,
            "growth_coefficient": 0.0, "lts_grow_threshold": 100.0, "attention_coverage": 0.0, "exporter_port": -1,
            "grow_with_room_for_all": False, "compression_gate": False}  # the pool holds every request: compact anyway
TOPIC = "kv-events"
QUIET_POLLS = 20  # 100 ms polls without a message: the publisher has drained


class RouterView:
    """The block hashes a ``kv_aware`` router would believe the engine has cached."""

    def __init__(self, endpoint: str):
        import zmq

        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.connect(endpoint)
        self.socket.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.live: set[str] = set()
        self.counts = {"stored": 0, "removed": 0, "cleared": 0, "removed_unknown": 0}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        quiet = 0
        while not (self.stop.is_set() and quiet >= QUIET_POLLS):
            if not self.socket.poll(100):
                quiet += 1
                continue
            quiet = 0
            _topic, _seq, payload = self.socket.recv_multipart()
            with self.lock:
                for event in decoder.decode(payload).events:
                    if isinstance(event, BlockStored):
                        self.counts["stored"] += len(event.block_hashes)
                        self.live.update(_key(h) for h in event.block_hashes)
                    elif isinstance(event, BlockRemoved):
                        self.counts["removed"] += len(event.block_hashes)
                        for block_hash in event.block_hashes:
                            if _key(block_hash) not in self.live:
                                self.counts["removed_unknown"] += 1
                            self.live.discard(_key(block_hash))
                    elif isinstance(event, AllBlocksCleared):
                        self.counts["cleared"] += 1
                        self.live.clear()

    def drain(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.socket.close(linger=0)
        self.context.term()


def _key(block_hash) -> str:
    return block_hash.hex() if isinstance(block_hash, bytes) else str(block_hash)


def engine_cached_hashes(llm) -> set[str]:
    """The hashes in the engine's prefix cache, in the events' external form."""
    from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    return {_key(maybe_convert_block_hash(get_block_hash(key))) for key in pool.cached_block_hash_to_block._cache}


def main(model: str, tmp: str) -> None:
    from vllm import LLM, SamplingParams

    # A socket file in this run's own directory, not a TCP port: a port found free and bound later by the
    # engine can be taken in between by another test's engine (CI saw "Address already in use").
    # ZeroMQ's PUB/SUB behaves the same over ipc:// as over tcp://.
    endpoint = f"ipc://{os.path.join(tmp, 'kv-events.sock')}"
    enforce_log = os.path.join(tmp, "enforce.log")
    os.environ["GROWPAGE_VLLM_ENFORCE_LOG"] = enforce_log
    view = RouterView(endpoint)  # connected before the engine binds: it sees every event
    llm = LLM(model=model, additional_config={"growpage": GROWPAGE}, dtype="float32", gpu_memory_utilization=0.3,
              enforce_eager=True, block_size=32, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
              num_gpu_blocks_override=64, seed=0, enable_prefix_caching=True,
              kv_events_config={"enable_kv_cache_events": True, "publisher": "zmq",
                                "endpoint": endpoint, "topic": TOPIC})
    prompts = PREFIX_PROMPTS + PROMPTS
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    view.drain()
    with open(enforce_log, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    result = {"counts": view.counts, "router_live": sorted(view.live),
              "engine_cached": sorted(engine_cached_hashes(llm)),
              "compactions": sum(1 for r in records if "compaction" in r),
              "generated": [len(o.outputs[0].token_ids) for o in outputs]}
    print("GROWPAGE_KV_EVENTS " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
