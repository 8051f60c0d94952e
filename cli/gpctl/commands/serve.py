"""``gpctl serve``: an OpenAI-compatible server with GrowPage on: vLLM (the default), or the reference engine.

The reference engine's configuration is checked against the model and the pool before anything is
allocated (:func:`growpage.engine.startup.check_serving`): one line and exit 2 for a pool that
cannot hold a full-context request, a grant larger than the pool, or memory the machine lacks.
Shutdown is bounded: SIGTERM drains for ``--shutdown-timeout`` seconds, a second signal exits.

``--engine vllm`` (the default) starts vLLM's own server with the GrowPage plugin
(:func:`growpage.tooling.serve.serve`) as a child in this interpreter and forwards SIGTERM and
SIGINT to it, so stopping ``gpctl`` stops vLLM.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from growpage.config import GrowPageConfig as Defaults
from growpage.config import load_config
from growpage.engine.model_prep import resolve_model_dir
from growpage.engine.server_settings import ServerSettings
from growpage.engine.startup import available_memory_mib, check_serving
from growpage.errors import ConfigError, GrowPageError

if TYPE_CHECKING:  # the engine's modules load torch: imported only when a server starts
    from growpage.config import GrowPageConfig
    from growpage.engine.engine import EngineConfig

# Deferred imports, by design: each command imports its work (torch, vLLM, the engine, the benchmarks)
# inside itself, so `gpctl --help` and every other command start without it
# (tests/test_layers.py: DEFERRED_BY_DESIGN).

PUBLIC_HELP = ("Endpoints open without the API key: health, metrics, both (health,metrics) or none.")


ModelOption = Annotated[Path | None, typer.Option(
    help="A prepared HF Llama-family folder. Default: the packaged model (`gpctl model prepare`).")]
HostOption = Annotated[str, typer.Option(help="Address every listener binds (0.0.0.0 inside a pod).")]
PortOption = Annotated[int, typer.Option(min=1, max=65535)]
EngineOption = Annotated[str, typer.Option(
    help="vllm (vLLM with the GrowPage plugin) or reference (GrowPage's own engine, where per-request "
         "quantization lives).")]
ModeOption = Annotated[str | None, typer.Option(help="GrowPage mode: off | monitor | enforce.")]
ConfigOption = Annotated[Path | None, typer.Option(envvar="GROWPAGE_CONFIG",
                                                   help="GrowPage config file (YAML/JSON/TOML).")]
BasePagesOption = Annotated[int | None, typer.Option(
    help="The floor no compression goes below, in pages (vllm: default 128 tokens in vLLM's block size, "
         "raised per request to what its attention needs; "
         "reference: pages granted at admission, default 128).")]
BlockSizeOption = Annotated[int | None, typer.Option(help="Tokens per page.")]
KvCacheMibOption = Annotated[int, typer.Option(min=1, help="Memory for KV pages.")]
KvBlocksOption = Annotated[int | None, typer.Option(
    min=1, help="vllm: KV blocks in the pool (vLLM's --num-gpu-blocks-override; a fleet sizes replicas with it). "
                "Default: what --gpu-memory-utilization leaves.")]
MaxModelLenOption = Annotated[int | None, typer.Option(
    min=1, help="Context a request may use (prompt + output); default: the model's.")]
MaxNumSeqsOption = Annotated[int, typer.Option(min=1, help="Running requests at most.")]
MaxNumBatchedTokensOption = Annotated[int, typer.Option(min=1, help="Tokens per step at most.")]
ServedModelNameOption = Annotated[str | None, typer.Option(help="Model id for clients.")]
MetricsPortOption = Annotated[int | None, typer.Option(help="Also serve /metrics/growpage on this port.")]
MetricsHostOption = Annotated[str | None, typer.Option(
    help="Address of the --metrics-port listener. Default: --host.")]
NoPrefixCachingOption = Annotated[bool, typer.Option("--no-prefix-caching")]
ApiKeyOption = Annotated[str | None, typer.Option(
    envvar="GROWPAGE_API_KEY", show_default=False,
    help="Require 'Authorization: Bearer KEY' (prefer the GROWPAGE_API_KEY variable: argv is visible to ps).")]
PublicOption = Annotated[str, typer.Option(help=PUBLIC_HELP)]
ApiDocsOption = Annotated[bool, typer.Option("--api-docs", help="Serve /docs, /redoc and /openapi.json.")]
MaxRequestBytesOption = Annotated[int | None, typer.Option(
    help="Largest request body (413 above it). Default: 4 MiB.")]
AllowModeOverrideOption = Annotated[bool | None, typer.Option(
    "--allow-mode-override/--no-allow-mode-override",
    help="Honour a request's growpage_mode / X-GrowPage-Mode. Default: not when --mode enforce.")]
ClientNamespacesOption = Annotated[bool | None, typer.Option(
    "--client-namespaces/--no-client-namespaces",
    help="Honour the body's namespace / user fields. Default: not when --mode enforce.")]
NamespaceHeaderOption = Annotated[str, typer.Option(
    help="Header a trusted gateway sets to the namespace ('' trusts none).")]
ShutdownTimeoutOption = Annotated[float, typer.Option(
    min=0, help="Seconds running requests get after SIGTERM (a second signal exits at once).")]


def serve(
    model: ModelOption = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8000,
    engine: EngineOption = "vllm",
    mode: ModeOption = None,
    config: ConfigOption = None,
    base_pages: BasePagesOption = None,
    block_size: BlockSizeOption = None,
    kv_cache_mib: KvCacheMibOption = 256,
    kv_blocks: KvBlocksOption = None,
    max_model_len: MaxModelLenOption = None,
    max_num_seqs: MaxNumSeqsOption = 32,
    max_num_batched_tokens: MaxNumBatchedTokensOption = 512,
    served_model_name: ServedModelNameOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = None,
    no_prefix_caching: NoPrefixCachingOption = False,
    api_key: ApiKeyOption = None,
    public: PublicOption = "health,metrics",
    api_docs: ApiDocsOption = False,
    max_request_bytes: MaxRequestBytesOption = None,
    allow_mode_override: AllowModeOverrideOption = None,
    client_namespaces: ClientNamespacesOption = None,
    namespace_header: NamespaceHeaderOption = "x-growpage-namespace",
    shutdown_timeout: ShutdownTimeoutOption = 50.0,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics/growpage."""
    public_names = _public_names(public, api_key, metrics_port)
    listen = metrics_host or host
    if engine == "vllm":
        raise typer.Exit(_serve_vllm(model, host, port, mode, config, base_pages, block_size, max_num_seqs,
                                     max_num_batched_tokens, served_model_name, metrics_port, listen,
                                     no_prefix_caching, api_key, max_model_len, shutdown_timeout,
                                     _client_choices(allow_mode_override, client_namespaces, namespace_header),
                                     kv_blocks))
    if engine != "reference":
        raise GrowPageError(f"--engine {engine} is unknown; use --engine reference or --engine vllm")

    from growpage.engine.engine import EngineConfig

    overrides = {key: value for key, value in (("mode", mode), ("base_pages", base_pages),
                                                ("block_size", block_size)) if value is not None}
    growpage_config = load_config(config, overrides=overrides)
    settings = ServerSettings.for_mode(
        growpage_config.mode, api_key=api_key, public=public_names, api_docs=api_docs,
        max_request_bytes=max_request_bytes, allow_mode_override=allow_mode_override,
        client_namespaces=client_namespaces, namespace_header=namespace_header or "",
        shutdown_timeout_s=shutdown_timeout)
    engine_config = EngineConfig(model_dir=str(resolve_model_dir(model)), kv_cache_mib=kv_cache_mib,
                                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                 enable_prefix_caching=not no_prefix_caching,
                                 served_model_name=served_model_name, max_model_len=max_model_len)
    num_pages = _checked_num_pages(engine_config, growpage_config)
    _serve_reference(engine_config, growpage_config, settings, host, port, metrics_port, listen, num_pages)


