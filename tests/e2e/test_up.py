"""The README's run command on this machine: `baton up` brings up P/D serving of the tiny model behind the
gateway (its own database, state folder, Ray head and ports), chat completions go through, and
`baton down` stops what it started. A SIGKILLed replica's engine ends with it, and `baton up` after
`baton down` waits for the app again and answers. Tracing is on everywhere with an OTLP collector that is not there
(gateway, decode server, engines): it costs the spans, never a request."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy.engine import make_url

from baton.control.ray_client import read_token
from tests.conftest import drop_database

from .conftest import stack_pids

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marked(state: Path) -> list[int]:
    """Processes of the stack's Ray head (their environment carries its BATON_STACK mark)."""
    return stack_pids(f"{(state / 'run').resolve()}")


def _decode_replica() -> psutil.Process:
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (p.cmdline() or [""])[0].startswith("ray::ServeReplica:tiny-llama-pd:Decode"):
                return p
    raise AssertionError("no decode replica process")


def _chat(gateway: int, key: str) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{gateway}/v1/chat/completions", timeout=120,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": "tiny-llama", "max_tokens": 8, "temperature": 0,
                            "messages": [{"role": "user", "content": "hello"}]})


@pytest.mark.timeout(1800)  # two `baton up`s (each starts Ray and two engines) and two `baton down`s
def test_up_serves_the_tiny_model_in_pd_mode_and_down_stops_it(tmp_path: Path, pg_url: str) -> None:
    baton = str(Path(sys.executable).with_name("baton"))
    db_url = make_url(pg_url).set(database=f"{make_url(pg_url).database}_up").render_as_string(hide_password=False)
    gateway, dashboard = _free_port(), _free_port()
    # Not the other Ray heads' cluster settings of this session (their HAProxy and direct-ingress ports):
    # `baton up` chooses its own.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_SERVE_", "RAY_process_group"))},
        "BATON_STATE_DIR": str(tmp_path / "state"),
        "BATON_DB__URL": db_url,
        "BATON_GATEWAY__PORT": str(gateway),
        "BATON_RAY__ADDRESS": f"127.0.0.1:{_free_port()}",
        "BATON_RAY__DASHBOARD_URL": f"http://127.0.0.1:{dashboard}",
        "BATON_RAY__SERVE_HTTP_PORT": str(_free_port()),
        "BATON_TELEMETRY__ENABLED": "true",
        "BATON_TELEMETRY__OTLP_ENDPOINT": f"http://127.0.0.1:{_free_port()}",  # nothing listens there
    }
    try:
        up = subprocess.run([baton, "up", "--timeout", "900"], env=env, capture_output=True, text=True, timeout=1500)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert f"OPENAI_BASE_URL=http://127.0.0.1:{gateway}/v1" in up.stdout
        key = (tmp_path / "state" / "demo.key").read_text().strip()
        resp = _chat(gateway, key)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 8
        with httpx.stream("POST", f"http://127.0.0.1:{gateway}/v1/completions", timeout=120,
                          headers={"authorization": f"Bearer {key}"},
                          json={"model": "tiny-llama", "prompt": "once upon a time", "max_tokens": 8,
                                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}) as sse:
            assert sse.status_code == 200
            body = "".join(sse.iter_text())
        assert body.rstrip().endswith("data: [DONE]") and "event: error" not in body
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
        assert events[-1]["usage"]["completion_tokens"] == 8
        # as Baton's own Ray client does: the head's token when it wrote one (Ray's token auth), else none
        token = read_token(Path.home() / ".ray" / "auth_token")
        status = httpx.get(f"http://127.0.0.1:{dashboard}/api/serve/applications/", timeout=10,
                           headers={"authorization": f"Bearer {token}"} if token else {})
        apps = status.json()["applications"]
        # the decode pool is the app clients reach; the prefill pool is an app of its own (the fallback)
        assert any(name.startswith("Decode") for name in apps["tiny-llama-pd"]["deployments"])
        assert any(name.startswith("Prefill") for name in apps["tiny-llama-pd.prefill"]["deployments"])

        # A SIGKILLed replica's engine ends with it (its process group), instead of living on orphaned.
        replica = _decode_replica()
        engines = [c for c in replica.children(recursive=True) if (c.cmdline() or [""])[0].startswith("VLLM::")]
        assert engines, "the decode replica runs no engine process"
        replica.kill()
        _, alive = psutil.wait_procs(engines, timeout=60)
        assert not alive, f"engine processes outlived their replica: {[p.pid for p in alive]}"

        # down leaves nothing of the stack; up again waits for the app (the database still says
        # "running" from before) and answers.
        down = subprocess.run([baton, "down"], env=env, capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, down.stderr[-2000:]
        assert _marked(tmp_path / "state") == []
        up = subprocess.run([baton, "up", "--timeout", "900"], env=env, capture_output=True, text=True, timeout=1500)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        resp = _chat(gateway, key)
        assert resp.status_code == 200, resp.text
    finally:
        down = subprocess.run([baton, "down"], env=env, capture_output=True, text=True, timeout=300)
        drop_database(make_url(db_url).database or "")
    assert down.returncode == 0, down.stderr[-2000:]
    assert _marked(tmp_path / "state") == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{gateway}/healthz", timeout=2)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{dashboard}/api/version", timeout=2)
