"""``gpctl demo``: the main job. GrowPage on the packaged model, next to full KV, in minutes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def demo(
    quick: Annotated[bool, typer.Option("--quick", help="A shorter workload (about a minute).")] = False,
    model: Annotated[Path | None, typer.Option(help="A prepared HF Llama-family folder. "
                                                    "Default: the packaged model, prepared if needed.")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the summary as JSON here.")] = None,
    live: Annotated[bool, typer.Option(help="Show live progress tables.")] = True,
) -> None:
    """Run a mixed workload (step-by-step reasoning next to short summaries) twice: full KV, then
    GrowPage enforce with small grants; show live pages and decisions, then a summary table."""
    from growpage.demo import DemoSettings, run_demo
    from growpage.engine.model_prep import prepare_model

    model_dir = prepare_model(model=model, log=lambda line: typer.echo(line, err=True))
    summary = run_demo(str(model_dir), DemoSettings.quick() if quick else DemoSettings(), live=live)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
