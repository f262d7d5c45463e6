"""``baton console``: the web console's administration (the first operator account)."""

from __future__ import annotations

import typer

app = typer.Typer(help="The web console: operator accounts.", no_args_is_help=True)


@app.command("create-operator")
def create_operator(
    email: str = typer.Option(..., "--email", help="The operator's sign-in email."),
    password: str = typer.Option(
        ..., "--password", prompt=True, hide_input=True, confirmation_prompt=True, envvar="BATON_OPERATOR_PASSWORD",
        help="At least 10 characters (prompted when not given; or BATON_OPERATOR_PASSWORD).",
    ),
) -> None:
    """Create a platform operator who signs in to the console at /console/."""
    from baton.api.console.auth import create_operator as create
    from baton.core.db import Database
    from baton.core.errors import BatonError
    from baton.core.settings import load_settings

    settings = load_settings()
    db = Database.for_services(settings)
    try:
        user_id = create(db, email=email, password=password, actor="cli:console")
    except BatonError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    finally:
        db.dispose()
    typer.echo(f"operator {email} created ({user_id}); sign in at /console/")
