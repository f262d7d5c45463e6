"""The one mapping of Baton errors to HTTP: OpenAI's shape on /v1, problem details elsewhere."""

from __future__ import annotations

import orjson
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from baton.api.errors import install_error_handlers, openai_error_response, problem_details, validation_error
from baton.core import errors


def test_client_errors_keep_their_message_server_errors_never_do() -> None:
    body = orjson.loads(openai_error_response(errors.NotFoundError("No such model.", param="model")).body)
    assert body == {"error": {"message": "No such model.", "type": "invalid_request_error", "param": "model",
                              "code": "not_found"}}
    leaked = openai_error_response(errors.ServerError("psycopg: connection to 10.0.0.3 failed"))
    assert leaked.status_code == 500
    assert b"psycopg" not in leaked.body and orjson.loads(leaked.body)["error"]["type"] == "server_error"
    assert problem_details(errors.UnavailableError("db at 10.0.0.3 down"))["detail"] == "Service unavailable"


def test_validation_errors_name_the_parameter() -> None:
    err = validation_error([{"loc": ("body", "messages", 0, "content", "str"), "msg": "Input should be a string",
                             "type": "string_type"}])
    assert err.param == "messages[0].content" and err.status == 400
    assert validation_error([{"loc": ("body", 3), "msg": "JSON decode error", "type": "json_invalid"}]).param is None


class Item(BaseModel):
    n: int


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/things")
    async def v1(item: Item) -> dict[str, int]:
        raise errors.RateLimitedError("slow down", headers={"retry-after": "3"})

    @app.post("/admin/v1/things")
    async def admin(item: Item) -> dict[str, int]:
        raise RuntimeError("secret internals")

    return app


def test_the_shape_follows_the_path() -> None:
    client = TestClient(_app(), raise_server_exceptions=False)
    r = client.post("/v1/things", json={"n": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = client.post("/v1/things", json={"n": 1})
    assert r.status_code == 429 and r.headers["retry-after"] == "3" and r.json()["error"]["type"] == "rate_limit_error"
    r = client.post("/admin/v1/things", json={"n": "x"})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    r = client.post("/admin/v1/things", json={"n": 1})
    assert r.status_code == 500 and "secret" not in r.text
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert client.get("/v1/things").status_code == 405


def test_no_validation_message_keeps_pydantics_wording() -> None:
    # a JSON array where the schema holds a tuple (the planner's ratios), and a kind no rule names
    err = validation_error([{"loc": ("body", "ratios", 0), "msg": "Input should be a valid tuple",
                             "type": "tuple_type"}])
    assert err.param == "ratios[0]" and "Input should" not in err.message and "a list" in err.message
    odd = validation_error([{"loc": ("body", "x"), "msg": "Input should be a finite number", "type": "finite_number"}])
    assert "Input should" not in odd.message and "finite number" in odd.message
