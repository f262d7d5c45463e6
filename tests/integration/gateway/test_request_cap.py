"""A per-request token cap (``rate_limits.max_tokens_per_request``, the tenant's or one key's) through the
gateway process: a request that asks for more is a 400 in OpenAI's shape before the upstream sees it
(the stub's last body does not change), one that names no limit is sent with what the cap leaves as its
limit, the smaller of the tenant's and the key's caps applies, embeddings count their inputs, and a
rotated key keeps its cap."""

from __future__ import annotations

import httpx

from baton.control.keys import KeyService
from tests.integration.gateway.conftest import Catalogue, MakeTenant

WORDS = "one two three four five six seven eight nine ten " * 4  # ~40 tokens by any count


def _chat(http: httpx.Client, headers: dict[str, str], model: str, **extra: object) -> httpx.Response:
    return http.post("/v1/chat/completions", headers=headers,
                     json={"model": model, "messages": [{"role": "user", "content": WORDS}], **extra})


def _last(stub_url: str) -> dict:
    return httpx.get(f"{stub_url}/_last").json()


def test_a_request_over_its_keys_cap_is_refused_before_the_engine(
    stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant, http: httpx.Client
) -> None:
    key = make_tenant([catalogue.big, catalogue.embed], tenant_limits={"per_request": 1000},
                      key_limits={"per_request": 200})
    ok = _chat(http, key.headers, catalogue.big, max_tokens=50)
    assert ok.status_code == 200, ok.text
    seen = _last(stub_url)

    over = _chat(http, key.headers, catalogue.big, max_tokens=500)  # under the tenant's 1,000, over the key's 200
    assert over.status_code == 400, over.text
    err = over.json()["error"]
    assert (err["code"], err["param"], err["type"]) == ("request_too_large", "max_tokens", "invalid_request_error")
    assert "200 tokens per request" in err["message"]
    two = _chat(http, key.headers, catalogue.big, max_completion_tokens=100, n=2)  # 2 x 100 + the prompt
    assert two.status_code == 400 and two.json()["error"]["param"] == "max_completion_tokens", two.text
    long = http.post("/v1/completions", headers=key.headers,
                     json={"model": catalogue.big, "prompt": WORDS * 6, "max_tokens": 1})
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt", long.text
    embed = http.post("/v1/embeddings", headers=key.headers,
                      json={"model": catalogue.embed, "input": ["one two three four"] * 80})
    assert embed.status_code == 400 and embed.json()["error"]["code"] == "request_too_large", embed.text
    # a Responses request is refused in its own words: its field, not the chat field it maps to
    resp = http.post("/v1/responses", headers=key.headers,
                     json={"model": catalogue.big, "input": "hello there", "max_output_tokens": 500})
    rerr = resp.json()["error"]
    assert resp.status_code == 400 and (rerr["code"], rerr["param"]) == ("request_too_large", "max_output_tokens")
    assert "`max_output_tokens`" in rerr["message"] and "max_tokens`" not in rerr["message"], rerr
    assert _last(stub_url) == seen  # none of them reached the upstream

    # no limit named: the engine is told what the cap leaves
    free = _chat(http, key.headers, catalogue.big)
    assert free.status_code == 200, free.text
    sent = _last(stub_url)["body"]
    assert 0 < sent["max_completion_tokens"] < 200
    assert sent["max_completion_tokens"] + free.json()["usage"]["prompt_tokens"] <= 200


def test_a_rotated_key_keeps_its_cap(catalogue: Catalogue, make_tenant: MakeTenant, keys: KeyService,
                                     http: httpx.Client) -> None:
    key = make_tenant([catalogue.big], key_limits={"per_request": 120})
    successor = keys.rotate(tenant_id=key.tenant_id, key_id=key.key_id, actor="test")
    headers = {"authorization": f"Bearer {successor.secret}"}
    assert _chat(http, headers, catalogue.big, max_tokens=10).status_code == 200
    over = _chat(http, headers, catalogue.big, max_tokens=300)
    assert over.status_code == 400 and over.json()["error"]["code"] == "request_too_large", over.text


def test_without_a_cap_the_request_goes_as_sent(stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant,
                                               http: httpx.Client) -> None:
    key = make_tenant([catalogue.big])
    assert _chat(http, key.headers, catalogue.big, max_tokens=500).status_code == 200
    body = _last(stub_url)["body"]
    assert body["max_tokens"] == 500 and "max_completion_tokens" not in body
    assert _chat(http, key.headers, catalogue.big).status_code == 200
    assert "max_completion_tokens" not in _last(stub_url)["body"]
