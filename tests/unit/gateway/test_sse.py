"""The SSE framer the relays share: whole events out of reads cut anywhere."""

from __future__ import annotations

import random

from baton.api.gateway.sse import SSEFrames, events

STREAM = (b'data: {"choices":[{"text":"a"}]}\n\n'
          b"event: error\ndata: {\"error\":{}}\n\n"
          b'data: {"choices":[{"text":"\\n\\n"}]}\n\n'  # an escaped blank line inside JSON is not an event's end
          b"data: [DONE]\n\n")


def test_reads_cut_anywhere_give_the_same_whole_events() -> None:
    expected = events(STREAM)
    assert len(expected) == 4
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randrange(0, 8)))
        frames, got = SSEFrames(), []
        for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True):
            got.extend(events(frames.feed(STREAM[a:b])))
        assert got == expected and frames.pending == b""


def test_a_partial_event_waits_for_the_rest() -> None:
    frames = SSEFrames()
    assert frames.feed(b'data: {"x":') == b""
    assert frames.feed(b"1}\n\ndata: {") == b'data: {"x":1}\n\n'
    assert frames.pending == b"data: {"


def test_a_read_of_whole_events_is_passed_on_without_a_copy() -> None:
    read = b"data: 1\n\ndata: 2\n\n"
    assert SSEFrames().feed(read) is read
