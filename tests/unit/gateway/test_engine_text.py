"""An engine's error message reaches the client without another layer's internals."""

from __future__ import annotations

import orjson
import pytest

from baton.api.gateway.attempts import upstream_error
from baton.api.gateway.engine_text import FALLBACK, client_text

RAY_WRAPPED = (
    "Message: \"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set "
    "(Request ID: 5c1f0a9e-7d2b-4c55-9a0e-1f2e3d4c5b6a), Internal exception: "
    "ray.llm._internal.serve.core.configs.openai_api_models.OpenAIHTTPException "
    "(Request ID: 5c1f0a9e-7d2b-4c55-9a0e-1f2e3d4c5b6a), original exception: "
    "OpenAIHTTPException(status_code=400, message='\"auto\" tool choice requires ...', type='BadRequestError')"
)

PYDANTIC_DUMP = (
    "1 validation error for ChatCompletionRequest\nmessages.0.content\n  Input should be a valid string "
    "[type=string_type, input_value=5, input_type=int]\n    For further information visit "
    "https://errors.pydantic.dev/2.11/v/string_type"
)

TRACEBACK = ('ValueError: prompt is empty\nTraceback (most recent call last):\n  File "/venv/lib/vllm/engine.py", '
             "line 12, in add_request\n    raise ValueError")


@pytest.mark.parametrize("raw, keeps, drops", [
    (RAY_WRAPPED, "tool choice requires", ["Request ID", "ray.llm", "OpenAIHTTPException", "Internal exception",
                                           "original exception", "5c1f0a9e"]),
    (PYDANTIC_DUMP, "Input should be a valid string", ["ChatCompletionRequest", "[type=", "pydantic.dev"]),
    (TRACEBACK, "prompt is empty", ["Traceback", "File \"", "ValueError", "vllm/engine.py"]),
    ("This model's maximum context length is 2048 tokens. However, you requested 4000 tokens.",
     "maximum context length is 2048 tokens", []),
])
def test_the_readable_sentence_stays_and_the_internals_go(raw: str, keeps: str, drops: list[str]) -> None:
    text = client_text(raw)
    assert keeps in text
    for word in drops:
        assert word not in text


def test_nothing_readable_left_gives_a_plain_sentence() -> None:
    assert client_text("Internal exception: vllm.engine.EngineDeadError") == FALLBACK
    assert client_text("(Request ID: abc)") == FALLBACK
    assert len(client_text("x " * 2000)) <= 500


def test_an_engine_400_reaches_the_client_without_internal_text() -> None:
    body = orjson.dumps({"object": "error", "message": RAY_WRAPPED, "type": "BadRequestError", "param": None,
                         "code": 400})
    err = upstream_error(400, body)
    assert err.status == 400 and "tool choice requires" in err.message
    assert "ray." not in err.message and "Request ID" not in err.message


@pytest.mark.parametrize("status", [500, 502])
def test_an_engine_5xx_is_a_plain_upstream_error(status: int) -> None:
    err = upstream_error(status, orjson.dumps({"message": "CUDA out of memory in vllm.worker.Worker"}))
    assert err.status == 502 and "vllm" not in err.message and "CUDA" not in err.message


def test_an_engines_mid_stream_error_event_reaches_the_client_cleaned():
    import orjson

    from baton.api.gateway.relay import clean_error_events

    chunk = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
             b'data: {"error": {"object": "error", "message": "Message: bad grammar state (Request ID: abc-123), '
             b'Internal exception: ray.llm._internal.serve.core.X", "type": "BadRequestError", "code": 400}}\n\n'
             b'data: {"error": {"message": "Traceback (most recent call last): File \\"/x/vllm/a.py\\", line 3",'
             b' "type": "InternalServerError", "code": 500}}\n\n')
    events = [e for e in clean_error_events(chunk).split(b"\n\n") if e]
    assert events[0] == b'data: {"choices":[{"delta":{"content":"a"}}]}'
    first, second = (orjson.loads(e[6:])["error"] for e in events[1:])
    assert first == {"message": "bad grammar state", "type": "invalid_request_error", "param": None, "code": None}
    assert second["message"] == "The model failed to answer. Try again." and second["type"] == "server_error"
    assert b"ray." not in clean_error_events(chunk) and b"Request ID" not in clean_error_events(chunk)
