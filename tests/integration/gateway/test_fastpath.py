"""The hot routes' fast path (api/gateway/fastpath.py): it serves the plain case itself, and every other
request gets exactly what the FastAPI route gives, which an app without the fast path shows side by side."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from baton.api.gateway.fastpath import FastPath
from baton.core.settings import Settings
from tests.integration.gateway.conftest import Catalogue, MakeTenant, serve


@pytest.fixture(scope="module")
def routes_only_url(gw_settings: Settings) -> Iterator[str]:
    """The same app without the fast path: every request through FastAPI's routes."""
    from baton.api.app import create_app

    app = create_app(gw_settings, optional_routers=())
    app.user_middleware = [mw for mw in app.user_middleware if mw.cls is not FastPath]
    with serve(app) as url:
        yield url


def _seen(resp: httpx.Response) -> tuple[int, Any]:
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code == 200 and isinstance(body, dict):
        body = [c.get("message", c.get("text")) for c in body["choices"]]  # ids and times differ per call
    return resp.status_code, body


#: The cases answered with a 200 (the rest are refused).
SERVED = ("plain chat", "plain completion", "lower-case scheme")


def test_every_request_gets_what_the_route_gives(gateway_url: str, routes_only_url: str, catalogue: Catalogue,
                                                  make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.small])
    auth = key.headers["authorization"]
    chat = {"model": catalogue.small, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    json_h = {"authorization": auth, "content-type": "application/json"}
    cases: list[tuple[str, str, dict[str, str], bytes | None, Any]] = [
        ("plain chat", "/v1/chat/completions", json_h, None, chat),
        ("plain completion", "/v1/completions", json_h, None,
         {"model": catalogue.small, "prompt": "once", "max_tokens": 2}),
        ("no key", "/v1/chat/completions", {"content-type": "application/json"}, None, chat),
        ("lower-case scheme", "/v1/chat/completions", {**json_h, "authorization": "bearer " + auth[7:]}, None, chat),
        ("another scheme", "/v1/chat/completions", {**json_h, "authorization": "Basic eDp5"}, None, chat),
        ("unknown key", "/v1/chat/completions", {**json_h, "authorization": "Bearer bt_live_nope"}, None, chat),
        ("not JSON", "/v1/chat/completions", json_h, b"{nope", None),
        ("a JSON list", "/v1/chat/completions", json_h, b"[1]", None),
        ("no messages", "/v1/chat/completions", json_h, None, {"model": catalogue.small}),
        ("wrong type", "/v1/chat/completions", json_h, None, {**chat, "max_tokens": "many"}),
        ("text/plain", "/v1/chat/completions", {**json_h, "content-type": "text/plain"}, None, chat),
        ("no content type", "/v1/chat/completions", {"authorization": auth}, None, chat),
        ("model not granted", "/v1/chat/completions", json_h, None, {**chat, "model": catalogue.other}),
        ("too long", "/v1/chat/completions", json_h, None, {**chat, "max_tokens": 100_000}),
        ("unsupported", "/v1/chat/completions", json_h, None, {**chat, "audio": {"voice": "x"}}),
    ]
    with httpx.Client(base_url=gateway_url, timeout=30) as fast, \
            httpx.Client(base_url=routes_only_url, timeout=30) as routes:
        for name, path, headers, raw, payload in cases:
            content = raw if raw is not None else httpx.Request("POST", "/", json=payload).content
            got = _seen(fast.post(path, headers=headers, content=content))
            want = _seen(routes.post(path, headers=headers, content=content))
            assert got == want, name
            assert (got[0] == 200) == (name in SERVED), name


def test_the_plain_case_is_served_without_the_route(gateway_url: str, catalogue: Catalogue,
                                                     make_tenant: MakeTenant, monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[bool] = []
    real = FastPath._serve

    async def watched(self: FastPath, *args: Any, **kwargs: Any) -> bool:
        handled = await real(self, *args, **kwargs)
        served.append(handled)
        return handled

    monkeypatch.setattr(FastPath, "_serve", watched)
    key = make_tenant([catalogue.small])
    chat = {"model": catalogue.small, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with httpx.Client(base_url=gateway_url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", headers=key.headers, json={**chat, "stream": True}) as r:
            assert r.status_code == 200 and b"[DONE]" in r.read()
        assert http.post("/v1/chat/completions", headers=key.headers, json={"model": 1}).status_code == 400
        lower = {"authorization": "bearer " + key.secret}
        assert http.post("/v1/chat/completions", headers=lower, json=chat).status_code == 200
    assert served == [True, False]  # the stream by the fast path; the invalid body handed on; "bearer" never seen
