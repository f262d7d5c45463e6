"""schemathesis's stateful phase against the session's running stack: sequences of calls over
``/admin/v1`` (the admin token) and ``/console/api`` (an operator's session and a tenant admin's, each
with its CSRF token), chained by the links schemathesis infers from the OpenAPI document (a created
tenant's id goes on to its keys, users and limits; a created model's to a deployment and its plan).

No answer may be a 5xx, every error is a problem document, and the live deployments serve afterwards.
The run makes its own tenants, models, deployments and policies: every id and name that existed before it
(the demo tenant, the served models and their deployments, the admin token, the users signed in) is
swapped for an unknown one in any call that changes something, so a generated ``DELETE ...?force=true``
reaches only what the run made. A deployment the run makes names a model the run made, whose ``source``
is no model folder: the reconciler refuses it before Ray (the operator's guard rail), so the fuzz starts
no engine. Bounded: a few dozen scenarios per surface, about a minute in all (``BATON_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import uuid
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from sqlalchemy import create_engine, text

from baton.api.console.auth import COOKIE_NAME, CSRF_HEADER, create_operator
from baton.core.db import Database
from baton.core.settings import Settings
from tests.shared_stack import BatonStack

pytestmark = pytest.mark.e2e

SCENARIOS = int(os.environ.get("BATON_FUZZ_EXAMPLES", "30"))
STEPS = 10
PASSWORD = "correct horse battery staple"
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _existing(db_url: str) -> set[str]:
    """Every id (of each table keyed by a UUID) and every name of a tenant, model, deployment or policy
    in the stack's database now."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(text(
                "SELECT table_name FROM information_schema.columns WHERE table_schema = 'public' "
                "AND column_name = 'id' AND data_type = 'uuid'")).scalars().all()
            found = {str(v) for t in tables for v in conn.execute(text(f'SELECT id FROM "{t}"')).scalars()}
            for table in ("tenants", "models", "deployments", "slo_policies"):
                found |= {str(v) for v in conn.execute(text(f"SELECT name FROM {table}")).scalars()}
    finally:
        engine.dispose()
    return found


def _scrub(value: Any, protected: set[str]) -> Any:
    """``value`` with every protected id or name in it replaced by one that names nothing."""
    if isinstance(value, str):
        return f"fz-{uuid.uuid4()}" if value in protected else value
    if isinstance(value, dict):
        return {k: _scrub(v, protected) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, protected) for v in value]
    return value


class _Log:
    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.failures: list[str] = []
        self.scenarios: collections.Counter[str] = collections.Counter()


def _console_session(url: str, path: str, body: dict[str, Any]) -> tuple[str, str]:
    """(cookie, CSRF token) of a session started by ``path`` (sign-in or sign-up) with ``body``."""
    r = httpx.post(f"{url}{path}", json=body, timeout=30, headers={"origin": url})
    assert r.status_code in (200, 201), r.text
    return r.cookies[COOKIE_NAME], r.json()["csrf_token"]