def _checked_num_pages(engine_config: EngineConfig, growpage_config: GrowPageConfig) -> int:
    """The reference engine's pool size, after checking the config against the model and the machine.

    Raises before anything is allocated (one line, exit 2) for a pool that cannot hold a full-context
    request, a grant larger than the pool, or memory the machine lacks.
    """
    from growpage.engine.llama_config import LlamaConfig

    geometry = LlamaConfig.from_folder(Path(engine_config.model_dir))
    plan = check_serving(growpage_config, num_layers=geometry.num_layers, num_kv_heads=geometry.num_kv_heads,
                         head_dim=geometry.head_dim, model_context=geometry.max_position_embeddings,
                         kv_cache_mib=engine_config.kv_cache_mib, max_model_len=engine_config.max_model_len,
                         available_mib=available_memory_mib(engine_config.device))
    return plan.num_pages


def _serve_reference(engine_config: EngineConfig, growpage_config: GrowPageConfig, settings: ServerSettings, host: str,
                     port: int, metrics_port: int | None,
                     metrics_host: str, num_pages: int) -> None:
    from growpage.engine.serving import build_stack, run_server

    stack = build_stack(engine_config, growpage_config, metrics_port=metrics_port, metrics_host=metrics_host,
                        settings=settings)
    auth = "API key required" if settings.api_key else "no API key"
    typer.echo(f"serving {stack.engine.config.model_name} with GrowPage mode={growpage_config.mode.value} "
               f"on http://{host}:{port} ({num_pages} KV pages, context {stack.engine.max_model_len}, {auth})",
               err=True)
    try:
        run_server(stack, host, port)
    finally:
        stack.close()


