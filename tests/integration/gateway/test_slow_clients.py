"""Slow clients against a real ``baton gateway run`` process (Postgres and Redis, no upstream needed): a
request head that never completes gets 408 and the connection closes; a body that stops arriving ends its
connection; a connection that sends nothing is closed; one address cannot hold more than
``max_unfinished_per_client`` unfinished heads; and through all of it a well-behaved client is served."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from baton.bench.procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[3]
LIMITS = {"BATON_GATEWAY__HEADER_TIMEOUT_S": "1", "BATON_GATEWAY__BODY_TIMEOUT_S": "1",
          "BATON_GATEWAY__KEEP_ALIVE_S": "2", "BATON_GATEWAY__MAX_UNFINISHED_PER_CLIENT": "3"}


@pytest.fixture(scope="module")
def gateway(settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {"BATON_ENV": "test", "BATON_DB__URL": settings.db.url, "BATON_DB__APP_ROLE": settings.db.app_role,
           "BATON_DB__APP_URL": settings.db.service_url(), "BATON_REDIS__URL": settings.redis.url,
           "BATON_SECURITY__KEY_SECRET": settings.security.key_secret.get_secret_value(), **LIMITS}
    gw = Proc("gateway", [sys.executable, "-m", "baton.cli.main", "gateway", "run", "--port", str(port)], env=env,
              cwd=ROOT, log_path=tmp_path_factory.mktemp("slow") / "gateway.log").start()
    try:
        gw.wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=90)
        yield "127.0.0.1", port
    finally:
        gw.stop()


def _connect(addr: tuple[str, int]) -> socket.socket:
    s = socket.create_connection(addr, timeout=10)
    s.settimeout(10)
    return s


def _read_until_closed(s: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, got = time.monotonic(), b""
    while chunk := s.recv(4096):
        got += chunk
    return got, time.monotonic() - start


def test_an_unfinished_head_gets_408_and_is_closed(gateway: tuple[str, int]) -> None:
    s = _connect(gateway)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: app")  # ... and nothing more
    got, _ = _read_until_closed(s)  # a server that waits for ever: socket.timeout after 10 s
    assert got.startswith(b"HTTP/1.1 408 "), got


def test_a_body_that_stops_arriving_ends_the_connection(gateway: tuple[str, int]) -> None:
    s = _connect(gateway)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bt_live_x\r\n"
              b"content-type: application/json\r\ncontent-length: 500\r\n\r\n{\"model\": ")
    got, _ = _read_until_closed(s)
    assert b" 200 " not in got.split(b"\r\n", 1)[0], got


def test_a_connection_that_sends_nothing_is_closed(gateway: tuple[str, int]) -> None:
    got, _ = _read_until_closed(_connect(gateway))
    assert got == b""


def test_one_address_holds_a_bounded_number_of_unfinished_heads_and_others_are_served(
        gateway: tuple[str, int]) -> None:
    held = [_connect(gateway) for _ in range(3)]
    for s in held:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # heads that go on for ever
    time.sleep(0.3)
    extra = _connect(gateway)
    got, _ = _read_until_closed(extra)
    assert got.startswith(b"HTTP/1.1 429 "), got
    for s in held:  # each held head still ends in 408, and then the address is free again
        assert _read_until_closed(s)[0].startswith(b"HTTP/1.1 408 ")
    assert httpx.get(f"http://{gateway[0]}:{gateway[1]}/healthz", timeout=10).status_code == 200


def test_a_well_behaved_client_is_served_on_a_kept_alive_connection(gateway: tuple[str, int]) -> None:
    with httpx.Client(base_url=f"http://{gateway[0]}:{gateway[1]}", timeout=10) as c:
        for _ in range(3):
            assert c.get("/healthz").status_code == 200
        r = c.post("/v1/chat/completions", json={"model": "none", "messages": []})
        assert r.status_code == 401 and r.json()["error"]["type"]  # a whole body is read and answered