def _fuzz(url: str, prefix: str, auth: dict[str, Any], protected: set[str], log: _Log, label: str) -> None:
    schema = (schemathesis.openapi.from_url(f"{url}/openapi.json").include(path_regex=f"^{prefix}")
              .exclude(path="/console/api/logout"))  # it would sign the rest of the scenario out
    base = schema.as_state_machine()

    class Machine(base):  # type: ignore[misc,valid-type]
        def setup(self) -> None:
            log.scenarios[label] += 1

        def before_call(self, case: Any) -> None:
            case.headers = {**(case.headers or {}), **auth.get("headers", {})}
            case.headers.pop("Cookie", None)
            if case.method.upper() in MUTATING:
                case.path_parameters = _scrub(case.path_parameters, protected)
                case.query = _scrub(case.query, protected)
                if isinstance(case.body, (dict, list)):
                    case.body = _scrub(case.body, protected)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"cookies": auth["cookies"]} if "cookies" in auth else {}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            log.calls[(case.method.upper(), case.operation.path, response.status_code)] += 1
            where = f"{label} {case.method} {case.formatted_path}"
            if response.status_code >= 500:
                log.failures.append(f"{where} -> {response.status_code}: {case.body!r:.300} {response.text[:300]}")
            elif response.status_code >= 400:
                ctype = response.headers.get("content-type") or [""]
                ctype = ctype[0] if isinstance(ctype, list) else ctype
                if not ctype.startswith("application/problem+json"):
                    log.failures.append(f"{where} -> {response.status_code} as {ctype}: {response.text[:200]}")
                elif response.json().get("status") != response.status_code:
                    log.failures.append(f"{where} -> {response.status_code}: {response.text[:200]}")

    # Hypothesis may replay the start of an earlier scenario while it generates, and a live stack answers a
    # replay differently (a name is taken now): it stops the run as flaky generation. Then a new run goes on.
    chunk = settings(max_examples=SCENARIOS, stateful_step_count=STEPS, deadline=None, database=None,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    for _ in range(SCENARIOS):
        if log.scenarios[label] >= SCENARIOS:
            break
        with contextlib.suppress(Flaky):
            Machine.run(settings=chunk)


def test_stateful_fuzz_of_admin_and_console_leaves_the_live_models_serving(baton_stack: BatonStack) -> None:
    stack = baton_stack
    url = stack.gateway_url
    db = Database.for_owner(Settings(db={"url": stack.env["BATON_DB__URL"]}))
    operator = f"fuzz-ops-{uuid.uuid4().hex[:6]}@baton.example.com"
    create_operator(db, email=operator, password=PASSWORD, actor="test")
    ops_cookie, ops_csrf = _console_session(url, "/console/api/login", {"email": operator, "password": PASSWORD})
    tenant_cookie, tenant_csrf = _console_session(url, "/console/api/signup", {
        "organisation": "Fuzz", "tenant_name": f"fuzz-{uuid.uuid4().hex[:8]}",
        "email": f"fuzz-{uuid.uuid4().hex[:6]}@baton.example.com", "password": PASSWORD})
    with stack.admin() as admin:
        before = {d["name"]: d for d in admin.get("/deployments").json()["data"]}
    protected = _existing(stack.env["BATON_DB__URL"])
    assert {stack.deployment, stack.model} <= protected

    log = _Log()
    try:
        _fuzz(url, "/admin/v1/", {"headers": {"Authorization": f"Bearer {stack.admin_token}"}}, protected, log,
              "admin")
        _fuzz(url, "/console/api/", {"headers": {CSRF_HEADER: ops_csrf, "origin": url},
                                     "cookies": {COOKIE_NAME: ops_cookie}}, protected, log, "operator")
        _fuzz(url, "/console/api/", {"headers": {CSRF_HEADER: tenant_csrf, "origin": url},
                                     "cookies": {COOKIE_NAME: tenant_cookie}}, protected, log, "tenant")
    finally:
        import redis

        client = redis.Redis.from_url(stack.env["BATON_REDIS__URL"])
        for key in client.scan_iter("baton:console:login:*"):  # generated sign-ins must not throttle later tests
            client.delete(key)
        client.close()
        db.dispose()
        _remove_what_the_run_made(stack, protected)

    assert log.failures == [], "\n".join(log.failures[:20])
    # the scenarios went past the door: things were made and changed (a fuzz refused at the door proves nothing)
    made = sum(n for (method, _, status), n in log.calls.items() if method in MUTATING and status < 300)
    reached = {path for (_, path, status) in log.calls if status < 300}
    assert made >= 20 and len(reached) >= 25, sorted(log.calls.items())

    # what served before serves still: the same deployments running, the demo tenant's key answered
    with stack.admin() as admin:
        after = {d["name"]: d for d in admin.get("/deployments").json()["data"] if d["name"] in before}
    assert {n: d["observed_state"] for n, d in after.items()} == {n: d["observed_state"] for n, d in before.items()}
    headers = {"authorization": f"Bearer {stack.api_key}"}
    chat = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=120, json={
        "model": stack.model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200, chat.text
    embed = httpx.post(f"{url}/v1/embeddings", headers=headers, timeout=120,
                       json={"model": stack.embed_model, "input": "hi"})
    assert embed.status_code == 200, embed.text


def _remove_what_the_run_made(stack: BatonStack, protected: set[str]) -> None:
    """Deletes the deployments the run made (the reconciler need not keep refusing them) and suspends
    nothing else: the tenants and models it made stay as records, as any operator's would."""
    with stack.admin() as admin:
        for dep in admin.get("/deployments", params={"limit": 500}).json()["data"]:
            if dep["id"] not in protected:
                admin.delete(f"/deployments/{dep['id']}", params={"force": "true"})
