"""What the catalogue says about a model reaches the engines Ray Serve runs: an embedding model served by
vLLM's pooling runner (``/v1/embeddings``), and a chat model with a tool-call parser and a chat template
that renders tools (a whole tool-call round trip, plain and streamed). Checked with the official client
against the Serve apps the session stack's reconciler runs from the catalogue (``baton up``'s ``tiny-embed``
and ``tiny-llama``, the latter with the ``hermes`` parser and a template that renders tools)."""

from __future__ import annotations

import json
import math

import openai
import pytest

from baton.dataplane.tinymodel import DEFAULT_SHAPE

pytestmark = pytest.mark.e2e

# `strict`: the arguments follow the schema (as in OpenAI's API); the enum keeps a random model's string short
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)


def test_an_embedding_model_is_served_by_the_pooling_runner(baton_stack):
    model = baton_stack.embed_model
    client = _client(baton_stack.app_url(baton_stack.embed_deployment))
    out = client.embeddings.create(model=model, input=["the cat sat", "a dog ran far", "the cat sat"])
    vectors = [d.embedding for d in out.data]
    assert [len(v) for v in vectors] == [DEFAULT_SHAPE.hidden_size] * 3
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in vectors)  # normalised
    assert vectors[0] == pytest.approx(vectors[2], abs=1e-5) and vectors[0] != pytest.approx(vectors[1], abs=1e-3)
    assert out.usage.prompt_tokens > 0 and out.usage.total_tokens == out.usage.prompt_tokens

    with pytest.raises(openai.APIStatusError) as refused:  # no generation on an embedding model (the
        client.completions.create(model=model, prompt="hello", max_tokens=2)  # gateway says so first)
    assert refused.value.status_code in (400, 404)


def test_a_tool_call_round_trip_on_a_model_with_a_parser_and_a_tools_template(baton_stack):
    model = baton_stack.model
    client = _client(baton_stack.app_url(baton_stack.deployment))
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=256, temperature=0)
    calls = first.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", first
    args = json.loads(calls[0].function.arguments)
    assert args in ({"city": "Paris"}, {"city": "Rome"}) and first.choices[0].finish_reason == "tool_calls"

    # the answer goes back with the tool's result: the template renders both, the model answers in text
    second = client.chat.completions.create(model=model, temperature=0, max_tokens=8, tools=TOOLS, messages=[
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"sky": "clear", "celsius": 21}'},
    ], tool_choice="none")
    assert second.choices[0].message.tool_calls in (None, [])
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered

    # the same call streamed: tool-call deltas assemble into the same call
    name, arguments = "", ""
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                                max_tokens=256, temperature=0, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name += delta.function.name or "" if delta.function else ""
            arguments += delta.function.arguments or "" if delta.function else ""
    assert name == "get_weather" and json.loads(arguments) == args

    # with a parser the engine takes `auto` (the tiny model answers in text or with a call; both are fine)
    auto = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="auto",
                                          max_tokens=8, temperature=0)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
