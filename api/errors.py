"""The one place where Baton's errors become HTTP responses.

``/v1`` (the OpenAI-compatible gateway) answers in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, so that OpenAI clients raise the exception they
would raise against OpenAI. Everything else (``/admin/v1``, the console) answers with RFC 9457
problem details. Server errors never carry internal text: the client gets the error class's title.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from baton.core import errors

log = logging.getLogger(__name__)

OPENAI_PREFIX = "/v1/"

_OPENAI_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    412: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}

_HTTP_CODES: dict[int, str] = {
    404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 415: "unsupported_media_type",
}


def client_message(exc: errors.BatonError) -> str:
    """What a client may read: the message of a client error, only the title of a server error."""
    return exc.message if isinstance(exc, errors.ClientError) else exc.title


def openai_error_body(
    message: str, *, status: int, code: str | None, param: str | None = None, type_: str | None = None
) -> bytes:
    kind = type_ or _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def openai_error_response(
    exc: errors.BatonError, *, headers: Mapping[str, str] | None = None
) -> Response:
    code = exc.extra.get("openai_code", exc.code)
    body = openai_error_body(client_message(exc), status=exc.status, code=code, param=exc.param,
                             type_=exc.extra.get("openai_type"))
    return Response(body, status_code=exc.status, headers=headers, media_type="application/json")


#: Every problem document's ``type`` (the admin API's and the console's alike): this prefix and the code.
PROBLEM_TYPE_PREFIX = "urn:baton:error:"


def problem_details(exc: errors.BatonError, *, instance: str | None = None) -> dict[str, Any]:
    """RFC 9457 problem details for ``exc`` (``type`` is a stable URN per error code)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_PREFIX + exc.code,
        "title": exc.title,
        "status": exc.status,
        "detail": client_message(exc),
        "code": exc.code,
    }
    if exc.param:
        body["param"] = exc.param
    if instance:
        body["instance"] = instance
    fields = exc.extra.get("fields")
    if isinstance(fields, list):
        body["errors"] = fields
    return body


def problem_response(
    exc: errors.BatonError, *, instance: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(problem_details(exc, instance=instance)), status_code=exc.status,
                    headers=headers, media_type="application/problem+json")


def error_response(request: Request, exc: errors.BatonError, *, headers: Mapping[str, str] | None = None) -> Response:
    """The right shape for where the request went."""
    if request.url.path.startswith(OPENAI_PREFIX) or request.url.path == OPENAI_PREFIX.rstrip("/"):
        return openai_error_response(exc, headers=headers)
    return problem_response(exc, instance=request.url.path, headers=headers)


_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _loc_param(loc: Sequence[Any]) -> str | None:
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    # Drop pydantic's union/type tags ('str', 'list[...]', 'function-after[...]', 'constrained-str') from the
    # path: what is left is the client's field names and list indexes.
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and (not _FIELD.fullmatch(p) or p in {"str", "int", "float", "bool", "list", "dict"}):
            continue
        else:
            out += f".{p}" if out else str(p)
    return out or None


