"""Tooling around the runtime: what starts, loads and checks vLLM with GrowPage, never imported by it.

- ``serve``: ``gpctl serve --engine vllm``;
- ``fleet``: replicas behind vLLM's router (``gpctl fleet``);
- ``synthetic``: paged caches laid out as vLLM's worker lays them out (the torch-only GPU checks,
  the benchmarks);
- ``vllm_runs`` and ``vllm_child``: one vLLM engine per child interpreter (the demo, the benchmarks);
- ``forced_decoding``: the logits processor that forces a reference continuation (NLL increase).

The lowest layer of the tooling: ``growpage.bench`` (the GPU checks among the benchmarks),
``growpage.demos`` and ``growpage.gameday`` import it; it imports only the runtime
(``growpage.core``, ``growpage.vllm_plugin``, ``growpage.telemetry``, the reference engine's model
preparation), and the runtime imports none of them (``tests/test_layers.py``).
"""
