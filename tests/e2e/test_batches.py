"""The Batch API on the shipped stack (the session's ``baton up``), as a tenant meets it with the official
``openai`` client: a chat batch on the P/D model and an embeddings batch, uploaded, created, polled to
``completed``; every answer equals the same request sent interactively (greedy), each line's record ran in
the ``batch`` class, and an interactive request sent while the batch runs is served.

Many lines, slack capacity, the interactive tenant's TTFT beside a batch and gateways killed mid-batch are
``baton bench batch``'s (docs/batch.md); the rules of the lines' claims are tested on Postgres in
``tests/integration/gateway/test_batches.py``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import openai
import orjson
import pytest
from sqlalchemy import create_engine, text

from baton.core import telemetry as t

pytestmark = pytest.mark.e2e

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor"]


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


def _run(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str) -> Any:
    f = client.files.create(file=("input.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    deadline = time.monotonic() + 240
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    return batch


def _output(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    rows = [orjson.loads(x) for x in client.files.content(file_id).read().splitlines() if x.strip()]
    return {r["custom_id"]: r for r in rows}


def test_a_tenant_runs_chat_and_embedding_batches_with_the_official_client(baton_stack: Any,
                                                                         otlp_receiver: Any) -> None:
    _, receiver = otlp_receiver
    client = openai.OpenAI(base_url=f"{baton_stack.gateway_url}/v1", api_key=baton_stack.api_key, max_retries=0,
                           timeout=120)
    model = baton_stack.model
    bodies = {f"q{i}": {"model": model, "max_tokens": 12, "temperature": 0,
                        "messages": [{"role": "user", "content": f"List {w} things, {i}."}]}
              for i, w in enumerate(WORDS[:5])}
    lines = [{"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
             for cid, body in bodies.items()]
    lines.append({"custom_id": "too-long", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": model, "max_tokens": 10**7, "messages": [{"role": "user", "content": "hi"}]}})
    f = client.files.create(file=("input.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    # an interactive request while the batch runs is served as usual
    alone = client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert alone.choices[0].message.content is not None
    deadline = time.monotonic() + 240
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 5, 1)
    out = _output(client, batch.output_file_id)
    assert set(out) == set(bodies)
    for cid, body in bodies.items():  # the batch's answer is the interactive one (greedy)
        direct = client.chat.completions.create(**body)
        got = out[cid]["response"]
        assert got["status_code"] == 200
        assert got["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        assert got["body"]["usage"]["completion_tokens"] == direct.usage.completion_tokens  # type: ignore[union-attr]
    errs = _output(client, batch.error_file_id)
    assert errs["too-long"]["response"]["status_code"] == 400
    assert errs["too-long"]["response"]["body"]["error"]["code"] == "context_length_exceeded"

    # each line that ran is one request record in the batch class and one usage row naming the batch
    ids = [str(uuid.UUID(r["response"]["request_id"].removeprefix("req-"))) for r in out.values()]
    engine = create_engine(baton_stack.env["BATON_DB__URL"])
    try:
        deadline = time.monotonic() + 30  # records and usage are written by the gateway's meter, in batches
        while True:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT flow_class, status, trace_id FROM request_records "
                                         "WHERE id::text = ANY(:ids)"), {"ids": ids}).all()
                classes = [(r[0], r[1]) for r in rows]
                usage = conn.execute(text("SELECT count(*) FROM usage_records WHERE batch_id = :b"),
                                     {"b": batch.id}).scalar()
            if (len(classes), usage) == (5, 5) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    assert sorted((c, str(s)) for c, s in classes) == [("batch", "completed")] * 5
    assert usage == 5
    # traced like any request, the gateway's span naming the batch and its queue span the batch class
    trace_id = rows[0][2]
    deadline = time.monotonic() + 30
    while not (spans := {s["name"]: s for s in receiver.trace(trace_id)}).get(t.SPAN_FLOW_QUEUE):
        assert time.monotonic() < deadline, list(spans)
        time.sleep(0.5)
    assert spans[t.SPAN_FLOW_QUEUE]["attrs"][t.ATTR_FLOW_CLASS] == "batch"
    assert any(s["attrs"].get(t.ATTR_BATCH) == batch.id for s in spans.values())

    embed = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": baton_stack.embed_model, "input": f"{w} stone"}} for i, w in enumerate(WORDS)]
    done = _run(client, embed, "/v1/embeddings")
    assert done.status == "completed" and done.request_counts.completed == len(WORDS)
    vectors = _output(client, done.output_file_id)
    direct = client.embeddings.create(model=baton_stack.embed_model, input="amber stone").data[0].embedding
    got = vectors["e0"]["response"]["body"]["data"][0]["embedding"]
    assert max(abs(a - b) for a, b in zip(got, direct, strict=True)) < 1e-4
