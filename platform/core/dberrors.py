"""Postgres's errors as Baton's own: :func:`translated` around a flush, a commit or a statement turns a
driver or ORM exception into the :mod:`baton.core.errors` a client may see (a constraint's own sentence,
never the driver's text)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm.exc import StaleDataError

from baton.core import errors


@contextmanager
def translated() -> Iterator[None]:
    """Turns driver and ORM exceptions into Baton's own errors."""
    try:
        yield
    except StaleDataError as exc:
        raise errors.PreconditionFailedError(
            "The record was changed by someone else; read it again and retry."
        ) from exc
    except DBAPIError as exc:
        raise translate(exc) from exc


_FK_NAME = re.compile(r"^fk_(?P<table>.+?)_(?P<column>[a-z_]+?_id)_(?P<ref>[a-z_]+)$")
_NOT_NULL = "23502"
_FOREIGN_KEY = "23503"
_UNIQUE = "23505"
_CHECK = "23514"

#: Client-facing wording for the constraints a caller can run into.
CONSTRAINT_MESSAGES: dict[str, str] = {
    "uq_tenants_name": "A tenant with this name already exists.",
    "uq_users_email_lower": "A user with this email already exists.",
    "uq_api_keys_tenant_id_name_live": "This tenant already has a live API key with this name.",
    "uq_models_name": "A model with this name already exists.",
    "uq_deployments_name": "A deployment with this name already exists.",
    "uq_slo_policies_name": "An SLO policy with this name already exists.",
    "uq_slo_assignments_tenant_id_model_id": "An SLO policy is already assigned to this target.",
    "uq_rate_limits_tenant_id_api_key_id": "Rate limits for this target already exist.",
    "uq_usage_records_request_id": "Usage for this request was already recorded.",
    "uq_admin_tokens_name": "An admin token with this name already exists.",
    "pk_tenant_models": "The tenant already has access to this model.",
    "uq_access_requests_pending": "A request for this model is already waiting for an operator.",
    "uq_api_keys_playground_per_user": "You already have a playground key; try again.",
    "ck_tenants_name_slug": "Names are lower-case letters, digits and '-', at most 64 characters.",
    "ck_deployments_name_slug": "Names are lower-case letters, digits and '-', at most 63 characters.",
    "ck_deployments_prefill_range": "Prefill replicas: min must be >= 0 and <= max.",
    "ck_deployments_decode_range": "Decode replicas: min must be >= 0 and <= max, and max >= 1.",
    "ck_deployments_pd_needs_connector_and_prefill": "P/D mode needs a KV connector and a prefill pool.",
}


def translate(exc: DBAPIError) -> errors.BatonError:
    """Maps one driver exception to a Baton error; never passes the driver's text to a client."""
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or ""
    diag = getattr(orig, "diag", None)
    constraint = getattr(diag, "constraint_name", None) or ""
    column = getattr(diag, "column_name", None)
    primary = getattr(diag, "message_primary", None) or ""
    known = CONSTRAINT_MESSAGES.get(constraint)
    if isinstance(exc, IntegrityError) or sqlstate.startswith("23"):
        if sqlstate == _UNIQUE:
            return errors.ConflictError(known or "A record with these values already exists.")
        if sqlstate == _FOREIGN_KEY:
            m = _FK_NAME.match(constraint)
            what = m.group("ref").removesuffix("s").replace("_", " ") if m else "record"
            if primary.startswith("update or delete"):
                return errors.ConflictError(f"This {what} is still in use and cannot be removed.")
            return errors.NotFoundError(f"The referenced {what} does not exist.",
                                        param=m.group("column") if m else None)
        if sqlstate == _NOT_NULL:
            return errors.ValidationError(f"'{column}' is required.", param=column)
        if sqlstate == _CHECK:
            return errors.ValidationError(known or "A value is outside its allowed range.")
        return errors.ValidationError("The record is not valid.")
    # Data exceptions (bad text representation, value too long, ...), and values the driver itself
    # refuses before sending them (a NUL character in a text field).
    if sqlstate.startswith("22") or (isinstance(exc, DataError) and not sqlstate):
        return errors.ValidationError("A value has the wrong type or is too long.")
    if sqlstate == "57014":
        return errors.UnavailableError("The database took too long to answer.")
    if isinstance(exc, OperationalError) or sqlstate.startswith("08"):
        return errors.UnavailableError("The database is unavailable.")
    return errors.ServerError()
