"""`baton model ...`: build and inspect model folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

app = typer.Typer(help="Build and inspect model folders.", no_args_is_help=True)


@app.command("make-tiny")
def make_tiny(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the model into.")],
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights and tokenizer corpus.")] = 0,
    kind: Annotated[Literal["generate", "embed"], typer.Option(
        "--kind", help="generate: a causal LM for chat and completions; embed: the same trunk as an embedding "
        "model (mean pooling, normalised) for /v1/embeddings.")] = "generate",
) -> None:
    """Build Baton's tiny Llama model (random weights, local tokenizer) deterministically."""
    from rich.progress import Progress

    from baton.dataplane.tinymodel import DEFAULT_SHAPE, build_tiny_model

    with Progress(transient=True) as bar:
        task = bar.add_task("building tiny model", total=3)

        def progress(step: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=f"tiny model: {step}")

        path = build_tiny_model(out, seed=seed, kind=kind, progress=progress)
    shape = DEFAULT_SHAPE
    what = (f"embeddings of {shape.hidden_size} dimensions" if kind == "embed"
            else f"KV {shape.kv_bytes_per_token()} bytes/token fp32")
    typer.echo(
        f"tiny {kind} model written to {path} (seed {seed}; {shape.num_hidden_layers} layers, hidden "
        f"{shape.hidden_size}, vocab {shape.vocab_size}, {what})"
    )
