"""The Redis client's RESP2 parser: the replies the rate limiter's scripts return, parsed from bytes as they arrive."""

from __future__ import annotations

import pytest

from baton.api.gateway.redis_client import RedisReplyError, _command, _Incomplete, _parse


def test_replies_of_every_kind_are_parsed() -> None:
    buf = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n:-5\r\n$-1\r\n+OK\r\n-NOSCRIPT No matching script\r\n"
    value, pos = _parse(buf, 0)
    assert value == [1, b"abc", [-5, None]]
    value, pos = _parse(buf, pos)
    assert value == b"OK"
    value, pos = _parse(buf, pos)
    assert isinstance(value, RedisReplyError) and str(value).startswith("NOSCRIPT") and pos == len(buf)


@pytest.mark.parametrize("cut", [1, 5, 9, 14, 17])
def test_a_reply_cut_short_waits_for_more(cut: int) -> None:
    whole = b"*2\r\n:12\r\n$3\r\nabc\r\n"
    with pytest.raises(_Incomplete):
        _parse(whole[:cut], 0)
    assert _parse(whole, 0) == ([12, b"abc"], len(whole))


def test_commands_are_resp_arrays_of_bulk_strings() -> None:
    assert _command("EVALSHA", "ab", 1, "k") == b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n"
