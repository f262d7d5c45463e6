"""The console's Batches pages on real Postgres through the real router: a tenant lists its own batches
(newest first, never another tenant's), downloads their files' bytes and cancels one (an admin; a member
is refused); the operators see every tenant's batches per model, counted by status and by line state.
Batches are made with the use cases the Batch API calls (:mod:`baton.control.batches`)."""

from __future__ import annotations

import datetime as dt
import io
import uuid
from typing import Any

import orjson

from baton.control import batches
from baton.core.db import Database

from .conftest import Session, SignUp, add_member

API = "/console/api"
URL = "/v1/chat/completions"


def _jsonl(model: str, n: int) -> bytes:
    return b"".join(orjson.dumps({"custom_id": f"req-{i}", "method": "POST", "url": URL,
                                  "body": {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]}})
                     + b"\n" for i in range(n))


def _batch(db: Database, tenant_id: uuid.UUID | None, model: str, n: int = 2, *, part_bytes: int = 1 << 20,
           filename: str = "requests.jsonl") -> dict[str, Any]:
    assert tenant_id is not None
    stored = batches.store_file(db, tenant_id=tenant_id, key_id=None, purpose="batch", filename=filename,
                                source=io.BytesIO(_jsonl(model, n)), part_bytes=part_bytes, max_bytes=1 << 20,
                                max_lines=100)
    return batches.create_batch(db, tenant_id=tenant_id, key_id=None, allowed=[model], max_lines=100,
                                req=batches.NewBatch(stored["id"], URL, "24h", None))


def _model() -> str:
    return f"batch-model-{uuid.uuid4().hex[:8]}"


