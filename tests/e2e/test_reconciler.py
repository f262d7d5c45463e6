"""The control loop against a real local Ray head: /admin/v1 -> Postgres -> reconciler -> Serve REST API.

Starts its own head (``ray start --head --block`` on free ports, dashboard on loopback, Serve's proxy on
its own port: :func:`baton.bench.chaos.stack.start_head`) and stops exactly that process group
afterwards. Run by hand under the machine-wide lock:

    flock /tmp/baton-heavy.lock .venv/bin/pytest -m e2e tests/e2e/test_reconciler.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.conftest import own_database
from tests.engine_slots import slots_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.own_stack]  # own Ray head or engines: the lane (tests/stages.py)

TOKEN = "e2e-admin-token"
STEP_TIMEOUT_S = 420


engine_room = slots_fixture(2)  # its P/D deployment's engines (tests/engine_slots.py)


@pytest.fixture(scope="module")
def ray_head(engine_room: float, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Ray head of this module's own, every port free (the session's shared stack runs another), stopped
    with its whole process group afterwards: the reconciler here owns every declarative app on it."""
    from baton.bench.chaos.stack import start_head

    head = start_head(tmp_path_factory.mktemp("ray"))
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="module")
def own_db() -> Iterator[tuple[Any, Any]]:
    """A database of this module's own: the reconciler drives Ray to match *every* deployment it holds,
    and other tests leave theirs (with models Ray could never load) in the session's database."""
    with own_database("baton_test_reconciler") as own:
        yield own


@pytest.fixture(scope="module")
def stack(own_db, ray_head: Any, tiny_model: Path):  # type: ignore[no-untyped-def]
    import redis

    from baton.api.admin.deps import AdminContext
    from baton.api.admin.router import router
    from baton.control.ray_client import RayServeClient
    from baton.control.reconciler import Reconciler
    from baton.control.services import ControlPlane
    from baton.control.usecase import RecordingNotifier

    settings, db = own_db
    s = settings.model_copy(
        update={
            "security": settings.security.model_copy(update={"admin_token": SecretStr(TOKEN)}),
            "ray": settings.ray.model_copy(update={"dashboard_url": ray_head.dashboard_url,
                                                   "serve_http_port": ray_head.serve_port}),
        }
    )
    client = RayServeClient.from_settings(s)
    reconciler = Reconciler.from_settings(s, db, client)
    notifier = RecordingNotifier()
    red = redis.Redis.from_url(s.redis.url)
    app = FastAPI()
    app.include_router(router, prefix="/admin/v1")
    app.state.admin = AdminContext(settings=s, db=db,
                                   control=ControlPlane.build(s, db, redis_client=red, notify=notifier))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        yield http, reconciler, client, notifier.reconciles, ray_head.serve_port
    client.close()
    red.close()


def _converge(reconciler: Any, check: Callable[[], bool], what: str) -> None:
    """Reconcile (as the Celery task and its follow-ups would) until ``check`` holds."""
    start = time.monotonic()
    deadline = start + STEP_TIMEOUT_S
    while True:
        reconciler.reconcile()
        if check():
            print(f"[reconciler e2e] {what}: {time.monotonic() - start:.0f} s", file=sys.stderr)
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for: {what}")
        time.sleep(3)


