"""The gateway end to end over HTTP: real Postgres, real Redis, a stub engine behind it."""

from __future__ import annotations

import socket

import httpx
import openai
import orjson
import pytest

from baton.control.keys import KeyService, RedisKeyEvents, publish_invalidation
from baton.core import models as m
from baton.core.db import Database
from baton.core.secrets import cache_salt
from baton.core.settings import Settings
from tests.integration.gateway.conftest import (
    Catalogue,
    MakeTenant,
    openai_client,
    request_rows,
    usage_rows,
    wait_for,
)

#: How long a test waits for an invalidation event to reach the gateway: generous, and well below the key
#: cache's 30 s lifetime, so only the event can explain the change (the time itself is `baton bench revoke`'s).
EVENT_S = 10.0


def _error(resp: httpx.Response) -> dict[str, object]:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_the_openai_client_lists_completes_and_streams(
    gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant, db: Database
) -> None:
    key = make_tenant([catalogue.small, catalogue.big])
    client = openai_client(gateway_url, key)
    assert sorted(x.id for x in client.models.list().data) == sorted([catalogue.small, catalogue.big])

    chat = client.chat.completions.create(model=catalogue.big, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=5)
    assert chat.choices[0].message.content == "tok " * 5
    assert chat.usage is not None and chat.usage.completion_tokens == 5

    chunks = list(client.chat.completions.create(
        model=catalogue.big, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok " * 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4

    plain = list(client.completions.create(model=catalogue.big, prompt="hello", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in plain if c.choices) == "tok " * 3
    assert all(c.usage is None for c in plain)  # the client did not ask for usage: the gateway's chunk is gone

    rows = wait_for(lambda: (r := usage_rows(db, key.tenant_id)) and len(r) == 3 and r)
    assert sorted(r.completion_tokens for r in rows) == [3, 4, 5]
    assert all(r.api_key_id == key.key_id and r.prompt_tokens == 7 for r in rows)
    records = wait_for(lambda: (r := request_rows(db, key.tenant_id)) and len(r) == 3 and r)
    assert {r.status for r in records} == {m.RequestStatus.COMPLETED}
    streamed = [r for r in records if r.stream]
    assert all(r.ttft_ms is not None and r.trace_id for r in streamed)


def test_tenants_see_and_reach_only_their_own_models(
    gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant, db: Database
) -> None:
    a = make_tenant([catalogue.small])
    b = make_tenant([catalogue.other])
    client_a = openai_client(gateway_url, a)
    assert [x.id for x in client_a.models.list().data] == [catalogue.small]
    with pytest.raises(openai.NotFoundError) as err:
        client_a.chat.completions.create(model=catalogue.other, messages=[{"role": "user", "content": "x"}])
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client_a.models.retrieve(catalogue.other)
    # a request a may make: once its row is written, the refused ones would have been too
    client_a.chat.completions.create(model=catalogue.small, messages=[{"role": "user", "content": "x"}], max_tokens=1)
    rows = wait_for(lambda: usage_rows(db, a.tenant_id))
    assert [r.model for r in rows] == [catalogue.small] and usage_rows(db, b.tenant_id) == []


def test_a_keys_model_scope_narrows_the_tenants_models(
    gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant
) -> None:
    key = make_tenant([catalogue.small, catalogue.big], scope=(catalogue.big,))
    client = openai_client(gateway_url, key)
    assert [x.id for x in client.models.list().data] == [catalogue.big]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=catalogue.small, prompt="x")


def test_cache_salt_is_the_tenants_and_server_fields_are_dropped(
    gateway_url: str, stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant, settings: Settings,
    http: httpx.Client,
) -> None:
    key = make_tenant([catalogue.big])
    resp = http.post("/v1/chat/completions", headers={**key.headers, "traceparent":
                     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                     json={"model": catalogue.big, "messages": [{"role": "user", "content": "x"}],
                           "cache_salt": "chosen-by-client", "kv_transfer_params": {"lmcache.tag.tenant": "b"},
                           "priority": -100, "top_k": 5})
    assert resp.status_code == 200, resp.text
    last = httpx.get(f"{stub_url}/_last").json()
    body = last["body"]
    assert body["cache_salt"] == cache_salt(settings.security.key_secret.get_secret_value(), key.tenant_id)
    assert "kv_transfer_params" not in body
    assert body["priority"] == 100  # the gateway's (band 50, nothing else running), never the client's -100
    assert body["top_k"] == 5  # engine extensions pass through
    # The client's trace continues: same trace id, the parent is now the gateway's own span.
    sent = last["headers"]["traceparent"].split("-")
    assert sent[1] == "0af7651916cd43dd8448eb211c80319c" and sent[2] != "b7ad6b7169203331"
    assert resp.headers["x-request-id"].startswith("req-")


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "invalid_value", "model"),
        ({"model": "M", "messages": "not a list"}, 400, "invalid_value", "messages"),
        ({"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400,
         "invalid_value", "temperature"),
        ({"model": "M", "messages": [{"role": "user", "content": "x"}], "n": 9}, 400, "unsupported_parameter", "n"),
        ({"model": "M", "messages": [{"role": "user", "content": "x"}], "audio": {"voice": "x"}}, 400,
         "unsupported_parameter", "audio"),
        ({"model": "M", "messages": [{"role": "user", "content": "x" * 2000}]}, 400, "context_length_exceeded",
         "messages"),
        ({"model": "M", "messages": [{"role": "user", "content": "x"}], "max_tokens": 300}, 400,
         "context_length_exceeded", "messages"),
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model_not_found", "model"),
    ],
)
def test_bad_requests_get_openai_errors(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, body: dict[str, object], status: int,
    code: str, param: str,
) -> None:
    key = make_tenant([catalogue.small])
    if body.get("model") == "M":
        body = {**body, "model": catalogue.small}
    resp = http.post("/v1/chat/completions", headers=key.headers, json=body)
    assert resp.status_code == status, resp.text
    err = _error(resp)
    assert (err["code"], err["param"]) == (code, param)


def test_malformed_json_and_missing_keys(http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.small])
    resp = http.post("/v1/chat/completions", headers={**key.headers, "content-type": "application/json"},
                     content=b"{not json")
    assert resp.status_code == 400 and _error(resp)["type"] == "invalid_request_error"
    assert http.get("/v1/models").status_code == 401
    assert http.get("/v1/models", headers={"authorization": "Bearer sk-not-ours"}).status_code == 401
    err = _error(http.get("/v1/models", headers={"authorization": "Bearer bt_live_" + "A" * 32 + "_AAAAAA"}))
    assert err["code"] == "invalid_api_key"
    assert http.get("/v1/nothing-here", headers=key.headers).status_code == 404


