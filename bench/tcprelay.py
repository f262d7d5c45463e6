"""A TCP relay that can cut a service away: what the metering tests and ``baton bench ingest`` put between
a process and Postgres to stage an outage without touching the server."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


class TcpRelay:
    """Forwards 127.0.0.1:<port> to Postgres; ``cut()`` drops every connection and refuses new ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.listener.listen(64)
        self.up = True
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, server):  # no Nagle: a relayed small write must not wait for an ACK
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up = False
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.conns.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _serve_relay(target: tuple[str, int], control: Any) -> None:
    relay = TcpRelay(target)
    control.send(relay.port)
    while True:
        try:
            command = control.recv()
        except EOFError:
            command = "close"
        if command == "cut":
            relay.cut()
        elif command == "restore":
            relay.restore()
        else:
            relay.close()
            return
        control.send(command)


class RelayProcess:
    """A :class:`TcpRelay` in a process of its own, so that relaying costs the measured process no CPU;
    the same ``port``, ``cut()``, ``restore()`` and ``close()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._control, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_relay, args=(target, theirs), daemon=True)
        self._proc.start()
        if not self._control.poll(60):
            self._proc.kill()
            raise RuntimeError("the TCP relay process did not start")
        self.port: int = self._control.recv()

    def _say(self, command: str) -> None:
        self._control.send(command)
        self._control.recv()

    def cut(self) -> None:
        self._say("cut")

    def restore(self) -> None:
        self._say("restore")

    def close(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._say("close")
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
