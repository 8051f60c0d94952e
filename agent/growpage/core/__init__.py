"""The GrowPage engine core: device-agnostic PyTorch, no vLLM or prometheus import.

Layers, one way: ``policy`` (pure decisions) and ``quantize`` / ``evict`` (pure tensor functions)
are used by ``manager`` (the actuator), which owns ``pool`` (page accounting), ``kv_store``
(page bytes) and ``summaries`` (STS/LTS), and reports to ``stats``.
"""
