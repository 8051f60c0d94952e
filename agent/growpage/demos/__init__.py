"""``gpctl demo``: one workload run twice, without and with GrowPage, side by side.

Modules, one way::

    prompts.py           the reasoning and summary prompts (the benchmarks' workloads use them too)
    reference_engine.py  GrowPage's reference engine: full KV against GrowPage enforce, one process
    vllm_engine.py       vLLM alone against vLLM + GrowPage: starts one child per run, renders the table
    vllm_child.py        the child (``python -m growpage.demos.vllm_child SPEC``): one vLLM engine, JSON lines
"""