def _public_names(public: str, api_key: str | None, metrics_port: int | None) -> tuple[str, ...]:
    """The endpoints open without the API key; refuses a --metrics-port that would open metrics anyway."""
    names = tuple(part.strip().lower() for part in public.split(",") if part.strip())
    names = () if names == ("none",) else names
    if api_key and "metrics" not in names and metrics_port is not None:
        raise ConfigError("--metrics-port serves /metrics/growpage without the API key; drop --metrics-port or "
                          "add metrics to --public")
    return names


def _choice(flag: bool | None) -> str:
    """A --x/--no-x flag as the vLLM plugin's client-choice setting (unset: ``auto``)."""
    return "auto" if flag is None else ("honour" if flag else "ignore")


def _client_choices(allow_mode_override: bool | None, client_namespaces: bool | None,
                    namespace_header: str) -> dict[str, str]:
    """What a request may choose for itself, as the vLLM plugin's settings."""
    return {"client_mode": _choice(allow_mode_override), "client_namespaces": _choice(client_namespaces),
            "namespace_header": namespace_header or ""}


def _serve_vllm(model: Path | None, host: str, port: int, mode: str | None, config: Path | None,
                base_pages: int | None, block_size: int | None, max_num_seqs: int, max_num_batched_tokens: int,
                served_model_name: str | None, metrics_port: int | None, metrics_host: str, no_prefix_caching: bool,
                api_key: str | None, max_model_len: int | None,
                shutdown_timeout: float, client_choices: dict[str, str] | None = None,
                kv_blocks: int | None = None) -> int:
    """Start vLLM's OpenAI server with the GrowPage plugin as a child; returns its exit status."""
    from growpage.tooling.serve import check_vllm_installed, serve

    python = sys.executable
    check_vllm_installed()
    overrides = {key: value for key, value in (("mode", mode), ("base_pages", base_pages)) if value is not None}
    growpage_config = load_config(config, overrides=overrides)  # validated here, before a minute of start-up
    growpage: dict = {"mode": growpage_config.mode.value, "exporter_host": metrics_host, **(client_choices or {})}
    if base_pages is not None or growpage_config.base_pages != Defaults().base_pages:
        # given on the command line or in the config file; else the plugin's floor in vLLM's block size
        growpage["base_pages"] = growpage_config.base_pages
    if growpage_config.enforce_namespaces:
        growpage["enforce_namespaces"] = list(growpage_config.enforce_namespaces)
    if metrics_port is not None:
        growpage["exporter_port"] = metrics_port
    extra = ["--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(max_num_batched_tokens)]
    if block_size is not None:
        extra += ["--block-size", str(block_size)]
    if max_model_len is not None:
        extra += ["--max-model-len", str(max_model_len)]
    if served_model_name:
        extra += ["--served-model-name", served_model_name]
    if no_prefix_caching:
        extra += ["--no-enable-prefix-caching"]
    if kv_blocks is not None:
        extra += ["--num-gpu-blocks-override", str(kv_blocks)]
    env_extra = {"VLLM_API_KEY": api_key} if api_key else {}  # the environment, not argv: ps shows argv
    model_dir = resolve_model_dir(model)
    typer.echo(f"serving {model_dir} on vLLM with GrowPage mode={growpage_config.mode.value} "
               f"on http://{host}:{port} (GrowPage metrics: /metrics/growpage)", err=True)
    return serve(str(model_dir), host=host, port=port, growpage=growpage, extra_args=extra, python=python,
                 extra_env=env_extra, shutdown_timeout_s=shutdown_timeout)
