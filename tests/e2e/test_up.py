"""The README's run command on this machine: the session's shared stack is one ``baton up`` (its own
database, state folder, Ray head and ports: :mod:`tests.shared_stack`). It serves the tiny model in P/D
mode behind the gateway, chat completions and streams go through, and Serve runs the decode and the
prefill pool as apps of their own. Last in the session: a SIGKILLed replica's engine ends with it,
``baton down`` leaves nothing of the stack, ``baton up`` after it waits for the app again (the database
still says "running" from before) and answers with tracing on and no collector listening (it costs the
spans, never a request), and ``baton down`` stops it all again."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx
import psutil
import pytest

from baton.control.ray_client import read_token
from tests.shared_stack import BatonStack, free_port

pytestmark = pytest.mark.e2e


def _decode_replica(stack: BatonStack) -> psutil.Process:
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (p.cmdline() or [""])[0].startswith(f"ray::ServeReplica:{stack.deployment}:Decode"):
                return p
    raise AssertionError("no decode replica process")


def _chat(stack: BatonStack) -> httpx.Response:
    return httpx.post(f"{stack.gateway_url}/v1/chat/completions", timeout=120,
                      headers={"authorization": f"Bearer {stack.api_key}"},
                      json={"model": stack.model, "max_tokens": 8, "temperature": 0,
                            "messages": [{"role": "user", "content": "hello"}]})


def test_up_serves_the_tiny_model_in_pd_mode(baton_stack: BatonStack) -> None:
    stack = baton_stack
    assert f"OPENAI_BASE_URL={stack.gateway_url}/v1" in stack.up_stdout
    resp = _chat(stack)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 8
    assert resp.json()["system_fingerprint"].startswith("fp_")  # Baton's (dataplane.render), not vLLM's version
    with httpx.stream("POST", f"{stack.gateway_url}/v1/completions", timeout=120,
                      headers={"authorization": f"Bearer {stack.api_key}"},
                      json={"model": stack.model, "prompt": "once upon a time", "max_tokens": 8,
                            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}) as sse:
        assert sse.status_code == 200
        body = "".join(sse.iter_text())
    assert body.rstrip().endswith("data: [DONE]") and "event: error" not in body
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == 8
    # as Baton's own Ray client does: the head's token when it wrote one (Ray's token auth), else none
    token = read_token(Path.home() / ".ray" / "auth_token")
    status = httpx.get(f"{stack.dashboard_url}/api/serve/applications/", timeout=10,
                       headers={"authorization": f"Bearer {token}"} if token else {})
    apps = status.json()["applications"]
    # the decode pool is the app clients reach; the prefill pool is an app of its own (the fallback)
    assert any(name.startswith("Decode") for name in apps[stack.deployment]["deployments"])
    assert any(name.startswith("Prefill") for name in apps[stack.prefill_app]["deployments"])


@pytest.mark.last
@pytest.mark.timeout(1800)  # a `baton up` (Ray and three engines) and two `baton down`s
def test_a_killed_replica_takes_its_engine_and_down_then_up_then_down_again(baton_stack: BatonStack) -> None:
    stack = baton_stack
    # A SIGKILLed replica's engine ends with it (its process group), instead of living on orphaned.
    replica = _decode_replica(stack)
    engines = [c for c in replica.children(recursive=True) if (c.cmdline() or [""])[0].startswith("VLLM::")]
    assert engines, "the decode replica runs no engine process"
    replica.kill()
    _, alive = psutil.wait_procs(engines, timeout=60)
    assert not alive, f"engine processes outlived their replica: {[p.pid for p in alive]}"

    # the demo key revoked (nothing runs after this module): the next `up` must issue a new one, not fail
    revoked = stack.api_key
    with stack.admin() as admin:
        demo = next(t for t in admin.get("/tenants", params={"name": "demo"}).json()["data"] if t["name"] == "demo")
        for k in admin.get(f"/tenants/{demo['id']}/keys").json():
            admin.post(f"/tenants/{demo['id']}/keys/{k['id']}/revoke").raise_for_status()
    refused = False
    for _ in range(50):  # the gateway hears of a revocation over Redis within milliseconds
        refused = httpx.get(f"{stack.gateway_url}/v1/models", headers={"authorization": f"Bearer {revoked}"},
                            timeout=30).status_code == 401
        if refused:
            break
        time.sleep(0.1)
    assert refused

    down = stack.down()
    assert down.returncode == 0, down.stderr[-2000:]
    assert stack.marked() == []
    # up again, tracing to a port nothing listens on
    stack.start(BATON_TELEMETRY__OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    try:
        stack.wait_up()
        assert stack.api_key != revoked  # var/demo.key holds a new key, which the smoke check used
        resp = _chat(stack)
        assert resp.status_code == 200, resp.text
    finally:
        down = stack.down()
    assert down.returncode == 0, down.stderr[-2000:]
    assert stack.marked() == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{stack.gateway_url}/healthz", timeout=2)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{stack.dashboard_url}/api/version", timeout=2)