def plain_message(e: Mapping[str, Any]) -> str:
    """One validation failure in plain words (pydantic's own wording names its internals: "Input should
    be a valid UUID, invalid character: found `n` at 0")."""
    kind = str(e.get("type", ""))
    ctx = e.get("ctx") or {}
    if kind.startswith("uuid"):
        return "This is not a valid id (ids look like 3f2b8c1e-0a4d-4e8b-9c55-1d2e3f4a5b6c)"
    if kind == "missing":
        return "This is required"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "This cannot be empty" if n == 1 else f"Use at least {n} characters"
    if kind == "string_too_long":
        return f"Use at most {ctx.get('max_length')} characters"
    if kind in ("too_long", "too_short"):
        return (f"Give at most {ctx.get('max_length')} items" if kind == "too_long"
                else f"Give at least {ctx.get('min_length')} items")
    if kind == "string_pattern_mismatch":
        return "This contains characters that are not allowed here"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "Enter a whole number"
    if kind in ("float_parsing", "float_type"):
        return "Enter a number"
    if kind in ("bool_parsing", "bool_type"):
        return "Use true or false"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        word = {"greater_than": "greater than", "greater_than_equal": "at least", "less_than": "less than",
                "less_than_equal": "at most"}[kind]
        bound = next((v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")), "")
        return f"Use a value {word} {bound}"
    if kind in ("enum", "literal_error"):
        return f"Choose one of: {ctx.get('expected', 'the listed values')}"
    if kind == "extra_forbidden":
        return "This field is not accepted here"
    if kind in ("string_type", "dict_type", "list_type", "tuple_type", "set_type", "frozen_set_type", "model_type",
                "model_attributes_type"):
        what = {"string_type": "text", "dict_type": "an object"}.get(kind, "an object")
        return f"This must be {'a list' if kind.endswith(('list_type', 'tuple_type', 'set_type')) else what}"
    if kind in ("datetime_parsing", "datetime_from_date_parsing", "date_parsing"):
        return "Enter a date and time such as 2026-12-02T14:05:00Z"
    msg = str(e.get("msg", "Invalid value"))
    # pydantic's wording for a kind not named above: "Input should be ..." reads as "This must be ..."
    return "This must be " + msg[len("Input should be "):] if msg.startswith("Input should be ") else msg


_TYPE_MISMATCH = frozenset({"string_type", "list_type", "tuple_type", "int_type", "float_type", "bool_type",
                            "dict_type", "model_type", "model_attributes_type", "int_parsing", "float_parsing",
                            "bool_parsing", "literal_error", "union_tag_invalid"})


def validation_error(errs: Iterable[Mapping[str, Any]]) -> errors.ValidationError:
    """A request validation failure as one client error naming the first offending parameter, in plain words."""
    items = list(errs)
    fields = [{"param": _loc_param(e.get("loc", ())), "message": plain_message(e)} for e in items[:20]]
    first = items[0] if items else {}
    if first.get("type") == "json_invalid" or (first.get("loc") == ("body",) and first.get("type") == "missing"):
        exc = errors.ValidationError(
            "We could not parse the JSON body of your request. Send a JSON object with Content-Type: "
            "application/json.", fields=fields)
        return exc
    # a value that fits no member of a union fails each member: the member whose type it has says why
    # (["a"] * 3000 for "a text or at most 2,048 texts" is too long, not "not text")
    first = next((e for e in items if str(e.get("type", "")) not in _TYPE_MISMATCH), first)
    param = _loc_param(first.get("loc", ()))
    msg = plain_message(first)
    where = f"'{param}'" if param else "the request body"
    return errors.ValidationError(f"Invalid value for {where}: {msg}.", param=param, fields=fields)


def _http_error(exc: StarletteHTTPException) -> errors.BatonError:
    cls: type[errors.BatonError]
    if exc.status_code == 404:
        cls = errors.NotFoundError
    elif exc.status_code == 401:
        cls = errors.AuthenticationError
    elif exc.status_code == 403:
        cls = errors.PermissionDeniedError
    elif exc.status_code >= 500:
        return errors.ServerError()
    else:
        cls = errors.ClientError
    detail = exc.detail if isinstance(exc.detail, str) else None
    err: errors.BatonError = cls(detail or cls.title)
    if exc.status_code != err.status:
        # Keep the status Starlette chose (405, 413, 415, ...) with a code that names it.
        err = _with_status(err, exc.status_code)
    return err


@functools.cache
def _status_class(status: int, code: str, title: str) -> type[errors.ClientError]:
    return type(f"HTTP{status}Error", (errors.ClientError,), {"status": status, "code": code, "title": title})


def _with_status(err: errors.BatonError, status: int) -> errors.BatonError:
    """The same error under another HTTP status (405, 413, 415 from Starlette; 422 for problem details)."""
    cls = _status_class(status, _HTTP_CODES.get(status, err.code), err.title)
    return cls(err.message, param=err.param, **err.extra)


def baton_error_response(request: Request, exc: errors.BatonError) -> Response:
    """A raised Baton error as its response (a server error is logged with its traceback)."""
    if not isinstance(exc, errors.ClientError):
        log.error("request failed: %s %s (%s)", request.method, request.url.path, exc.code, exc_info=exc)
    headers = exc.extra.get("headers")
    return error_response(request, exc, headers=headers if isinstance(headers, Mapping) else None)


def http_error_response(request: Request, exc: StarletteHTTPException) -> Response:
    """Starlette's HTTP exceptions (404, 405, 413, ...) in the path's shape."""
    headers = dict(exc.headers) if exc.headers else None
    return error_response(request, _http_error(exc), headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Maps every exception an app can raise to one of the two shapes; unknown ones become 500s."""

    async def on_baton_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.BatonError)
        return baton_error_response(request, exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        err: errors.BatonError = validation_error(exc.errors())
        if not request.url.path.startswith(OPENAI_PREFIX):
            err = _with_status(err, 422)
        return error_response(request, err)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return http_error_response(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("unhandled error: %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(request, errors.ServerError())

    app.add_exception_handler(errors.BatonError, on_baton_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
