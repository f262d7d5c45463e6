"""The least a relay costs: bytes from each client connection to its own upstream connection and back,
in the event loop's protocol callbacks (uvloop), with no HTTP parsing, no ASGI and no task switch.

``baton bench gateway`` runs it as the ``relay-floor`` arm of the throughput and per-token phases: what
the kernel and the event loop charge a process for passing one token through, on this machine, next to
what the proxies cost. Run it as ``python -m baton.bench.floor --port P --upstream HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    """One client connection; its bytes wait until the upstream connection is open."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what arrived before the upstream connection opened

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's transports are not its subclasses
        self.transport.pause_reading()
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(lambda: _Upstream(self.transport), self.host, self.port)
        except OSError:
            self.transport.close()
            return
        self.upstream = upstream
        if self.early:
            self.upstream.write(b"".join(self.early))
            self.early.clear()
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, upstream: str) -> None:
    host, _, up_port = upstream.rpartition(":")
    server = await asyncio.get_running_loop().create_server(lambda: _Client(host, int(up_port)), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="HOST:PORT")
    args = parser.parse_args()
    import uvloop

    uvloop.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
