"""``gpctl serve``: the OpenAI-compatible server of the reference engine with GrowPage on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from growpage.errors import GrowPageError


def serve(
    model: Annotated[Path | None, typer.Option(help="A prepared HF Llama-family folder. "
                                                    "Default: the packaged model (`gpctl model prepare`).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0 inside a pod).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    engine: Annotated[str, typer.Option(help="reference (this engine) or vllm.")] = "reference",
    mode: Annotated[str | None, typer.Option(help="GrowPage mode: off | monitor | enforce.")] = None,
    config: Annotated[Path | None, typer.Option(envvar="GROWPAGE_CONFIG",
                                                help="GrowPage config file (YAML/JSON/TOML).")] = None,
    base_pages: Annotated[int | None, typer.Option(help="Pages granted per request at admission.")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per page.")] = None,
    kv_cache_mib: Annotated[int, typer.Option(min=1, help="Memory for KV pages.")] = 256,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Running requests at most.")] = 32,
    max_num_batched_tokens: Annotated[int, typer.Option(min=1, help="Tokens per step at most.")] = 512,
    served_model_name: Annotated[str | None, typer.Option(help="Model id for clients.")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Also serve /metrics/growpage on this port.")] = None,
    no_prefix_caching: Annotated[bool, typer.Option("--no-prefix-caching")] = False,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics/growpage."""
    if engine != "reference":
        raise GrowPageError(f"--engine {engine} is not available in this release; use --engine reference "
                            "(the vLLM plugin is tracked separately)")
    import uvicorn

    from growpage.config import load_config
    from growpage.engine.engine import EngineConfig
    from growpage.engine.model_prep import resolve_model_dir
    from growpage.engine.serving import build_stack

    overrides = {key: value for key, value in (("mode", mode), ("base_pages", base_pages),
                                                ("block_size", block_size)) if value is not None}
    growpage_config = load_config(config, overrides=overrides)
    model_dir = resolve_model_dir(model)
    stack = build_stack(EngineConfig(model_dir=str(model_dir), kv_cache_mib=kv_cache_mib, max_num_seqs=max_num_seqs,
                                     max_num_batched_tokens=max_num_batched_tokens,
                                     enable_prefix_caching=not no_prefix_caching,
                                     served_model_name=served_model_name),
                        growpage_config, metrics_port=metrics_port)
    typer.echo(f"serving {stack.engine.config.model_name} with GrowPage mode={growpage_config.mode.value} "
               f"on http://{host}:{port} ({stack.engine.manager.pool.num_pages} KV pages)", err=True)
    try:
        uvicorn.run(stack.app, host=host, port=port, log_level="warning")
    finally:
        stack.close()