# Five convergences (five engine starts, about 400 s alone on 2 cores) share one test: it gets each
# step's limit in full rather than the suite's 900 s for the whole.
@pytest.mark.timeout(5 * STEP_TIMEOUT_S)
def test_admin_api_drives_ray_serve(stack: Any, tiny_model: Path) -> None:
    http, reconciler, client, triggers, serve_port = stack
    model = http.post(
        "/admin/v1/models",
        json={
            "name": "tiny-e2e",
            "source": str(tiny_model),
            "context_length": 2048,
            "num_layers": 2,
            "num_kv_heads": 2,
            "head_dim": 32,
            "dtype": "float32",
        },
    ).json()
    dep = http.post(
        "/admin/v1/deployments",
        json={
            "name": "tiny-e2e",
            "model_id": model["id"],
            "mode": "aggregated",
            "decode": {"min": 1, "max": 1},
            "engine": {"kv_cache_space_gib": 0.25, "max_num_seqs": 4, "max_model_len": 1024},
        },
    )
    assert dep.status_code == 201, dep.text
    dep_id = dep.json()["id"]
    assert triggers  # the change enqueued a reconcile

    def status() -> dict[str, Any]:
        return http.get(f"/admin/v1/deployments/{dep_id}/status").json()

    def running(generation: int) -> Callable[[], bool]:
        def check() -> bool:
            st = status()
            if st["observed_state"] == "failed":
                pytest.fail(f"deployment failed: {st['observed_reason']}")
            return st["observed_state"] == "running" and st["observed_generation"] == generation

        return check

    # 1. aggregated: the app comes up in Ray and answers through Serve's proxy.
    _converge(reconciler, running(1), "aggregated app running")
    assert client.status().apps["tiny-e2e"].status == "RUNNING"
    base = f"http://127.0.0.1:{serve_port}/tiny-e2e/v1"
    # a RUNNING app's route reaches Serve's proxy a moment later: 404 until it has
    deadline = time.monotonic() + 60
    while (out := httpx.post(f"{base}/completions", json={"model": "tiny-e2e", "prompt": "hello", "max_tokens": 4},
                             timeout=120)).status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["completion_tokens"] == 4

    # 2. someone deletes the Serve app behind Baton's back: the next reconcile repairs it.
    client.apply({"http_options": {"host": "127.0.0.1", "port": serve_port}, "applications": []})
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while "tiny-e2e" in client.status().apps and time.monotonic() < deadline:
        time.sleep(2)  # (no reconcile meanwhile: it would put the app straight back)
    assert "tiny-e2e" not in client.status().apps
    result = reconciler.reconcile()
    assert result.applied and "tiny-e2e" in client.status().apps
    _converge(reconciler, running(1), "app repaired")

    # 3. switch to P/D: prefill and decode pools appear in Ray.
    etag = http.get(f"/admin/v1/deployments/{dep_id}").headers["etag"]
    r = http.patch(
        f"/admin/v1/deployments/{dep_id}",
        headers={"If-Match": etag},
        json={"mode": "pd", "kv_connector": "nixl", "prefill": {"min": 1, "max": 1}, "decode": {"min": 1, "max": 1}},
    )
    assert r.status_code == 200, r.text
    _converge(reconciler, running(2), "pd app running")
    apps = client.status().apps
    assert any(name.startswith("Decode") for name in apps["tiny-e2e"].deployments), apps
    assert any(name.startswith("Prefill") for name in apps["tiny-e2e.prefill"].deployments), apps

    # 4. scale the decode pool: Serve runs the new range.
    r = http.patch(f"/admin/v1/deployments/{dep_id}", json={"decode": {"min": 2, "max": 2}})
    assert r.json()["generation"] == 3
    _converge(reconciler, running(3), "decode pool scaled")
    assert client.status().apps["tiny-e2e"].config["args"]["decode"]["min"] == 2
    out = httpx.post(
        f"{base}/completions", json={"model": "tiny-e2e", "prompt": "hello again", "max_tokens": 4}, timeout=120
    )
    assert out.status_code == 200, out.text

    # 5. delete: the app leaves Ray, then the row leaves Postgres.
    assert http.delete(f"/admin/v1/deployments/{dep_id}").status_code == 202
    _converge(reconciler, lambda: http.get(f"/admin/v1/deployments/{dep_id}").status_code == 404, "deleted")
    assert "tiny-e2e" not in client.status().apps
    actions = [
        a["action"]
        for a in http.get("/admin/v1/audit", params={"actor": "system:reconciler", "limit": 200}).json()["data"]
    ]
    assert "serve.apply" in actions and "deployment.removed" in actions
