"""How a batch file is split into its lines (``baton.control.batches.JsonLines``), chunk by chunk."""

from __future__ import annotations

from baton.control.batches import JsonLines


def _read(chunks: list[bytes], max_line: int = 1000) -> tuple[list[tuple[int, dict]], JsonLines]:
    lines = JsonLines(max_line=max_line)
    out = [x for c in chunks for x in lines.feed(c)]
    return out + list(lines.end()), lines


def test_lines_cross_chunk_borders_and_blank_lines_are_skipped() -> None:
    out, lines = _read([b'{"a": 1}\n{"b"', b': 2}\n\n', b'[1]\n{"c": 3}'])
    assert out == [(1, {"a": 1}), (2, {"b": 2}), (5, {"c": 3})]
    assert lines.count == 4 and lines.problems == ["line 4 is not a JSON object"]


def test_a_line_too_long_is_noted_and_skipped_without_being_gathered() -> None:
    big = b'{"x": "' + b"y" * 3000
    out, lines = _read([b'{"a": 1}\n' + big[:1500], big[1500:], b'"}\n{"b": 2}\n'], max_line=1000)
    assert out == [(1, {"a": 1}), (3, {"b": 2})]
    assert lines.problems == ["line 2 is longer than 0.000953674 MiB"] and lines.rest == b""
    out, lines = _read([b"z" * 2000], max_line=1000)  # to the file's end
    assert out == [] and lines.count == 1 and len(lines.problems) == 1
