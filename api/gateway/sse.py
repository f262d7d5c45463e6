"""Server-sent events cut out of an upstream byte stream: the one framer every relay uses.

An upstream read returns whatever bytes arrived, which may end in the middle of an event. The relays
(:mod:`baton.api.gateway.relay`: the plain and the resuming relay; :mod:`baton.api.gateway.responses`)
each hand every read to a :class:`SSEFrames` and get back the whole events in it; a partial event waits
for the next read. The common case (a read that is one or more whole events) returns the read itself,
no copy.
"""

from __future__ import annotations

EVENT_END = b"\n\n"


class SSEFrames:
    """Whole SSE events (each ending in a blank line) from a stream of reads."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        #: what came after the last whole event: the start of the next one
        self.pending = b""

    def feed(self, received: bytes) -> bytes:
        """The whole events completed by ``received``, each with its blank line; ``b""`` while none is."""
        chunk = self.pending + received if self.pending else received
        end = chunk.rfind(EVENT_END)
        if end < 0:
            self.pending = chunk
            return b""
        end += 2
        if end == len(chunk):
            self.pending = b""
            return chunk
        self.pending = chunk[end:]
        return chunk[:end]


def events(frames: bytes) -> list[bytes]:
    """The events of :meth:`SSEFrames.feed`'s output, each without its blank line (empty ones dropped)."""
    return [ev for ev in frames.split(EVENT_END) if ev]
