"""The relay: trace context, token counting, usage stripping, cut streams and client disconnects."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import orjson

from baton.api.gateway.attempts import trace_context, upstream_error
from baton.api.gateway.metering import Outcome
from baton.api.gateway.relay import SSERelay, _count_tokens, _split_usage
from baton.core import errors
from baton.core import models as m


def test_trace_context_keeps_a_valid_parent_and_starts_one_otherwise() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace_context(tp) == (tp, "0af7651916cd43dd8448eb211c80319c")
    for bad in (None, "", "garbage", "00-" + "0" * 32 + "-b7ad6b7169203331-01", "ff-" + tp[3:]):
        header, trace_id = trace_context(bad)
        assert header.split("-")[1] == trace_id and len(trace_id) == 32 and trace_id != "0" * 32


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


USAGE = _event({"id": "x", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2,
                                                   "prompt_tokens_details": {"cached_tokens": 1}}})
TOKEN = _event({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]})
ROLE = _event({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})


def _outcome() -> Outcome:
    return Outcome(request_id=uuid.uuid4(), tenant_id=uuid.uuid4(), api_key_id=None, model="m",
                   endpoint="chat/completions", stream=True, started=time.time(), prompt_tokens=9,
                   start_pc=time.perf_counter())


def test_tokens_are_counted_from_deltas_and_usage_is_read_and_stripped() -> None:
    assert _count_tokens(ROLE + TOKEN + TOKEN) == 2
    o = _outcome()
    out = _split_usage(TOKEN + USAGE + b"data: [DONE]\n\n", o, strip=True)
    assert b"usage" not in out and out.startswith(TOKEN) and b"[DONE]" in out
    assert (o.prompt_tokens, o.completion_tokens, o.cached_tokens) == (4, 2, 1)
    assert b"usage" in _split_usage(USAGE, _outcome(), strip=False)


def test_engine_errors_keep_their_message_only_when_they_are_the_clients() -> None:
    bad = upstream_error(400, orjson.dumps({"error": {"message": "max_tokens too big", "code": 400}}))
    assert isinstance(bad, errors.ValidationError) and bad.message == "max_tokens too big"
    crash = upstream_error(500, b"Traceback: ...")
    assert isinstance(crash, errors.UpstreamError) and crash.status == 502
    assert upstream_error(429, b"").status == 429


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes], *, fail: bool = False, stall: bool = False) -> None:
        self.chunks, self.fail, self.stall = chunks, fail, stall

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for c in self.chunks:
            yield c
        if self.stall:  # a slow engine: nothing more for a long time
            await asyncio.Event().wait()
        if self.fail:
            raise httpx.ReadError("connection reset")


async def _run_relay(stream: _Chunks, *, disconnect_after_sends: int | None = None,
                     strip: bool = True) -> tuple[list[dict[str, Any]], Outcome]:
    response = httpx.Response(200, stream=stream)
    done: list[Outcome] = []
    relay = SSERelay(response, _outcome(), strip_usage=strip, headers=[], done=done.append)
    sent: list[dict[str, Any]] = []
    enough = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await enough.wait()  # never, unless the test makes the client go away
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if disconnect_after_sends is not None and len(sent) >= disconnect_after_sends:
            enough.set()

    await relay({"type": "http"}, receive, send)
    await asyncio.sleep(0)
    assert len(done) == 1
    return sent, done[0]


def test_a_complete_stream_is_relayed_whole_and_metered() -> None:
    # Events split across reads arrive whole; the usage event is removed for a client that did not ask.
    raw = ROLE + TOKEN + TOKEN + USAGE + b"data: [DONE]\n\n"
    sent, outcome = asyncio.run(_run_relay(_Chunks([raw[:7], raw[7:50], raw[50:]])))
    body = b"".join(msg.get("body", b"") for msg in sent)
    assert body == ROLE + TOKEN + TOKEN + b"data: [DONE]\n\n"
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert outcome.status is m.RequestStatus.COMPLETED and outcome.metered
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (4, 2)


def test_a_cut_stream_ends_with_an_error_event() -> None:
    sent, outcome = asyncio.run(_run_relay(_Chunks([ROLE, TOKEN], fail=True)))
    body = b"".join(msg.get("body", b"") for msg in sent)
    assert body.startswith(ROLE + TOKEN) and b"event: error" in body and body.endswith(b"data: [DONE]\n\n")
    assert outcome.status is m.RequestStatus.FAILED and outcome.completion_tokens == 1


def test_a_client_that_goes_away_is_noticed_while_the_engine_is_slow() -> None:
    # start + 3 events sent, then the engine stalls and the client leaves.
    _, outcome = asyncio.run(_run_relay(_Chunks([ROLE, TOKEN, TOKEN], stall=True), disconnect_after_sends=4))
    assert outcome.status is m.RequestStatus.CANCELLED and outcome.metered
    assert outcome.completion_tokens == 2 and outcome.prompt_tokens == 9  # counted: no usage report came


def test_an_app_that_is_not_serving_reads_as_starting_not_as_a_bad_request() -> None:
    """Serve's ingress answers 404 for an app it does not have yet and 503 without a ready replica."""
    for status, body in ((404, b"Not Found"), (503, b"<html>No server is available</html>")):
        err = upstream_error(status, body)
        assert isinstance(err, errors.UnavailableError) and err.status == 503
        assert "starting" in err.message and "Not Found" not in err.message
        assert err.extra["headers"]["retry-after"] == "5"
