"""Bad input over every /v1 endpoint, against the whole app process: every answer a 4xx in OpenAI's error
shape, none a 5xx, and no internal text. Oversize bodies are refused before they are read whole."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from .conftest import Catalogue, MakeTenant

ENDPOINTS = ["/v1/chat/completions", "/v1/completions"]
#: Every POST endpoint under /v1 (for what any endpoint must refuse the same way).
ALL_ENDPOINTS = [*ENDPOINTS, "/v1/responses", "/v1/embeddings"]


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _completion(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "max_tokens": 2}


def _body(endpoint: str, model: str) -> dict[str, Any]:
    if endpoint.endswith("responses"):
        return {"model": model, "input": "hi", "max_output_tokens": 16}
    if endpoint.endswith("embeddings"):
        return {"model": model, "input": "hi"}
    return _chat(model) if endpoint.endswith("chat/completions") else _completion(model)


def _openai_error(resp: httpx.Response) -> dict[str, Any]:
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    for word in ("Traceback", "pydantic", "orjson", "baton.", "vllm", "ray.", "Exception"):
        assert word not in err["message"], err["message"]
    return dict(err)


RAW_BAD: list[tuple[str, bytes]] = [
    ("malformed JSON", b'{"model": '),
    ("not an object", b'["hi"]'),
    ("a number", b"42"),
    ("empty", b""),
    ("not UTF-8", b'{"model": "\xff\xfe"}'),
]

# (what, change to the body) -> 400
TYPED_BAD: list[tuple[str, dict[str, Any]]] = [
    ("max_tokens as text", {"max_tokens": "many"}),
    ("negative max_tokens", {"max_tokens": -5}),
    ("huge max_tokens", {"max_tokens": 10**30}),
    ("temperature as a list", {"temperature": [1]}),
    ("temperature far out of range", {"temperature": 1e308}),
    ("n zero", {"n": 0}),
    ("n huge", {"n": 10**9}),
    ("model as a number", {"model": 7}),
    ("stream as text", {"stream": "yes"}),
]


@pytest.mark.parametrize("endpoint", ALL_ENDPOINTS)
@pytest.mark.parametrize("what, raw", RAW_BAD, ids=[w for w, _ in RAW_BAD])
def test_unparseable_bodies(http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, endpoint: str,
                            what: str, raw: bytes) -> None:
    key = make_tenant([catalogue.small])
    resp = http.post(endpoint, headers={**key.headers, "content-type": "application/json"}, content=raw)
    assert resp.status_code == 400
    _openai_error(resp)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("what, change", TYPED_BAD, ids=[w for w, _ in TYPED_BAD])
def test_wrong_types_and_numbers(http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, endpoint: str,
                                 what: str, change: dict[str, Any]) -> None:
    key = make_tenant([catalogue.small])
    body = {**_body(endpoint, catalogue.small), **change}
    resp = http.post(endpoint, headers=key.headers, json=body)
    _openai_error(resp)
    assert resp.status_code in (400, 404)  # a model named 7 is unknown; everything else is invalid


# (endpoint, change to the body, the param the client is told) -> 400 from the gateway, the engine never asked
# (the engine's own answers name its internals: pydantic classes, its environment variables)
OPENAI_LIMITS: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"},
                                           {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]},
     "messages[1].tool_calls[0].function"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ("/v1/completions", {"prompt": ["hi"] * 1025}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2]] * 1025}, "prompt"),
    ("/v1/embeddings", {"input": ["hi"] * 2049}, "input"),
]


@pytest.mark.parametrize("endpoint, change, param", OPENAI_LIMITS)
def test_openai_limits_are_answered_with_the_clients_field(http: httpx.Client, catalogue: Catalogue,
                                                           make_tenant: MakeTenant, endpoint: str,
                                                           change: dict[str, Any], param: str) -> None:
    key = make_tenant([catalogue.small])
    resp = http.post(endpoint, headers=key.headers, json={**_body(endpoint, catalogue.small), **change})
    assert resp.status_code == 400
    err = _openai_error(resp)
    assert err["param"] == param, err
    for word in ("Param", "ctx", "constrained", "VLLM_", "{'"):
        assert word not in err["message"], err["message"]


SURROGATES = [
    ("/v1/chat/completions", b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", b'{"model": "%s", "messages": [{"role": "user", "content": "ok"}], "stop": ["\\udfff"]}',
     "stop[0]"),
    ("/v1/completions", b'{"model": "%s", "prompt": "x\\ud83d", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"model": "%s", "prompt": ["fine", "\\udc00"], "max_tokens": 2}', "prompt[1]"),
]


@pytest.mark.parametrize("endpoint, raw, param", SURROGATES)
def test_lone_surrogates_are_the_clients_error(http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant,
                                               endpoint: str, raw: bytes, param: str) -> None:
    key = make_tenant([catalogue.small])
    resp = http.post(endpoint, headers={**key.headers, "content-type": "application/json"},
                     content=raw.replace(b"%s", catalogue.small.encode()))
    assert resp.status_code == 400
    err = _openai_error(resp)
    assert "not valid Unicode" in err["message"] and err["param"] == param
    # a well-formed pair (an emoji written as two escapes) is text like any other
    emoji = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 2}'
    ok = http.post("/v1/chat/completions", headers={**key.headers, "content-type": "application/json"},
                   content=emoji.replace(b"%s", catalogue.small.encode()))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("endpoint", ALL_ENDPOINTS)
def test_an_oversize_body_is_refused_by_its_length(http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant,
                                                   endpoint: str) -> None:
    key = make_tenant([catalogue.small])
    body = _body(endpoint, catalogue.small)
    big = "x" * (5 * 2**20)
    body["user"] = big
    resp = http.post(endpoint, headers=key.headers, json=body)
    assert resp.status_code == 413
    err = _openai_error(resp)
    assert err["code"] == "request_too_large" and "MiB" in err["message"]


def test_an_oversize_chunked_body_is_cut_off_before_it_is_read_whole(gateway_url: str, catalogue: Catalogue,
                                                                     make_tenant: MakeTenant) -> None:
    """No Content-Length: the server answers 413 while the client is still sending (the client's socket
    sees the answer, or a reset, long before 64 MiB have gone)."""
    key = make_tenant([catalogue.small])
    url = urlsplit(gateway_url)
    sent = 0
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n" + f"Authorization: Bearer {key.secret}\r\n\r\n".encode())
        chunk = b"x" * 65536
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        s.sendall(b"6\r\n{\"a\":\"\r\n")
        try:
            while sent < 64 * 2**20:
                s.sendall(frame)
                sent += len(chunk)
                s.settimeout(0)
                try:
                    if s.recv(1, socket.MSG_PEEK):
                        break
                except BlockingIOError:
                    pass
                finally:
                    s.settimeout(30)
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.settimeout(30)
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert sent < 16 * 2**20


def test_unknown_endpoints_answer_in_openai_shape(http: httpx.Client, catalogue: Catalogue,
                                                  make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.small])
    for method, path, words in [("POST", "/v1/images/generations", "does not serve POST /v1/images/generations"),
                                ("POST", "/v1/nothing/here", "does not serve POST /v1/nothing/here")]:
        resp = http.request(method, path, headers=key.headers, json={})
        assert resp.status_code == 404
        err = _openai_error(resp)
        assert words in err["message"] and "POST /v1/chat/completions" in err["message"]
        assert "POST /v1/batches" in err["message"]
    not_a_form = http.post("/v1/files", headers=key.headers, json={"purpose": "batch"})  # JSON, not a form upload
    assert not_a_form.status_code == 400 and _openai_error(not_a_form)["param"] in ("file", "purpose")
    wrong = http.get("/v1/chat/completions", headers=key.headers)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert _openai_error(wrong)["code"] == "method_not_allowed"
