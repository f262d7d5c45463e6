"""Flow control on the shipped stack (the session's ``baton up``): two tenants made through the admin
API on the P/D model, one keeping many streams in flight, the other sending one short request at a
time, all with the official ``openai`` client. The heavy tenant is never answered 5xx (any refusal is a
429 with ``Retry-After``); the light tenant is never refused and most of its requests never wait in the
queue; each request's record carries its queue wait and class, its trace a ``flow.queue`` span, and
``/metrics`` the model's learned limit; the engines' own load reports show in the operators' view.

How a full queue orders and refuses is tested on a pinned limit in
``tests/integration/gateway/test_flow_control.py``; the TTFT figures are ``baton bench fairness``'s.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from baton.core import telemetry as t

pytestmark = pytest.mark.e2e

HEAVY_STREAMS = 12
DURATION_S = 12.0
WORDS = ["river", "stone", "lantern", "orbit", "meadow", "copper", "signal", "harbor", "velvet", "quartz"]


def _tenant(admin: httpx.Client, model_id: str, label: str) -> tuple[str, str]:
    name = f"flow-{label}-{uuid.uuid4().hex[:6]}"
    r = admin.post("/tenants", json={"name": name, "display_name": name})
    r.raise_for_status()
    tenant = r.json()["id"]
    admin.put(f"/tenants/{tenant}/models/{model_id}").raise_for_status()
    r = admin.post(f"/tenants/{tenant}/keys", json={"name": "flow"})
    r.raise_for_status()
    return tenant, r.json()["secret"]


def _prompt(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n)) + f" #{seed}"


async def _heavy(client: openai.AsyncOpenAI, model: str, stop: float, ledger: dict[str, Any]) -> None:
    seed = 0
    while time.monotonic() < stop:
        seed += 1
        try:
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": _prompt(200, seed)}], max_tokens=48, stream=True)
            async for _ in stream:
                pass
            ledger["ok"] += 1
        except openai.APIStatusError as exc:
            ledger["status"].append((exc.status_code, exc.response.headers.get("retry-after")))
            await asyncio.sleep(0.2)


async def _light(client: openai.AsyncOpenAI, model: str, stop: float, ledger: dict[str, Any]) -> None:
    seed = 0
    while time.monotonic() < stop:
        seed += 1
        trace_id = secrets.token_hex(16)
        try:
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": _prompt(12, 1000 + seed)}], max_tokens=8,
                stream=True, extra_headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
            async for _ in stream:
                pass
            ledger["ok"] += 1
            ledger["traces"].append(trace_id)
        except openai.APIStatusError as exc:
            ledger["status"].append((exc.status_code, exc.response.headers.get("retry-after")))
        await asyncio.sleep(0.5)


def test_a_heavy_tenant_never_gets_5xx_and_a_light_one_is_never_refused(baton_stack, otlp_receiver):
    _, receiver = otlp_receiver
    with baton_stack.admin() as admin:
        models = admin.get("/models", params={"limit": 200}).json()["data"]
        [model] = [m for m in models if m["name"] == baton_stack.model]
        heavy_id, heavy_key = _tenant(admin, model["id"], "heavy")
        light_id, light_key = _tenant(admin, model["id"], "light")
    heavy: dict[str, Any] = {"ok": 0, "status": []}
    light: dict[str, Any] = {"ok": 0, "status": [], "traces": []}
    async def load() -> None:
        base = f"{baton_stack.gateway_url}/v1"
        stop = time.monotonic() + DURATION_S
        async with (openai.AsyncOpenAI(base_url=base, api_key=heavy_key, max_retries=0, timeout=120) as hc,
                    openai.AsyncOpenAI(base_url=base, api_key=light_key, max_retries=0, timeout=120) as lc):
            await asyncio.gather(*(_heavy(hc, baton_stack.model, stop, heavy) for _ in range(HEAVY_STREAMS)),
                                 _light(lc, baton_stack.model, stop, light))

    started = time.monotonic()
    asyncio.run(load())
    # the engines' own load reports (what the gateway's limit reads) reach the operators' view: the P/D
    # model's prefill and decode engines each wrote one during the load (an engine writes while it steps and
    # once when it goes idle)
    with baton_stack.admin() as admin:
        [m] = [m for m in admin.get("/flow").json()["models"] if m["model"] == baton_stack.model]
    since = time.monotonic() - started
    fresh = {e["role"] for e in m["engines"] if e["age_s"] < since}
    assert {"prefill", "decode"} <= fresh, m["engines"]
    assert heavy["ok"] > 0 and all(code == 429 and after for code, after in heavy["status"]), heavy["status"]
    assert light["status"] == [] and light["ok"] >= 5, light

    # each request's record: its class and its queue wait; the light tenant's never waited
    engine = create_engine(baton_stack.env["BATON_DB__URL"])
    try:
        deadline = time.monotonic() + 30
        while True:
            with engine.connect() as conn:
                rows = conn.execute(text(
                    "SELECT tenant_id::text, http_status, queue_ms, flow_class FROM request_records "
                    "WHERE tenant_id::text IN (:a, :b)"), {"a": heavy_id, "b": light_id}).all()
            light_rows = [r for r in rows if r[0] == light_id]
            if len(light_rows) >= light["ok"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    assert len(light_rows) == light["ok"]
    assert all(r.flow_class == "default" and r.queue_ms is not None for r in rows)
    # a tenant with nothing running goes at once (its wait is the queue's bookkeeping), except while the
    # learned limit shrinks below what the heavy tenant already has in flight: most of its requests never wait
    waits = sorted(r.queue_ms for r in light_rows)
    assert waits[len(waits) // 2] < 50.0, waits

    # the light tenant's traces hold a flow.queue span under the gateway's request span
    trace_id = light["traces"][-1]
    deadline = time.monotonic() + 30
    while not (spans := [s for s in receiver.trace(trace_id) if s["name"] == t.SPAN_FLOW_QUEUE]):
        assert time.monotonic() < deadline, [s["name"] for s in receiver.trace(trace_id)]
        time.sleep(0.5)
    assert spans[0]["attrs"][t.ATTR_FLOW_OUTCOME] == "running" and spans[0]["attrs"][t.ATTR_FLOW_CLASS] == "default"

    # the model has a learned limit (the heavy tenant's completed streams gave it a view)
    metrics = httpx.get(f"{baton_stack.gateway_url}/metrics", timeout=30).text
    limit = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
             if line.startswith("baton_flow_limit{") and f'model="{baton_stack.model}"' in line]
    assert limit and limit[0] >= 1, limit
