"""Browser tests: Debian's Chromium driven by Playwright against the whole API process (gateway, admin
API and console served by one uvicorn), a real OpenAI-compatible streaming stub as the upstream, and
real Postgres and Redis. Deployments are reconciled by the real reconciler against a stub Ray Serve
client (the browser suite does not start Ray); screenshots go to var/screenshots/."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from baton.core import models as m
from baton.core.db import Database

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "var" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PASSWORD = "correct horse battery staple"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Runs an ASGI app under uvicorn in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


class StubServe:
    """A Ray Serve stand-in for the reconciler: an applied app reports DEPLOYING once, then RUNNING."""

    def __init__(self) -> None:
        self.apps: dict[str, tuple[dict[str, Any], int]] = {}
        self.lock = threading.Lock()

    def status(self):  # type: ignore[no-untyped-def]
        from baton.control.ray_client import ServeApp, ServeStatus

        with self.lock:
            out = {}
            for name, (entry, polls) in list(self.apps.items()):
                out[name] = ServeApp(name=name, status="RUNNING" if polls >= 2 else "DEPLOYING", config=entry)
                self.apps[name] = (entry, polls + 1)
            return ServeStatus(apps=out)

    def apply(self, config: dict[str, Any]) -> None:
        with self.lock:
            entries = {e["name"]: e for e in config.get("applications", [])}
            self.apps = {n: (e, self.apps[n][1] if n in self.apps and self.apps[n][0] == e else 0)
                         for n, e in entries.items()}


class StubNotifier:
    """Reconciles against :class:`StubServe` in a thread; gateway invalidations go nowhere."""

    def __init__(self, trigger: Any) -> None:
        self.reconcile = trigger

    def invalidate(self, kind: str, id_: Any) -> None:
        return None


def stub_reconcile_trigger(settings: Any, db: Database) -> Any:
    """What the admin API calls after a change: reconcile now, and again shortly (a beat's drift repair)."""
    from baton.control.reconciler import Reconciler

    reconciler = Reconciler.from_settings(settings, db, StubServe())
    reconciler.check_sources = False  # the pages' models are catalogue rows without a folder behind them

    def passes() -> None:
        for _ in range(4):
            reconciler.reconcile()
            time.sleep(0.5)

    def trigger(reason: str = "change") -> None:
        threading.Thread(target=passes, daemon=True).start()

    return trigger


@dataclass(frozen=True)
class Stack:
    url: str
    model: str
    model_id: uuid.UUID
    operator_email: str
    db: Database


@pytest.fixture(scope="session")
def stack(settings, db: Database) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    from baton.api.app import create_app
    from baton.api.console.auth import create_operator
    from tests.integration.gateway.stub_upstream import app as stub_app

    model_name = f"tiny-chat-{uuid.uuid4().hex[:6]}"
    with db.system() as uow:
        model = uow.models.add(m.Model(name=model_name, source="/models/tiny", context_length=2048, num_layers=4,
                                       num_kv_heads=4, head_dim=64, dtype="bfloat16", params_b=0.05))
        uow.commit()
        model_id = model.id
    operator_email = f"ops-{uuid.uuid4().hex[:6]}@baton.example.com"
    create_operator(db, email=operator_email, password=PASSWORD, actor="test")

    with serve(stub_app) as upstream:
        gateway = settings.gateway.model_copy(update={"upstreams": {model_name: f"{upstream}/v1"},
                                                      "usage_flush_interval_s": 0.05, "last_used_flush_s": 0.2})
        s = settings.model_copy(update={"gateway": gateway})
        app = create_app(s, db=db, notify=StubNotifier(stub_reconcile_trigger(s, db)))
        with serve(app) as url:
            yield Stack(url=url, model=model_name, model_id=model_id, operator_email=operator_email, db=db)


@pytest.fixture(scope="session", autouse=True)
def _expect_timeout() -> None:
    """``expect`` waits as long as the pages' own actions (15 s, not Playwright's 5 s): on a loaded machine a
    page's data can take longer than 5 s to arrive; a check that fails still fails, 10 s later."""
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API runs an event loop in this thread until it exits, and later
    tests (``asyncio.run``, sync httpx) must not find one running."""
    from playwright.sync_api import sync_playwright

    if not (ROOT / "web" / "dist" / "index.html").is_file():
        pytest.fail("the console is not built: run scripts/setup (npm ci && npm run build in web/)")
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: scripts/setup installs it (apt-get install chromium)")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture()
def page(browser, stack: Stack) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    ctx = browser.new_context(base_url=stack.url, viewport={"width": 1440, "height": 900})
    ctx.set_default_timeout(15000)
    pg = ctx.new_page()
    yield pg
    ctx.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def operator_page(browser: Any, stack: Stack) -> Any:
    """A page of a new browser context where the stack's operator has signed in (close its ``.context``)."""
    from playwright.sync_api import expect

    ctx = browser.new_context(base_url=stack.url, viewport={"width": 1366, "height": 768})
    ctx.set_default_timeout(15000)
    page = ctx.new_page()
    page.goto("/console/login")
    page.get_by_label("Email").fill(stack.operator_email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Platform health")).to_be_visible()
    return page