def test_revoked_expired_and_suspended(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, keys: KeyService, db: Database,
    settings: Settings,
) -> None:
    key = make_tenant([catalogue.small])
    assert http.get("/v1/models", headers=key.headers).status_code == 200  # cached now
    keys.revoke(tenant_id=key.tenant_id, key_id=key.key_id, actor="test")
    wait_for(lambda: http.get("/v1/models", headers=key.headers).status_code == 401, timeout=EVENT_S)

    other = make_tenant([catalogue.small])
    assert http.get("/v1/models", headers=other.headers).status_code == 200
    with db.system() as uow:
        tenant = uow.tenants.require(other.tenant_id)
        tenant.status = m.TenantStatus.SUSPENDED
        uow.commit()
    import redis

    publish_invalidation(redis.Redis.from_url(settings.redis.url), "tenant", other.tenant_id)
    resp = wait_for(lambda: (r := http.get("/v1/models", headers=other.headers)).status_code == 403 and r,
                    timeout=EVENT_S)
    assert _error(resp)["type"] == "permission_error"


def test_rotation_keeps_the_old_key_for_the_overlap(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, db: Database, settings: Settings
) -> None:
    import datetime as dt

    key = make_tenant([catalogue.small])
    service = KeyService(db, settings, events=RedisKeyEvents.from_settings(settings))
    new = service.rotate(tenant_id=key.tenant_id, key_id=key.key_id, actor="t", overlap=dt.timedelta(hours=1))
    assert http.get("/v1/models", headers=key.headers).status_code == 200
    assert http.get("/v1/models", headers={"authorization": f"Bearer {new.secret}"}).status_code == 200
    newer = service.rotate(tenant_id=key.tenant_id, key_id=new.key.id, actor="t", overlap=dt.timedelta(0))
    wait_for(lambda: http.get("/v1/models", headers={"authorization": f"Bearer {new.secret}"}).status_code == 401,
             timeout=EVENT_S)
    assert http.get("/v1/models", headers={"authorization": f"Bearer {newer.secret}"}).status_code == 200


def test_a_rotated_key_keeps_its_rate_limit_and_shares_it_with_the_old_key(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, db: Database, settings: Settings
) -> None:
    """A key limited to 3 RPM, 2 used, then rotated (the path both the admin API and the console take): the
    successor has the limit, and the old key, still in its overlap, counts against the same bucket: one
    more request between them, then 429 on both (before, the successor had no limit at all)."""
    import datetime as dt

    key = make_tenant([catalogue.big], key_limits={"rpm": 3, "tpm": 100_000})
    body = {"model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert [http.post("/v1/chat/completions", headers=key.headers, json=body).status_code for _ in range(2)] == [200,
                                                                                                              200]
    service = KeyService(db, settings, events=RedisKeyEvents.from_settings(settings))
    new = service.rotate(tenant_id=key.tenant_id, key_id=key.key_id, actor="t", overlap=dt.timedelta(hours=1))
    with db.system() as uow:
        assert [r.api_key_id for r in uow.rate_limits.for_tenant(key.tenant_id) if r.api_key_id] == [new.key.id]
    new_headers = {"authorization": f"Bearer {new.secret}"}
    first = http.post("/v1/chat/completions", headers=new_headers, json=body)
    assert first.status_code == 200 and first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "0"  # the old key's two count
    assert http.post("/v1/chat/completions", headers=new_headers, json=body).status_code == 429
    old = wait_for(lambda: (r := http.post("/v1/chat/completions", headers=key.headers, json=body)).status_code
                   == 429 and r, timeout=EVENT_S)  # the old key's cached principal reloads on the rotation event
    assert _error(old)["code"] == "rate_limit_exceeded"