def test_a_tenant_lists_its_batches_newest_first_and_never_another_tenants(sign_up: SignUp, db: Database) -> None:
    a, b = sign_up(), sign_up()
    model = _model()
    first, second = _batch(db, a.tenant_id, model, 3), _batch(db, a.tenant_id, model, 1)
    theirs = _batch(db, b.tenant_id, model)

    r = a.get(f"{API}/tenant/batches")
    assert r.status_code == 200, r.text
    listed = r.json()
    assert [x["id"] for x in listed["data"]] == [second["id"], first["id"]] and not listed["has_more"]
    row = listed["data"][1]
    assert (row["endpoint"], row["model"], row["status"]) == (URL, model, "in_progress")
    assert row["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert isinstance(row["created_at"], int) and row["input_file_id"] == first["input_file_id"]
    # a page at a time, by the last id of the page before
    page = a.get(f"{API}/tenant/batches", params={"limit": 1}).json()
    assert [x["id"] for x in page["data"]] == [second["id"]] and page["has_more"]
    page = a.get(f"{API}/tenant/batches", params={"limit": 1, "after": page["last_id"]}).json()
    assert [x["id"] for x in page["data"]] == [first["id"]] and not page["has_more"]
    # the other tenant sees its own only, and neither can reach the other's batch or file
    assert [x["id"] for x in b.get(f"{API}/tenant/batches").json()["data"]] == [theirs["id"]]
    assert a.post(f"{API}/tenant/batches/{theirs['id']}/cancel").status_code == 404
    assert a.get(f"{API}/tenant/files/{theirs['input_file_id']}/content").status_code == 404
    assert batches.get_batch(db, b.tenant_id, theirs["id"])["status"] == "in_progress"  # type: ignore[arg-type]


def test_a_file_downloads_as_its_bytes(sign_up: SignUp, db: Database) -> None:
    s = sign_up()
    model = _model()
    made = _batch(db, s.tenant_id, model, 5, part_bytes=64, filename="my requests.jsonl")  # several parts
    r = s.get(f"{API}/tenant/files/{made['input_file_id']}/content")
    assert r.status_code == 200, r.text
    assert r.content == _jsonl(model, 5)
    assert r.headers["content-type"].startswith("application/jsonl")
    assert r.headers["content-disposition"] == "attachment; filename*=utf-8''my%20requests.jsonl"
    assert r.headers["cache-control"] == "no-store"
    # the output and error files of a batch that ended: its lines' answers
    claimed = batches.claim(db, models=[model], limit=5, lease_s=60)
    assert len(claimed) == 5
    for i, line in enumerate(claimed):
        assert batches.finish(db, line, ok=i > 0, response={"status_code": 200 if i else 400,
                                                            "request_id": str(line.request_id), "body": {"i": i}})
    while batches.finalize_ready(db, part_bytes=64, retention=dt.timedelta(days=1)):
        pass
    ended = s.get(f"{API}/tenant/batches").json()["data"][0]
    assert ended["status"] == "completed" and ended["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    out = s.get(f"{API}/tenant/files/{ended['output_file_id']}/content")
    assert out.status_code == 200 and out.headers["content-disposition"] == (
        f'attachment; filename="{made["id"]}_output.jsonl"')
    assert [orjson.loads(x)["custom_id"] for x in out.content.splitlines()] == [f"req-{i}" for i in range(1, 5)]
    errs = s.get(f"{API}/tenant/files/{ended['error_file_id']}/content")
    assert [orjson.loads(x)["response"]["body"] for x in errs.content.splitlines()] == [{"i": 0}]
    # unknown, malformed
    assert s.get(f"{API}/tenant/files/file-{'0' * 24}/content").status_code == 404
    assert s.get(f"{API}/tenant/files/no.such.file/content").status_code == 400


def test_an_admin_cancels_a_batch_and_a_member_may_not(console_app, operator: Session, sign_up: SignUp,  # type: ignore[no-untyped-def]
                                                       db: Database) -> None:
    admin = sign_up()
    assert admin.tenant_id is not None
    made = _batch(db, admin.tenant_id, _model(), 3)
    cancel = f"{API}/tenant/batches/{made['id']}/cancel"
    member = add_member(console_app, operator, admin.tenant_id)
    try:
        assert [x["id"] for x in member.get(f"{API}/tenant/batches").json()["data"]] == [made["id"]]  # members read
        assert member.get(f"{API}/tenant/files/{made['input_file_id']}/content").status_code == 200
        refused = member.post(cancel)
        assert refused.status_code == 403 and "admins" in refused.json()["detail"], refused.text
    finally:
        member.client.close()
    assert admin.client.post(cancel).status_code == 403  # no CSRF token
    assert batches.get_batch(db, admin.tenant_id, made["id"])["status"] == "in_progress"

    r = admin.post(cancel)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelling" and r.json()["cancelling_at"] is not None
    assert admin.post(cancel).json()["status"] in ("cancelling", "cancelled")  # again: nothing changes
    with db.tenant(admin.tenant_id) as uow:
        assert uow.batches.counts([made["id"]])[made["id"]] == {"cancelled": 3}
    log = operator.get(f"{API}/ops/audit", params={"target_type": "batch", "target_id": made["id"]}).json()
    assert [(a["action"], a["actor"], a["target_name"], a["before"]["status"], a["after"]["status"])
            for a in log["data"]] == [("batch.cancel", f"console:{admin.email}", made["id"], "in_progress",
                                       "cancelling")]
    # once it has ended, a cancel is a conflict; an unknown or malformed id is not found or invalid
    while batches.finalize_ready(db, part_bytes=1024, retention=dt.timedelta(days=1)):
        pass
    assert admin.get(f"{API}/tenant/batches").json()["data"][0]["status"] == "cancelled"
    assert admin.post(cancel).status_code == 200  # cancelled already: answered as it is
    done = _batch(db, admin.tenant_id, _model(), 1)
    with db.tenant(admin.tenant_id) as uow:
        row = uow.batches.get(done["id"])
        assert row is not None
        row.status = "completed"
        uow.commit()
    assert admin.post(f"{API}/tenant/batches/{done['id']}/cancel").status_code == 409
    assert admin.post(f"{API}/tenant/batches/batch_{'0' * 24}/cancel").status_code == 404
    assert admin.post(f"{API}/tenant/batches/{'x' * 65}/cancel").status_code == 400


def test_the_operators_see_every_tenants_batches_per_model(operator: Session, sign_up: SignUp,
                                                           db: Database) -> None:
    a, b = sign_up(), sign_up()
    model, other = _model(), _model()
    older = _batch(db, a.tenant_id, model, 3)
    newer = _batch(db, b.tenant_id, model, 2)
    elsewhere = _batch(db, a.tenant_id, other, 4)
    claimed = batches.claim(db, models=[model], limit=3, lease_s=60)  # the older batch's lines first
    assert {c.batch_id for c in claimed} == {older["id"]}
    assert batches.finish(db, claimed[0], ok=True, response={"status_code": 200, "body": {}})
    assert batches.finish(db, claimed[1], ok=False, response={"status_code": 400, "body": {}})

    r = operator.get(f"{API}/ops/batches", params={"hours": 1})
    assert r.status_code == 200, r.text
    view = r.json()
    per = {x["model"]: x for x in view["models"]}
    mine = per[model]
    assert mine["batches"] == {"in_progress": 2}
    assert mine["lines"] == {"pending": 2, "running": 1, "done": 1, "failed": 1}
    assert [(o["id"], o["tenant_id"]) for o in mine["open"]] == [(older["id"], str(a.tenant_id)),
                                                                (newer["id"], str(b.tenant_id))]
    first = mine["open"][0]
    assert first["request_counts"] == {"total": 3, "completed": 1, "failed": 1}
    assert first["tenant_name"] and first["tenant_display_name"].startswith("Org ")
    assert isinstance(first["created_at"], int) and first["expires_at"] > first["created_at"]
    assert per[other]["batches"] == {"in_progress": 1} and per[other]["lines"] == {"pending": 4}
    assert [o["id"] for o in per[other]["open"]] == [elsewhere["id"]]
    assert view["more"] is False
    # a tenant's session may not open it
    assert a.get(f"{API}/ops/batches").status_code == 403


def test_the_operators_view_keeps_ended_batches_for_its_window_only(operator: Session, sign_up: SignUp,
                                                                    db: Database) -> None:
    s = sign_up()
    assert s.tenant_id is not None
    model = _model()
    made = _batch(db, s.tenant_id, model, 2)
    with db.tenant(s.tenant_id) as uow:
        row = uow.batches.get(made["id"])
        assert row is not None
        row.status, row.created_at = "completed", dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)
        uow.commit()
    assert model not in {x["model"] for x in operator.get(f"{API}/ops/batches", params={"hours": 1}).json()["models"]}
    shown = {x["model"]: x for x in operator.get(f"{API}/ops/batches", params={"hours": 4}).json()["models"]}
    assert shown[model]["batches"] == {"completed": 1} and shown[model]["open"] == []
