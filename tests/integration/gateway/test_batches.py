"""The Batch API through the gateway process (uvicorn, real Postgres and Redis, the stub upstream), driven by
the official ``openai`` client: files, batches, the runner's results, errors, cancel and isolation; and the
exactly-once rules of the lines on Postgres itself (a lease taken over fences its first holder off)."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import openai
import orjson
import pytest

from baton.control import batches as use
from baton.core import models as m
from baton.core.db import Database
from tests.integration.gateway.conftest import Catalogue, MakeTenant, openai_client, usage_rows, wait_for


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


def _chat(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"say {custom_id}"}], "max_tokens": 3,
                     **body}}


def _ended(client: openai.OpenAI, batch_id: str, timeout: float = 30.0) -> Any:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in use.ENDED and b, timeout=timeout,
                    interval=0.2)


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(x) for x in client.files.content(file_id).read().splitlines() if x.strip()]


def test_the_openai_client_runs_a_batch_and_reads_its_output(gateway_url: str, catalogue: Catalogue,
                                                             make_tenant: MakeTenant, db: Database) -> None:
    key = make_tenant([catalogue.small])
    client = openai_client(gateway_url, key)
    lines = [_chat(f"req-{i}", catalogue.small) for i in range(4)]
    lines.append(_chat("refused", catalogue.small, stub_status=400))  # the engine refuses this one
    lines.append(_chat("bad-body", catalogue.small, max_tokens=-3))  # the gateway refuses this one
    lines[0]["body"]["messages"][0]["content"] = "a NUL \x00 in a prompt"  # JSON can carry it; so must a batch
    uploaded = client.files.create(file=("input.jsonl", _jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(_jsonl(lines))
    assert client.files.content(uploaded.id).read() == _jsonl(lines)

    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "it"})
    assert batch.status == "in_progress" and batch.request_counts.total == 6
    done = _ended(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 2)
    assert done.metadata == {"run": "it"}

    out = _lines(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == [f"req-{i}" for i in range(4)]
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["message"]["content"] == "tok tok tok "
    errs = {x["custom_id"]: x for x in _lines(client, done.error_file_id)}
    assert set(errs) == {"refused", "bad-body"}
    assert errs["refused"]["response"]["status_code"] == 400
    assert errs["bad-body"]["response"]["status_code"] == 400
    assert errs["bad-body"]["response"]["body"]["error"]["param"] == "max_tokens"

    # metered like any request, each usage row naming the batch, one per line that ran
    rows = wait_for(lambda: (r := usage_rows(db, key.tenant_id)) and len(r) >= 4 and r)
    assert sorted(r.batch_id or "" for r in rows) == [batch.id] * 4
    ids = {x["response"]["request_id"] for x in out}
    assert {f"req-{r.request_id.hex}" for r in rows} == ids

    listed = client.batches.list()
    assert [b.id for b in listed.data] == [batch.id]
    assert {f.purpose for f in client.files.list().data} == {"batch", "batch_output"}


def test_bad_files_and_batches_are_refused_with_the_line_at_fault(gateway_url: str, catalogue: Catalogue,
                                                                    make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.small])
    client = openai_client(gateway_url, key)

    def refused(content: bytes, *, endpoint: str = "/v1/chat/completions") -> str:
        try:
            f = client.files.create(file=("in.jsonl", content), purpose="batch")
            client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
        except openai.BadRequestError as exc:
            return str(exc.body["message"])  # type: ignore[index]
        raise AssertionError("accepted")

    good = _chat("a", catalogue.small)
    assert "line 2 is not JSON" in refused(_jsonl([good]) + b"{not json\n")
    assert "line 2 repeats the custom_id `a`" in refused(_jsonl([good, good]))
    assert "does not exist or this key may not use" in refused(_jsonl([_chat("a", catalogue.other)]))
    assert "a batch runs one model" in refused(_jsonl([good, _chat("b", catalogue.big)]))
    assert "asks for a stream" in refused(_jsonl([_chat("a", catalogue.small, stream=True)]))
    assert "this batch's endpoint is /v1/chat/completions" in refused(
        _jsonl([{**good, "url": "/v1/completions"}]))
    assert "Batches serve" in refused(_jsonl([good]), endpoint="/v1/images")
    assert "holds no request" in refused(b"\n\n")
    with pytest.raises(openai.BadRequestError, match="purpose `batch`"):
        client.files.create(file=("in.jsonl", _jsonl([good])), purpose="assistants")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")


def test_another_tenant_cannot_see_or_touch_a_batch_or_its_files(gateway_url: str, catalogue: Catalogue,
                                                                 make_tenant: MakeTenant) -> None:
    owner, other = make_tenant([catalogue.small]), make_tenant([catalogue.small])
    mine, theirs = openai_client(gateway_url, owner), openai_client(gateway_url, other)
    f = mine.files.create(file=("in.jsonl", _jsonl([_chat("a", catalogue.small)])), purpose="batch")
    batch = mine.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: theirs.files.retrieve(f.id), lambda: theirs.files.content(f.id).read(),
                 lambda: theirs.files.delete(f.id), lambda: theirs.batches.retrieve(batch.id),
                 lambda: theirs.batches.cancel(batch.id),
                 lambda: theirs.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert theirs.batches.list().data == [] and theirs.files.list().data == []
    assert _ended(mine, batch.id).status == "completed"


def test_cancel_stops_dispatch_and_keeps_every_line_in_the_error_file(gateway_url: str, catalogue: Catalogue,
                                                                      make_tenant: MakeTenant) -> None:
    key = make_tenant([catalogue.small])
    client = openai_client(gateway_url, key)
    # the pool answers 503 to every line: each goes back to wait and is tried again, the batch runs on
    lines = [_chat(f"c{i}", catalogue.small, stub_status=503) for i in range(3)]
    f = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    time.sleep(1.5)
    assert client.batches.retrieve(batch.id).status == "in_progress"
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = _ended(client, batch.id, timeout=60)
    assert done.status == "cancelled" and done.output_file_id is None
    errs = _lines(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in errs) == ["c0", "c1", "c2"]
    assert {x["error"]["code"] for x in errs} == {"batch_cancelled"}
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: nothing to do

    f = client.files.create(file=("in.jsonl", _jsonl([_chat("ok", catalogue.small)])), purpose="batch")
    finished = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert _ended(client, finished.id).status == "completed"
    with pytest.raises(openai.ConflictError, match="status 'completed'"):
        client.batches.cancel(finished.id)


# -- exactly once, on Postgres ---------------------------------------------------------------------------


def _batch_of(db: Database, tenant_id: uuid.UUID, model: str, n: int) -> str:
    now = dt.datetime.now(dt.UTC)
    batch_id = use.new_id("batch_")
    with db.tenant(tenant_id) as uow:
        uow.batches.add(m.Batch(id=batch_id, tenant_id=tenant_id, endpoint="chat/completions", model=model,
                                input_file_id="file-x", completion_window="24h", status="in_progress", total=n,
                                created_at=now, in_progress_at=now, expires_at=now + dt.timedelta(hours=1)))
        uow.batches.add_lines([{"batch_id": batch_id, "line": i + 1, "tenant_id": tenant_id, "custom_id": f"l{i}",
                                "body": orjson.dumps({"model": model}), "request_id": uuid.uuid4()}
                               for i in range(n)])
        uow.commit()
    return batch_id


def test_a_line_taken_over_after_its_lease_is_written_once(db: Database, make_tenant: MakeTenant,
                                                            catalogue: Catalogue) -> None:
    key = make_tenant([catalogue.small])
    model = f"exactly-once-{uuid.uuid4().hex[:6]}"  # a model no gateway's runner serves
    batch_id = _batch_of(db, key.tenant_id, model, 2)
    first = use.claim(db, models=[model], limit=1, lease_s=0.2)
    assert [(c.line, c.attempt) for c in first] == [(1, 1)]
    assert [c.line for c in use.claim(db, models=[model], limit=1, lease_s=60)] == [2]  # line 1 is held
    time.sleep(0.3)  # the first holder "died": its lease runs out
    second = use.claim(db, models=[model], limit=5, lease_s=60)
    assert [(c.line, c.attempt) for c in second] == [(1, 2)]
    def usage(c: use.Claimed, tokens: int) -> dict[str, Any]:
        return {"request_id": c.request_id, "tenant_id": key.tenant_id, "api_key_id": None, "model": model,
                "prompt_tokens": tokens, "completion_tokens": 1, "cached_tokens": 0, "batch_id": batch_id}

    # the result and its usage row in one transaction: the holder's both, the fenced-off attempt's neither
    assert use.finish(db, second[0], ok=True, response={"status_code": 200, "body": {"n": 2}},
                      usage=usage(second[0], 2))
    assert not use.finish(db, first[0], ok=True, response={"status_code": 200, "body": {"n": 1}},
                          usage=usage(first[0], 1))
    assert [(r.request_id, r.prompt_tokens, r.batch_id) for r in usage_rows(db, key.tenant_id)] == [
        (first[0].request_id, 2, batch_id)]
    assert not use.renew(db, [first[0].held], lease_s=60)
    held = [(batch_id, 2, 1)]
    assert use.renew(db, held, lease_s=60) == 1
    assert use.put_back(db, use.Claimed(batch_id, 2, 1, key.tenant_id, None, "chat/completions", "l1", b"{}",
                                        uuid.uuid4()), after_s=0)
    (again,) = use.claim(db, models=[model], limit=5, lease_s=60)
    # an answer may hold a NUL character (a tiny model generated one): kept and written out as it came
    assert use.finish(db, again, ok=True, response={"status_code": 200, "body": orjson.Fragment(
        b'{"text":"a\\u0000b"}')})
    use.finalize_ready(db, part_bytes=4096, retention=dt.timedelta(days=1), limit=100)
    with db.tenant(key.tenant_id) as uow:
        b = uow.batches.require(batch_id)
        assert b.status == "completed" and b.output_file_id and b.error_file_id is None
        out = b"".join(data for _, data in uow.files.parts(b.output_file_id))
    first, second = [orjson.loads(x) for x in out.splitlines()]
    assert first["custom_id"] == "l0" and first["response"]["body"] == {"n": 2}
    assert second["custom_id"] == "l1" and second["response"]["body"] == {"text": "a\x00b"}


def test_the_sweep_ends_a_batch_past_its_window_and_deletes_expired_files(db: Database, make_tenant: MakeTenant,
                                                                          catalogue: Catalogue) -> None:
    from baton.control import jobs

    key = make_tenant([catalogue.small])
    model = f"expired-{uuid.uuid4().hex[:6]}"  # no gateway routes it: its lines wait until the window passes
    batch_id = _batch_of(db, key.tenant_id, model, 3)
    (running,) = use.claim(db, models=[model], limit=1, lease_s=60)  # one line was running when it expired
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    with db.tenant(key.tenant_id) as uow:
        uow.batches.require(batch_id).expires_at = past
        uow.files.add(m.StoredFile(id=use.new_id("file-"), tenant_id=key.tenant_id, purpose="batch_output",
                                   filename="old.jsonl", expires_at=past))
        uow.commit()
    swept = jobs.sweep_batches(db, part_bytes=4096, retention_days=1)
    assert batch_id in swept["ended"] and swept["files_deleted"] >= 1
    assert not use.finish(db, running, ok=True, response={"status_code": 200, "body": {}})  # too late: dropped
    with db.tenant(key.tenant_id) as uow:
        b = uow.batches.require(batch_id)
        assert b.status == "expired" and b.expired_at is not None and b.output_file_id is None
        errs = [orjson.loads(x) for x in b"".join(d for _, d in uow.files.parts(b.error_file_id or "")).splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errs] == [(f"l{i}", "batch_expired") for i in range(3)]