def test_rate_limited_requests_get_429_with_openai_headers(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant
) -> None:
    key = make_tenant([catalogue.big], key_limits={"rpm": 3, "tpm": 100_000})
    body = {"model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    ok = [http.post("/v1/chat/completions", headers=key.headers, json=body) for _ in range(3)]
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert ok[0].headers["x-ratelimit-limit-requests"] == "3"
    assert ok[0].headers["x-ratelimit-remaining-requests"] == "2"
    assert ok[2].headers["x-ratelimit-remaining-requests"] == "0"
    assert ok[0].headers["x-ratelimit-limit-tokens"] == "100000"
    refused = http.post("/v1/chat/completions", headers=key.headers, json=body)
    assert refused.status_code == 429
    assert _error(refused)["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")


def test_tokens_per_minute_counts_real_usage(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant
) -> None:
    # Each request reserves ~prompt + 500; real usage is 7 + 2. After correction many more fit.
    key = make_tenant([catalogue.big], tenant_limits={"tpm": 1100})
    body = {"model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 500}
    first = http.post("/v1/chat/completions", headers=key.headers, json={**body, "max_tokens": 2})
    assert first.status_code == 200
    too_big = http.post("/v1/chat/completions", headers=key.headers, json={**body, "max_tokens": 2000})
    assert too_big.status_code == 429 and _error(too_big)["type"] == "tokens"
    # The correction lands just after each response; a 429 before it is retried for a few seconds, far less
    # than the ~27 s the bucket needs to refill one uncorrected reservation of ~500 tokens.
    for _ in range(6):
        wait_for(lambda: http.post("/v1/chat/completions", headers=key.headers, json=body).status_code == 200,
                 timeout=5)


def test_concurrency_slots_are_released_when_clients_go_away(
    gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant, db: Database
) -> None:
    key = make_tenant([catalogue.big], key_limits={"concurrency": 1})
    body = orjson.dumps({"model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 50,
                         "stream": True, "stub_token_delay": 0.05})
    host, port = gateway_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 + f"authorization: Bearer {key.secret}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while received.count(b'"content":"tok ') < 3:
        received += sock.recv(65536)
    with httpx.Client(base_url=gateway_url) as c:
        busy = c.post("/v1/chat/completions", headers=key.headers,
                      json={"model": catalogue.big, "messages": [{"role": "user", "content": "x"}]})
        assert busy.status_code == 429
        sock.close()  # the client goes away mid-stream
        wait_for(lambda: c.post("/v1/chat/completions", headers=key.headers, json={
            "model": catalogue.big, "messages": [{"role": "user", "content": "x"}]}).status_code == 200, timeout=5)
    records = wait_for(lambda: (r := [x for x in request_rows(db, key.tenant_id) if x.stream]) and r)
    assert records[0].status is m.RequestStatus.CANCELLED
    usage = wait_for(lambda: (u := usage_rows(db, key.tenant_id)) and len(u) == 2 and u)
    cancelled = [u for u in usage if u.request_id == records[0].id]
    assert len(cancelled) == 1 and 3 <= cancelled[0].completion_tokens < 50


def test_a_cut_upstream_stream_ends_with_an_error_event(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, db: Database
) -> None:
    key = make_tenant([catalogue.big])
    with http.stream("POST", "/v1/chat/completions", headers=key.headers, json={
        "model": catalogue.big, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10, "stream": True,
        "stub_cut_after": 3,
    }) as resp:
        assert resp.status_code == 200
        body = resp.read()
    assert body.count(b'"content":"tok "') == 3
    # The stub gives no token ids, so the stream cannot be resumed: an SSE error, and the record says why.
    assert b"event: error" in body and b'"code":"upstream_stream_broken"' in body
    record = wait_for(lambda: request_rows(db, key.tenant_id))[0]
    assert record.status is m.RequestStatus.FAILED and record.error_code == "upstream_stream_broken"
    assert [(s["step"], s["outcome"]) for s in record.recovery_steps] == [("decode_resume", "failed")]


def test_upstream_errors_and_unreachable_models(
    http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant, db: Database
) -> None:
    key = make_tenant([catalogue.big])
    msg = [{"role": "user", "content": "x"}]
    refused = http.post("/v1/chat/completions", headers=key.headers,
                        json={"model": catalogue.big, "messages": msg, "stub_status": 400})
    assert refused.status_code == 400 and _error(refused)["message"] == "stub refused"
    broken = http.post("/v1/chat/completions", headers=key.headers,
                       json={"model": catalogue.big, "messages": msg, "stub_status": 500})
    assert broken.status_code == 502 and "stub" not in _error(broken)["message"]
    records = wait_for(lambda: (r := request_rows(db, key.tenant_id)) and len(r) == 2 and r)
    assert {r.status for r in records} == {m.RequestStatus.FAILED}
    assert usage_rows(db, key.tenant_id) == []
