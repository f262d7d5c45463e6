"""``baton keys``: tenant API keys for operators (create, list, revoke, rotate).

Secrets are printed once, on create and rotate; Baton keeps only their HMAC.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from baton.control.keys import ApiKeyView, KeyService

app = typer.Typer(help="Tenant API keys: create, list, revoke, rotate.", no_args_is_help=True)

TENANT = typer.Option("--tenant", "-t", help="Tenant name or id.")


def _service() -> tuple[KeyService, object]:
    from baton.control.keys import KeyService, RedisKeyEvents
    from baton.core.db import Database
    from baton.core.settings import load_settings, stack_env_file

    settings = load_settings()
    if settings.security.key_secret.get_secret_value().startswith("dev-insecure") and stack_env_file() is None:
        # keys signed with the development secret are refused by a gateway that has its own
        typer.echo("No stack settings found (var/baton.env here or above, or $BATON_STATE_DIR/baton.env) and no "
                   "BATON_SECURITY__KEY_SECRET: run inside the checkout that ran `baton up`, or set them.", err=True)
        raise typer.Exit(2)
    db = Database.for_services(settings)
    return KeyService(db, settings, events=RedisKeyEvents.from_settings(settings)), db


def _tenant_id(db: object, tenant: str) -> uuid.UUID:
    from baton.core.db import Database

    assert isinstance(db, Database)
    try:
        return uuid.UUID(tenant)
    except ValueError:
        pass
    with db.system() as uow:
        row = uow.tenants.by_name(tenant)
        if row is None:
            raise typer.BadParameter(f"no tenant named {tenant!r}", param_hint="--tenant")
        return row.id


def _actor() -> str:
    import getpass

    return f"cli:{getpass.getuser()}"


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(1)


def _row(view: ApiKeyView) -> list[str]:
    return [str(view.id), view.name, view.prefix + "...", view.state(), ",".join(view.model_scope) or "*",
            view.expires_at.isoformat(timespec="seconds") if view.expires_at else "-",
            view.created_at.isoformat(timespec="seconds")]


def _key_json(view: ApiKeyView, secret: str | None = None) -> str:
    """One key as a JSON line (the secret only where it was just issued)."""
    import json

    out = {"id": str(view.id), "name": view.name, "prefix": view.prefix, "state": view.state(),
           "model_scope": list(view.model_scope),
           "expires_at": view.expires_at.isoformat() if view.expires_at else None,
           "created_at": view.created_at.isoformat()}
    if secret is not None:
        out["secret"] = secret
    return json.dumps(out)


JSON = typer.Option("--json", help="Print the key as one JSON object (with its secret), for scripts.")


@app.command("create")
def create(
    tenant: Annotated[str, TENANT],
    name: Annotated[str, typer.Option("--name", help="A name for the key, unique among live keys.")],
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="Limit to this model (repeat).")] = None,
    expires_in_days: Annotated[float | None, typer.Option("--expires-in-days", min=0.0001)] = None,
    as_json: Annotated[bool, JSON] = False,
) -> None:
    """Create a key and print its secret (shown only this once)."""
    from baton.core.errors import BatonError

    service, db = _service()
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(days=expires_in_days) if expires_in_days else None
    try:
        issued = service.issue(tenant_id=_tenant_id(db, tenant), name=name, created_by=_actor(),
                               model_scope=model or (), expires_at=expires)
    except BatonError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(_key_json(issued.key, issued.secret))
        return
    typer.echo(f"key id: {issued.key.id}")
    typer.echo(f"secret (shown once): {issued.secret}")


@app.command("list")
def list_keys(
    tenant: Annotated[str, TENANT],
    all_: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per key, a line each (for scripts).")]
    = False,
) -> None:
    """List a tenant's keys (never their secrets). Ids are printed whole, whatever the terminal's width."""
    from rich.console import Console
    from rich.table import Table

    service, db = _service()
    views = service.list(tenant_id=_tenant_id(db, tenant), include_revoked=all_)
    if as_json:
        for view in views:
            typer.echo(_key_json(view))
        return
    table = Table("id", "name", "prefix", "state", "models", "expires", "created")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = 36  # a whole UUID: revoke and rotate take it
    for view in views:
        table.add_row(*_row(view))
    Console(width=max(Console().width, 160)).print(table)


@app.command("revoke")
def revoke(
    tenant: Annotated[str, TENANT],
    key_id: Annotated[uuid.UUID, typer.Argument(help="The key's id.")],
) -> None:
    """Revoke a key now; every gateway refuses it within a second."""
    from baton.core.errors import BatonError

    service, db = _service()
    try:
        view = service.revoke(tenant_id=_tenant_id(db, tenant), key_id=key_id, actor=_actor())
    except BatonError as exc:
        raise _fail(exc) from None
    typer.echo(f"revoked {view.id} ({view.prefix}...)")


@app.command("rotate")
def rotate(
    tenant: Annotated[str, TENANT],
    key_id: Annotated[uuid.UUID, typer.Argument(help="The key to replace.")],
    overlap_hours: Annotated[float, typer.Option("--overlap-hours", min=0.0,
                                                 help="How long the old key keeps working.")] = 24.0,
    as_json: Annotated[bool, JSON] = False,
) -> None:
    """Issue a successor and let the old key expire after the overlap; prints the new secret once."""
    from baton.core.errors import BatonError

    service, db = _service()
    try:
        issued = service.rotate(tenant_id=_tenant_id(db, tenant), key_id=key_id, actor=_actor(),
                                overlap=dt.timedelta(hours=overlap_hours))
    except BatonError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(_key_json(issued.key, issued.secret))
        return
    typer.echo(f"new key id: {issued.key.id}")
    typer.echo(f"secret (shown once): {issued.secret}")
    typer.echo(f"old key {key_id} stops working after {overlap_hours:g} h")
