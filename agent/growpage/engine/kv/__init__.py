"""The reference engine's KV home: its page pool, the page store (mixed precision, per-slot
positions and scores), paged attention over it, quantization, and the manager that runs the growth
contract on them (:class:`~growpage.engine.kv.manager.GrowPageManager`). Inside vLLM, vLLM owns
all of this; what both homes share lives in :mod:`growpage.core`."""
