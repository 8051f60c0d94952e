"""``gpctl serve``: an OpenAI-compatible server with GrowPage on: the reference engine, or vLLM.

``--engine vllm`` starts vLLM's own server with the GrowPage plugin
(:func:`growpage.vllm_plugin.serve.serve`) in the interpreter given by ``--vllm-python`` (default:
this one). vLLM usually lives in its own environment (``.venv-vllm``, see docs/VLLM_PLUGIN.md), so
a missing vLLM is one line that says where to point ``--vllm-python``.
"""

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
    vllm_python: Annotated[Path | None, typer.Option(envvar="GROWPAGE_VLLM_PYTHON",
                                                     help="--engine vllm: the Python that has vLLM "
                                                          "(e.g. .venv-vllm/bin/python). Default: this one.")] = None,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics/growpage."""
    if engine == "vllm":
        raise typer.Exit(_serve_vllm(model, host, port, mode, config, base_pages, block_size, max_num_seqs,
                                     max_num_batched_tokens, served_model_name, metrics_port, no_prefix_caching,
                                     vllm_python))
    if engine != "reference":
        raise GrowPageError(f"--engine {engine} is unknown; use --engine reference or --engine vllm")
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


def _serve_vllm(model: Path | None, host: str, port: int, mode: str | None, config: Path | None,
                base_pages: int | None, block_size: int | None, max_num_seqs: int, max_num_batched_tokens: int,
                served_model_name: str | None, metrics_port: int | None, no_prefix_caching: bool,
                vllm_python: Path | None) -> int:
    """Start vLLM's OpenAI server with the GrowPage plugin in the foreground; returns its exit status."""
    import sys

    from growpage.config import load_config
    from growpage.engine.model_prep import resolve_model_dir
    from growpage.vllm_plugin.serve import check_vllm_python, serve

    python = str(vllm_python) if vllm_python is not None else sys.executable
    check_vllm_python(python)
    overrides = {key: value for key, value in (("mode", mode), ("base_pages", base_pages)) if value is not None}
    growpage_config = load_config(config, overrides=overrides)  # validated here, before a minute of start-up
    growpage: dict = {"mode": growpage_config.mode.value, "base_pages": growpage_config.base_pages}
    if growpage_config.enforce_namespaces:
        growpage["enforce_namespaces"] = list(growpage_config.enforce_namespaces)
    if metrics_port is not None:
        growpage["exporter_port"] = metrics_port
    extra = ["--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(max_num_batched_tokens)]
    if block_size is not None:
        extra += ["--block-size", str(block_size)]
    if served_model_name:
        extra += ["--served-model-name", served_model_name]
    if no_prefix_caching:
        extra += ["--no-enable-prefix-caching"]
    model_dir = resolve_model_dir(model)
    typer.echo(f"serving {model_dir} on vLLM with GrowPage mode={growpage_config.mode.value} "
               f"on http://{host}:{port} (GrowPage metrics: /metrics/growpage)", err=True)
    return serve(str(model_dir), host=host, port=port, growpage=growpage, extra_args=extra, python=python)
