"""Request checks before any upstream work: parameters, context length, the upstream body."""

from __future__ import annotations

import uuid

import orjson
import pytest

from baton.api.gateway.principals import ModelGrant
from baton.api.gateway.ratelimit import _duration
from baton.api.gateway.service import (
    Call,
    ContextLengthError,
    UnsupportedParameterError,
    check_parameters,
    engine_priority,
    upstream_body,
    with_priority,
)
from baton.api.gateway.tokens import PromptCounter, count_completion_prompt, prompt_count

GRANT = ModelGrant(uuid.uuid4(), "m", 1000, "/nonexistent", 0)


def _call(payload: dict[str, object], stream: bool = False) -> Call:
    return Call("chat/completions", payload, GRANT, 10, 100, stream)


@pytest.mark.parametrize(("payload", "param"), [
    ({"n": 9}, "n"), ({"audio": {}}, "audio"), ({"modalities": ["text", "audio"]}, "modalities"),
    ({"store": True}, "store"), ({"prediction": {"type": "content"}}, "prediction"),
])
def test_unsupported_parameters_are_named(payload: dict[str, object], param: str) -> None:
    with pytest.raises(UnsupportedParameterError) as exc:
        check_parameters(payload)
    assert exc.value.param == param and exc.value.status == 400


def test_supported_parameters_pass() -> None:
    check_parameters({"n": 2, "modalities": ["text"], "store": False, "top_k": 3})


def test_the_body_carries_the_tenants_salt_and_always_asks_for_usage() -> None:
    payload = {"model": "m", "cache_salt": "mine", "kv_transfer_params": {"x": 1}, "priority": -5, "stream": True,
               "stream_options": {"include_usage": False}}
    body, client_usage = upstream_body(_call(payload, stream=True), "tenant-salt")
    sent = orjson.loads(body)
    assert sent["cache_salt"] == "tenant-salt" and "kv_transfer_params" not in sent and "priority" not in sent
    # the engine priority is the gateway's: a higher band first, inside a band a light tenant first
    assert orjson.loads(with_priority(body, engine_priority(50, alone=False))) == {**sent, "priority": 101}
    assert engine_priority(90, alone=True) < engine_priority(90, alone=False) < engine_priority(50, alone=True)
    assert engine_priority(100, alone=True) == 0 and engine_priority(0, alone=False) == 201
    assert sent["stream_options"] == {"include_usage": True} and client_usage is False
    body, _ = upstream_body(_call({"model": "m", "seed": 2**70}), "s")
    assert orjson.loads(body.replace(b"1180591620717411303424", b"0"))["seed"] == 0


def test_prompt_estimates() -> None:
    counter = PromptCounter()
    text, overhead = counter.chat_text([{"role": "user", "content": "hello world"},
                                        {"role": "user", "content": [{"type": "text", "text": "again"}]}])
    assert text == "hello world\nagain" and overhead == 11
    assert counter.count("x" * 40, source="/nope", context_length=1000) == (11, False)
    assert count_completion_prompt([1, 2, 3], counter, source="/nope", context_length=10) == 3
    assert count_completion_prompt([[1, 2], [1, 2, 3, 4]], counter, source="/nope", context_length=10) == 4
    assert prompt_count(["a", "b"]) == 2 and prompt_count([1, 2]) == 1


def test_openai_reset_durations() -> None:
    assert [_duration(x) for x in (120, 1000, 6500, 360_000)] == ["120ms", "1s", "6.5s", "6m0s"]


def test_context_errors_are_openai_codes() -> None:
    assert ContextLengthError.code == "context_length_exceeded" and ContextLengthError.status == 400


def test_a_model_without_a_local_tokenizer_is_known_after_its_first_long_prompt() -> None:
    counter = PromptCounter()
    assert not counter.loaded("/nonexistent")
    assert counter.count("x" * 800, source="/nonexistent", context_length=1000) == (201, False)
    assert counter.loaded("/nonexistent")  # later prompts of this model are counted without a file lookup


def test_a_part_stuck_on_stop_does_not_hang_the_gateways_shutdown(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A background part whose stop never returns (a dead connection) is logged and left behind; the
    parts after it are still stopped."""
    import asyncio
    from types import SimpleNamespace

    from baton.api.gateway import service

    monkeypatch.setattr(service, "STOP_LIMIT_S", 0.05)
    stopped: list[str] = []

    class Part:
        def __init__(self, name: str, hang: bool = False, fail: bool = False) -> None:
            self.name, self.hang, self.fail = name, hang, fail

        async def stop(self) -> None:
            if self.hang:
                await asyncio.Event().wait()
            if self.fail:
                raise ConnectionError("gone")
            stopped.append(self.name)

    gw = SimpleNamespace(listener=Part("listener", hang=True), limiter=Part("limiter", fail=True),
                         meter=Part("meter"), principals=Part("principals"), flow_views=Part("flow views"))
    asyncio.run(asyncio.wait_for(service.Gateway.stop(gw), timeout=5))  # type: ignore[arg-type]
    assert stopped == ["flow views", "meter", "principals"]
    assert "key invalidation listener did not stop" in caplog.text and "rate limiter failed to stop" in caplog.text


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _NoTokenizer(PromptCounter):
    def count(self, *args: object, **kwargs: object) -> tuple[int, bool]:
        raise AssertionError("a prompt that cannot fit the context was tokenized")


@pytest.mark.anyio
async def test_a_prompt_longer_than_any_tokenization_of_the_context_is_refused_untokenized() -> None:
    from types import SimpleNamespace

    from baton.api.gateway.service import MAX_CHARS_PER_TOKEN, Gateway

    gw = SimpleNamespace(prompts=_NoTokenizer())
    text = "x" * (GRANT.context_length * MAX_CHARS_PER_TOKEN + 1)
    n = await Gateway._count(gw, text, GRANT, 0)  # type: ignore[arg-type]
    assert n > GRANT.context_length  # the callers answer the context-length error


@pytest.mark.anyio
async def test_an_embeddings_call_over_the_input_token_cap_is_refused_before_any_engine() -> None:
    from types import SimpleNamespace

    from baton.api.gateway.service import Gateway
    from baton.core import errors

    embed = ModelGrant(uuid.uuid4(), "e", 512, "/nonexistent", 0, kind="embed")
    principal = SimpleNamespace(model=lambda name: embed, max_request_tokens=None)
    gw = SimpleNamespace(prompts=PromptCounter(), max_embedding_input_tokens=1000,
                         _count=lambda text, grant, overhead: Gateway._count(gw, text, grant, overhead))
    ok = await Gateway.prepare_embeddings(gw, principal, {"model": "e", "input": ["word " * 50] * 10})  # type: ignore[arg-type]
    assert ok.prompt_tokens <= 1000
    with pytest.raises(errors.ValidationError) as exc:
        await Gateway.prepare_embeddings(gw, principal, {"model": "e", "input": ["word " * 50] * 100})  # type: ignore[arg-type]
    assert exc.value.param == "input" and "1,000 input tokens" in exc.value.message
