"""``/v1/responses`` with the official openai client against the whole app (real Postgres and Redis, the
streaming stub as the engine): plain and streamed, a second turn with ``previous_response_id``, retrieve and
delete, tenant isolation, retention, and what it refuses."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select, update

from baton.core import models as m
from baton.core.db import Database

from .conftest import Catalogue, MakeTenant, wait_for


def _client(gateway_url: str, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=secret, max_retries=0)


def _upstream(stub_url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{stub_url}/_last").json()["body"]
    return body


def test_a_response_plain_then_a_second_turn(gateway_url: str, stub_url: str, catalogue: Catalogue,
                                             make_tenant: MakeTenant, db: Database) -> None:
    key = make_tenant([catalogue.big])
    client = _client(gateway_url, key.secret)
    first = client.responses.create(model=catalogue.big, input="What is Baton?", instructions="Be brief.",
                                    max_output_tokens=3, metadata={"ticket": "42"})
    assert first.id.startswith("resp_") and first.object == "response"
    assert first.output_text == "tok tok tok "
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.usage.output_tokens == 3 and first.usage.input_tokens > 0
    assert first.metadata == {"ticket": "42"}
    sent = _upstream(stub_url)
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "What is Baton?"}]
    assert sent["max_tokens"] == 3

    second = client.responses.create(model=catalogue.big, previous_response_id=first.id, max_output_tokens=2,
                                     input=[{"role": "user", "content": [{"type": "input_text", "text": "More?"}]}])
    assert second.previous_response_id == first.id and second.output_text == "tok tok "
    # the conversation goes on; the first turn's instructions do not
    assert _upstream(stub_url)["messages"] == [{"role": "user", "content": "What is Baton?"},
                                               {"role": "assistant", "content": "tok tok tok "},
                                               {"role": "user", "content": "More?"}]
    # metered like any chat request
    wait_for(lambda: _usage_rows(db, key.tenant_id) >= 2)


def _usage_rows(db: Database, tenant_id: uuid.UUID) -> int:
    with db.system() as uow:
        return len(list(uow.session.scalars(select(m.UsageRecord).where(m.UsageRecord.tenant_id == tenant_id))))


def test_a_streamed_response_sends_the_responses_events(gateway_url: str, catalogue: Catalogue,
                                                        make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.big])
    client = _client(gateway_url, key.secret)
    events = list(client.responses.create(model=catalogue.big, input="stream it", max_output_tokens=4, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "tok tok tok tok " and len(deltas) == 4
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "tok tok tok tok " and final.usage.output_tokens == 4
    # stored before the last event: the next turn finds it at once, and so does retrieve
    again = client.responses.retrieve(final.id)
    assert again.output_text == final.output_text
    nxt = client.responses.create(model=catalogue.big, previous_response_id=final.id, input="and?",
                                  max_output_tokens=1)
    assert nxt.output_text == "tok "


def test_retrieve_delete_isolation_and_retention(gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant,
                                                 db: Database) -> None:
    from baton.control.jobs import purge_responses

    a, b = make_tenant([catalogue.big]), make_tenant([catalogue.big])
    ca, cb = _client(gateway_url, a.secret), _client(gateway_url, b.secret)
    kept = ca.responses.create(model=catalogue.big, input="keep me", max_output_tokens=1)
    assert ca.responses.retrieve(kept.id).id == kept.id
    with pytest.raises(openai.NotFoundError):  # another tenant's id is not found, not forbidden
        cb.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        cb.responses.create(model=catalogue.big, input="x", previous_response_id=kept.id)

    unstored = ca.responses.create(model=catalogue.big, input="forget me", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        ca.responses.retrieve(unstored.id)

    ca.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        ca.responses.retrieve(kept.id)

    old = ca.responses.create(model=catalogue.big, input="old", max_output_tokens=1)
    with db.system() as uow:
        uow.session.execute(update(m.StoredResponse).where(m.StoredResponse.id == old.id)
                            .values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
        uow.commit()
    with pytest.raises(openai.NotFoundError):
        ca.responses.retrieve(old.id)
    assert purge_responses(db) >= 1
    with db.system() as uow:
        assert uow.responses.get(old.id) is None


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_what_it_refuses_is_a_400_naming_the_field(http: httpx.Client, catalogue: Catalogue,
                                                   make_tenant: MakeTenant, extra: dict[str, Any],
                                                   param: str) -> None:
    key = make_tenant([catalogue.big])
    body = {"model": catalogue.big, "input": "hi", **extra}
    resp = http.post("/v1/responses", headers=key.headers, json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_an_unknown_previous_response_or_model(http: httpx.Client, catalogue: Catalogue,
                                               make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.big])
    resp = http.post("/v1/responses", headers=key.headers,
                     json={"model": catalogue.big, "input": "hi", "previous_response_id": "resp_nope"})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "previous_response_id"
    resp = http.post("/v1/responses", headers=key.headers, json={"model": catalogue.other, "input": "hi"})
    assert resp.status_code == 404


def test_text_that_is_not_unicode(http: httpx.Client, catalogue: Catalogue, make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.big])
    raw = b'{"model": "%s", "input": [{"role": "user", "content": "a\\ud800b"}]}' % catalogue.big.encode()
    resp = http.post("/v1/responses", headers={**key.headers, "content-type": "application/json"}, content=raw)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input[0].content"
