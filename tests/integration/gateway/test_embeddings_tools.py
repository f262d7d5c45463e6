"""``/v1/embeddings`` and tool calls through the gateway process, with the official client: what the catalogue
says about a model (its kind, its tool-call parser) decides what the gateway lets through, before any engine
work; embeddings are metered by their input tokens. The engines' side (vLLM's pooling runner, the chat
template and parser reaching the engine) is tested in ``tests/e2e/test_openai_surface.py``."""

from __future__ import annotations

import httpx
import openai
import pytest

from baton.core.db import Database
from baton.core.settings import Settings
from tests.integration.gateway.conftest import (
    Catalogue,
    MakeTenant,
    openai_client,
    request_rows,
    usage_rows,
    wait_for,
)
from tests.integration.gateway.stub_upstream import EMBED_DIMS, EMBED_TOKENS_PER_INPUT
from tests.integration.gateway.test_gateway import EVENT_S

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
HI = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_embeddings_are_served_and_metered_by_input_tokens(
    gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant, db: Database, http: httpx.Client
) -> None:
    key = make_tenant([catalogue.embed])
    client = openai_client(gateway_url, key)
    one = client.embeddings.create(model=catalogue.embed, input="hello")
    assert len(one.data) == 1 and len(one.data[0].embedding) == EMBED_DIMS
    many = client.embeddings.create(model=catalogue.embed, input=["a", "b", "c"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.usage.prompt_tokens == 3 * EMBED_TOKENS_PER_INPUT
    ids = client.embeddings.create(model=catalogue.embed, input=[[1, 2, 3], [4, 5]])
    assert len(ids.data) == 2

    rows = wait_for(lambda: (r := usage_rows(db, key.tenant_id)) and len(r) == 3 and r)
    assert sorted(r.prompt_tokens for r in rows) == sorted(EMBED_TOKENS_PER_INPUT * n for n in (1, 3, 2))
    assert all(r.completion_tokens == 0 for r in rows)
    records = wait_for(lambda: (r := request_rows(db, key.tenant_id)) and len(r) == 3 and r)
    assert {r.endpoint for r in records} == {"embeddings"}


def test_the_engine_gets_no_cache_salt_for_embeddings(
    stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant, http: httpx.Client
) -> None:
    key = make_tenant([catalogue.embed])
    resp = http.post("/v1/embeddings", headers=key.headers, json={"model": catalogue.embed, "input": "x"})
    assert resp.status_code == 200, resp.text
    last = httpx.get(f"{stub_url}/_last").json()
    assert last["path"] == "/v1/embeddings" and "cache_salt" not in last["body"]


@pytest.mark.parametrize("fields, param", [
    ('"input": ""', "input"),
    ('"input": []', "input"),
    ('"input": [[]]', "input"),
    ('"input": [' + ", ".join(['"x"'] * 2049) + "]", "input"),
    ('"input": 7', "input"),
    ('"input": "x", "encoding_format": "hex"', "encoding_format"),
    ('"input": "x", "dimensions": 0', "dimensions"),
    ('"input": "a\\ud800b"', "input"),
], ids=["empty text", "no inputs", "empty token list", "too many inputs", "a number", "unknown encoding",
        "zero dimensions", "lone surrogate"])
def test_bad_embedding_requests_are_400s(catalogue: Catalogue, make_tenant: MakeTenant, http: httpx.Client,
                                         fields: str, param: str) -> None:
    key = make_tenant([catalogue.embed])
    content = f'{{"model": "{catalogue.embed}", {fields}}}'.encode()
    resp = http.post("/v1/embeddings", headers={**key.headers, "content-type": "application/json"}, content=content)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] is not None and err["param"].startswith(param), err


def test_an_input_longer_than_the_context_is_refused(catalogue: Catalogue, make_tenant: MakeTenant,
                                                     http: httpx.Client) -> None:
    key = make_tenant([catalogue.embed])
    resp = http.post("/v1/embeddings", headers=key.headers,
                     json={"model": catalogue.embed, "input": [[1, 2], list(range(65))]})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_each_model_serves_its_kind_only(gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.embed, catalogue.small])
    client = openai_client(gateway_url, key)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=catalogue.small, input="hello")
    assert err.value.code == "model_not_supported" and "embedding model" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=catalogue.embed, messages=HI)
    assert err.value.code == "model_not_supported" and "/v1/embeddings" in err.value.message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=catalogue.embed, prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=catalogue.embed, input="x")


def test_tool_calls_need_a_tool_call_parser(
    gateway_url: str, stub_url: str, catalogue: Catalogue, make_tenant: MakeTenant
) -> None:
    key = make_tenant([catalogue.small, catalogue.tools])
    client = openai_client(gateway_url, key)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (openai.NOT_GIVEN, "auto", "required", named):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=catalogue.small, messages=HI, tools=TOOLS, tool_choice=choice)
        assert err.value.param == "tool_choice" and "not set up for tool calls" in err.value.message
        assert "--" not in err.value.message and "vllm" not in err.value.message.lower()

    # tools offered but not to be called: any model
    client.chat.completions.create(model=catalogue.small, messages=HI, tools=TOOLS, tool_choice="none")

    for choice in (openai.NOT_GIVEN, "required", named):  # a model with a parser
        client.chat.completions.create(model=catalogue.tools, messages=HI, tools=TOOLS, tool_choice=choice)
        assert httpx.get(f"{stub_url}/_last").json()["body"]["tools"] == TOOLS


def test_a_catalogue_change_reaches_every_gateways_cached_grants(
    gateway_url: str, catalogue: Catalogue, make_tenant: MakeTenant, db: Database, settings: Settings
) -> None:
    """The key's grants are cached for 30 s; a model whose tool-call parser the operator removes is refused
    tool calls at once (the catalogue drops every gateway's cached grants), and accepted again when it is back."""
    import redis

    from baton.control.catalogue import Catalogue as CatalogueService
    from baton.control.catalogue import ModelChanges
    from baton.control.usecase import Actor, RedisNotifier

    name = catalogue.tools
    key = make_tenant([name])
    client = openai_client(gateway_url, key)
    client.chat.completions.create(model=name, messages=HI, tools=TOOLS)  # the grant is cached now
    with db.system() as uow:
        model_id = uow.models.by_name(name).id  # type: ignore[union-attr]
    service = CatalogueService(settings, db, RedisNotifier(redis.Redis.from_url(settings.redis.url), lambda _: None))

    def refused() -> bool:
        try:
            client.chat.completions.create(model=name, messages=HI, tools=TOOLS)
        except openai.BadRequestError as err:
            return err.param == "tool_choice"
        return False

    try:
        service.update_model(Actor("test"), model_id, ModelChanges(tool_call_parser=""))
        wait_for(refused, timeout=EVENT_S)
    finally:
        service.update_model(Actor("test"), model_id, ModelChanges(tool_call_parser="hermes"))
    wait_for(lambda: not refused(), timeout=EVENT_S)
