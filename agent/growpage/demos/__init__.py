"""``gpctl demo``: one workload run twice, without and with GrowPage, side by side.

Modules, one way (the prompts are the benchmarks', ``growpage.bench.prompts``)::

    reference_engine.py  GrowPage's reference engine: full KV against GrowPage enforce, one process
    vllm_engine.py       vLLM alone against vLLM + GrowPage: one child engine per variant
                         (growpage.tooling.vllm_runs), renders the table
"""
