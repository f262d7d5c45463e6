"""The ``baton`` command line. Sub-commands import what they need when they run, not at start-up."""

from __future__ import annotations

import typer

from baton.cli import db

app = typer.Typer(
    name="baton",
    help="Baton: multi-tenant, fault-tolerant LLM serving on Ray Serve LLM + vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(db.app, name="db")


def _mount_optional() -> None:
    """Sub-apps of the other layers; each is a small typer module with lazy imports inside commands."""
    import importlib

    for module, name in (
        ("baton.cli.model", "model"),
        ("baton.cli.console", "console"),
        ("baton.cli.serve", "serve"),
        ("baton.cli.stack", None),
        ("baton.cli.keys", "keys"),
        ("baton.cli.gateway", "gateway"),
        ("baton.cli.bench", "bench"),
        ("baton.cli.chaos", "chaos"),
        ("baton.cli.plan", None),
        ("baton.cli.worker", None),
        ("baton.cli.ops", "ops"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        if name is None:
            mod.register(app)
        else:
            app.add_typer(mod.app, name=name)


_mount_optional()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
