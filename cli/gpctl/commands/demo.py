"""``gpctl demo``: the main job. vLLM alone, then vLLM with GrowPage, on one reasoning workload."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import typer

from growpage.engine.model_prep import prepare_model

# Deferred imports, by design: each command imports its work (torch, vLLM, the engine, the benchmarks)
# inside itself, so `gpctl --help` and every other command start without it
# (tests/test_layers.py: DEFERRED_BY_DESIGN).


class DemoEngine(str, enum.Enum):
    vllm = "vllm"
    reference = "reference"


def demo(
    engine: Annotated[DemoEngine, typer.Option(help="vllm: vLLM's CPU build alone, then with GrowPage "
                                                    "enforce, under KV pressure. reference: GrowPage's "
                                                    "reference engine, full KV vs GrowPage (INT8/INT4 too).")
                      ] = DemoEngine.vllm,
    quick: Annotated[bool, typer.Option("--quick", help="A shorter workload.")] = False,
    model: Annotated[Path | None, typer.Option(help="A prepared HF Llama-family folder. "
                                                    "Default: the packaged model, prepared if needed.")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the summary as JSON here.")] = None,
    live: Annotated[bool, typer.Option(help="Show live progress (reference engine).")] = True,
) -> None:
    """Run one workload twice, without and with GrowPage; show live pool state, then a side-by-side table."""
    model_dir = prepare_model(model=model, log=lambda line: typer.echo(line, err=True))
    if engine is DemoEngine.vllm:
        from growpage.demos.vllm_engine import VllmDemoSettings, run_vllm_demo

        summary = run_vllm_demo(str(model_dir), VllmDemoSettings.quick() if quick else VllmDemoSettings())
    else:
        from growpage.demos.reference_engine import DemoSettings, run_demo

        summary = run_demo(str(model_dir), DemoSettings.quick() if quick else DemoSettings(), live=live)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
