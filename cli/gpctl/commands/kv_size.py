"""``gpctl kv-size``: exact KV cache bytes and pages for a model geometry, with the formula."""

from __future__ import annotations

import enum
import json
from fractions import Fraction
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from growpage.kv_size import (
    DTYPE_BITS,
    MODEL_PRESETS,
    KVSizeEstimate,
    estimate_kv_size,
    format_bytes,
    format_exact_bytes,
    quoted_example_note,
    resolve_geometry,
)


class OutputFormat(str, enum.Enum):
    """How ``kv-size`` prints its result."""

    TEXT = "text"
    JSON = "json"


def kv_size(
    tokens: Annotated[
        int, typer.Option(help="Tokens per request: prompt plus generated.", show_default=False)
    ],
    model: Annotated[
        str | None,
        typer.Option(
            help=f"Geometry preset: {', '.join(MODEL_PRESETS)}. Explicit flags override it.",
        ),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(help="Transformer layers (num_hidden_layers).", show_default=False)
    ] = None,
    kv_heads: Annotated[
        int | None,
        typer.Option(help="KV heads per layer (num_key_value_heads).", show_default=False),
    ] = None,
    head_dim: Annotated[
        int | None, typer.Option(help="Elements per head vector (head_dim).", show_default=False)
    ] = None,
    batch: Annotated[int, typer.Option(help="Concurrent requests of this length.")] = 1,
    dtype: Annotated[
        str, typer.Option(help=f"KV element type: {', '.join(DTYPE_BITS)}.")
    ] = "float16",
    block_size: Annotated[int, typer.Option(help="Token slots per page (vLLM block_size).")] = 16,
    output: Annotated[OutputFormat, typer.Option(help="text (a table) or json.")] = OutputFormat.TEXT,
) -> None:
    """Compute KV cache bytes and pages per token, request and batch.

    Example: [bold]gpctl kv-size --model llama-2-7b --tokens 640 --batch 8[/bold]
    (32 layers x 32 KV heads x 128 head_dim x 2 x 2 B = 512 KiB per token: 320 MiB per request).
    int8/int4 include one float16 scale per layer, K|V and KV head per page.
    """
    geometry = resolve_geometry(model, layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    estimate = estimate_kv_size(
        geometry.layers,
        geometry.kv_heads,
        geometry.head_dim,
        tokens,
        batch=batch,
        dtype=dtype,
        block_size=block_size,
    )
    note = quoted_example_note(estimate)
    if output is OutputFormat.JSON:
        document = {"model": geometry.name, **estimate.to_dict(), "note": note}
        typer.echo(json.dumps(document, indent=2))
        return
    _print_table(estimate, geometry.name, note)


def _print_table(estimate: KVSizeEstimate, model_name: str | None, note: str | None) -> None:
    console = Console(highlight=False)
    subject = model_name or (
        f"{estimate.layers} layers, {estimate.kv_heads} KV heads, head_dim {estimate.head_dim}"
    )
    # A separate heading line, not a table title: a long title would wrap inside the table width.
    console.print(f"[bold]KV cache size[/bold]: {subject}, {estimate.dtype}")
    table = Table()
    table.add_column("Quantity")
    table.add_column("Size", justify="right")
    table.add_column("Exact bytes", justify="right")

    def add_bytes_row(label: str, num_bytes: int | Fraction) -> None:
        table.add_row(label, format_bytes(num_bytes), format_exact_bytes(num_bytes))

    token_label = "Bytes per token"
    if estimate.scale_bytes_per_page:
        token_label += " (scales amortized)"
    add_bytes_row(token_label, estimate.bytes_per_token)
    add_bytes_row(f"Bytes per page ({estimate.block_size} tokens)", estimate.bytes_per_page)
    add_bytes_row(f"Per request ({estimate.tokens:,} tokens)", estimate.bytes_per_request)
    requests = "request" if estimate.batch == 1 else "requests"
    add_bytes_row(f"Per batch ({estimate.batch:,} {requests})", estimate.bytes_per_batch)
    if estimate.allocated_bytes_per_request != estimate.bytes_per_request:
        # The last page is allocated whole; SREs size the pool by pages, not by tokens.
        add_bytes_row("Allocated per batch (whole pages)", estimate.allocated_bytes_per_batch)
    table.add_row("Pages per request", f"{estimate.pages_per_request:,}", "")
    table.add_row("Pages per batch", f"{estimate.pages_per_batch:,}", "")
    console.print(table)
    console.print(f"Formula: {estimate.formula}", markup=False)
    if note:
        console.print(note, style="yellow", markup=False)
