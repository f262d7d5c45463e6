"""The chaos ledger: every request the harness sent, what the client saw of it, and the invariants.

Pure bookkeeping (no I/O), so that it can be tested with synthetic streams. The load driver fills one
:class:`RequestRecord` per request (the raw SSE events in order, how the stream ended, whether the
harness itself dropped the connection); :meth:`Ledger.check` judges each against the undisturbed
baseline of its prompt and sums the verdicts into a :class:`LedgerSummary`.

Final states (exactly one per request, see docs/architecture.md, "Recovery ladder"):

- ``completed``: HTTP 200, a ``finish_reason``, ``[DONE]``, no error event.
- ``failed``: an error the client can read: a non-200 with an OpenAI error body, or an SSE ``error``
  event once streaming started.
- ``cancelled``: the harness dropped the connection on purpose.

Violations:

- ``lost``: no final state at all (no response, a hang past the client timeout, an unreadable error).
- ``truncated_200``: a 200 whose stream ended without ``[DONE]`` and without an error event.
- ``multiple_finals``: more than one final marker (two finish reasons, an error and a finish reason,
  content after the end).
- token positions: the tokens received are aligned with the baseline's (greedy decoding: a completed
  stream must equal it). Extra tokens are ``duplicated``, absent ones ``missing``, different ones
  ``mismatched``. With token ids in the stream (vLLM's ``return_token_ids``) the unit is the token;
  otherwise the character.
- the untransmitted tail: a request that did not complete (failed, cut, lost) owes the client the rest
  of its answer; what it never sent counts as ``missing`` (and, separately, as ``missing_tail``). Only a
  stream the harness itself dropped (``cancelled``) is judged as a prefix: the client asked for no more.
"""

from __future__ import annotations

# ruff: noqa: S105  (token_unit / TOKEN_ID_PREFIX are not secrets)
import difflib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

State = Literal["completed", "failed", "cancelled", "lost", "truncated_200"]
Ending = Literal["eof", "transport_error", "client_cancel", "timeout", "no_response"]

TOKEN_ID_PREFIX = "token_id:"


@dataclass
class Baseline:
    """A prompt's undisturbed greedy output."""

    text: str
    token_ids: list[int] | None = None


@dataclass
class RequestRecord:
    """What the client saw of one request."""

    seq: int
    prompt: int
    """Index of the prompt (its baseline)."""
    expected_tokens: int
    """``max_tokens`` with ``ignore_eos``: the length of a completed answer."""
    http_status: int | None = None
    request_id: str | None = None
    error_body: str | None = None
    events: list[tuple[str | None, str]] = field(default_factory=list)
    """SSE events in order: (event name or None, data)."""
    ending: Ending = "eof"
    transport_error: str | None = None
    cancel_after: int | None = None
    """The harness meant to drop the connection after this many content chunks."""
    t_send: float = 0.0
    token_times: list[float] = field(default_factory=list)
    """Monotonic times of content-bearing chunks."""
    t_end: float = 0.0


@dataclass
class Verdict:
    seq: int
    request_id: str | None
    state: State
    finals: int = 0
    duplicated: int = 0
    missing: int = 0
    """Absent positions, the untransmitted tail included."""
    missing_tail: int = 0
    """Of ``missing``: the end of the answer a request that did not complete never sent."""
    mismatched: int = 0
    text_ok: bool = True
    token_unit: Literal["token", "char"] = "token"
    received: int = 0
    usage_completion_tokens: int | None = None
    usage_ok: bool = True
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def parse_sse(raw: bytes | str) -> tuple[list[tuple[str | None, str]], str]:
    """Splits an SSE byte stream into complete (event, data) pairs; returns them and the unfinished rest."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.replace("\r\n", "\n")
    parts = text.split("\n\n")
    rest = parts.pop()
    events: list[tuple[str | None, str]] = []
    for part in parts:
        name: str | None = None
        data: list[str] = []
        for line in part.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if name is not None or data:
            events.append((name, "\n".join(data)))
    return events, rest


def _readable_error(body: str | None) -> str | None:
    """The message of an OpenAI-shaped error body, else None."""
    if not body:
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]:
        return str(err["message"])
    return None


@dataclass
class _Stream:
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    ids_complete: bool = True
    finish_reasons: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: int = 0
    after_end: int = 0  # content events after a final marker or [DONE]
    usage: dict[str, Any] | None = None
    malformed: int = 0


def read_stream(events: Iterable[tuple[str | None, str]]) -> _Stream:
    s = _Stream()
    for name, data in events:
        if data.strip() == "[DONE]":
            s.done += 1
            continue
        if s.done:
            s.after_end += 1
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            if name == "error":
                s.errors.append(data[:200] or "error")
            else:
                s.malformed += 1
            continue
        if not isinstance(obj, dict):
            s.malformed += 1
            continue
        if name == "error" or ("error" in obj and not obj.get("choices")):
            err = obj.get("error")
            msg = err.get("message") if isinstance(err, dict) else None
            s.errors.append(str(msg) if msg else "")
            continue
        if isinstance(obj.get("usage"), dict):
            s.usage = obj["usage"]
        for choice in obj.get("choices") or ():
            piece = choice.get("text")
            if piece is None and isinstance(choice.get("delta"), dict):
                piece = choice["delta"].get("content")
            ids = _token_ids(choice)
            has_content = bool(piece) or bool(ids)
            if has_content and (s.finish_reasons or s.errors):
                s.after_end += 1
            if piece:
                s.texts.append(piece)
            if ids is None:
                if piece:
                    s.ids_complete = False
            else:
                s.ids.extend(ids)
            if choice.get("finish_reason"):
                s.finish_reasons.append(str(choice["finish_reason"]))
    return s


def _token_ids(choice: dict[str, Any]) -> list[int] | None:
    """Token ids of a chunk: vLLM's ``return_token_ids`` (``token_ids`` on the choice), else ``logprobs`` with
    ``return_tokens_as_token_ids`` (completions: ``tokens``; chat: ``content[].token``); None when none."""
    direct = choice.get("token_ids")
    if isinstance(direct, list) and all(isinstance(t, int) for t in direct):
        return list(direct)
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    tokens = lp.get("tokens")
    if tokens is None and isinstance(lp.get("content"), list):
        tokens = [c.get("token") for c in lp["content"] if isinstance(c, dict)]
    if not isinstance(tokens, list):
        return None
    out = []
    for t in tokens:
        if not (isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX)):
            return None
        try:
            out.append(int(t[len(TOKEN_ID_PREFIX):]))
        except ValueError:
            return None
    return out


def align(expected: Sequence[Any], received: Sequence[Any], *, partial: bool) -> tuple[int, int, int]:
    """(duplicated, missing, mismatched) positions of ``received`` against ``expected``; with ``partial``
    the received sequence may stop early (a tail missing at the end is not counted)."""
    dup = miss = mism = 0
    ops = difflib.SequenceMatcher(None, list(expected), list(received), autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in ops:
        if tag == "insert":
            dup += j2 - j1
        elif tag == "delete":
            if partial and i2 == len(expected) and j1 == len(received):
                continue
            miss += i2 - i1
        elif tag == "replace":
            if partial and i2 == len(expected) and j2 == len(received) and (j2 - j1) < (i2 - i1):
                # a different tail that is shorter than the rest: count what differs
                mism += j2 - j1
            else:
                common = min(i2 - i1, j2 - j1)
                mism += common
                dup += max(0, (j2 - j1) - common)
                miss += max(0, (i2 - i1) - common)
    return dup, miss, mism


def _nothing_sent(v: Verdict, baseline: Baseline | None) -> Verdict:
    """A request without a stream owes the whole answer."""
    if baseline is not None:
        v.token_unit = "token" if baseline.token_ids is not None else "char"
        v.missing = v.missing_tail = (len(baseline.token_ids) if baseline.token_ids is not None
                                      else len(baseline.text))
    return v


def judge(rec: RequestRecord, baseline: Baseline | None) -> Verdict:
    """The verdict on one request."""
    v = Verdict(seq=rec.seq, request_id=rec.request_id, state="lost")
    if rec.http_status is None:
        v.state = "lost"
        v.error = rec.transport_error or rec.ending
        return _nothing_sent(v, baseline)
    if rec.http_status != 200:
        msg = _readable_error(rec.error_body)
        if msg is None:
            v.state = "lost"
            v.error = f"HTTP {rec.http_status} without a readable error"
        else:
            v.state = "failed"
            v.finals = 1
            v.error = f"HTTP {rec.http_status}: {msg[:160]}"
        return _nothing_sent(v, baseline)

    s = read_stream(rec.events)
    v.finals = len(s.finish_reasons) + len(s.errors) + (1 if s.after_end else 0)
    if s.usage and "completion_tokens" in s.usage:
        v.usage_completion_tokens = int(s.usage["completion_tokens"])
    if s.malformed:
        v.notes.append(f"{s.malformed} malformed events")
    if s.errors:
        v.state = "failed"
        v.error = s.errors[0] or "SSE error event without a message"
        if not s.errors[0]:
            v.notes.append("error event without a message")
    elif rec.ending == "client_cancel" and not (s.done and s.finish_reasons):
        v.state = "cancelled"
        v.finals = max(v.finals, 1)
    elif s.done:
        v.state = "completed"
    elif rec.ending == "timeout":
        v.state = "lost"
        v.error = "client timeout"
    else:
        v.state = "truncated_200"
        v.error = rec.transport_error or "stream ended without [DONE] or an error event"
    if v.state == "completed" and not s.finish_reasons:
        v.notes.append("[DONE] without a finish_reason")
    if s.done > 1:
        v.finals += 1

    use_ids = bool(s.ids) and s.ids_complete and baseline is not None and baseline.token_ids is not None
    if use_ids:
        assert baseline is not None and baseline.token_ids is not None
        received: Sequence[Any] = s.ids
        expected: Sequence[Any] = baseline.token_ids
        v.token_unit = "token"
    else:
        received = "".join(s.texts)
        expected = baseline.text if baseline is not None else ""
        v.token_unit = "char"
    v.received = len(s.ids) if use_ids else len(s.texts)
    text = "".join(s.texts)
    if baseline is not None:
        partial = v.state != "completed"
        v.duplicated, v.missing, v.mismatched = align(expected, received, partial=partial)
        if partial and v.state != "cancelled":  # the harness's drop asked for no more; anything else owes it
            v.missing_tail = align(expected, received, partial=False)[1] - v.missing
            v.missing += v.missing_tail
        v.text_ok = text == baseline.text if not partial else baseline.text.startswith(text)
        if not v.text_ok:
            at = next((i for i, (a, b) in enumerate(zip(text, baseline.text, strict=False)) if a != b),
                      min(len(text), len(baseline.text)))
            v.notes.append(f"text differs at char {at}: got {text[max(0, at - 10):at + 10]!r}, "
                           f"baseline {baseline.text[max(0, at - 10):at + 10]!r}")
    if v.state == "completed":
        n = len(s.ids) if use_ids else None
        if v.usage_completion_tokens is not None and n is not None and v.usage_completion_tokens != n:
            v.usage_ok = False
            v.notes.append(f"usage says {v.usage_completion_tokens} tokens, stream had {n}")
        if v.usage_completion_tokens is not None and v.usage_completion_tokens != rec.expected_tokens:
            v.usage_ok = False
            v.notes.append(f"usage says {v.usage_completion_tokens} tokens, expected {rec.expected_tokens}")
    return v


@dataclass
class LedgerSummary:
    sent: int = 0
    accepted: int = 0
    completed: int = 0
    failed: int = 0
    failed_before_stream: int = 0
    cancelled: int = 0
    lost: int = 0
    truncated_200s: int = 0
    multiple_finals: int = 0
    duplicated_tokens: int = 0
    missing_tokens: int = 0
    """Absent tokens, the untransmitted tails of requests that did not complete included."""
    missing_tail_tokens: int = 0
    """Of ``missing_tokens``: those tails (failed, cut or lost requests; never a client drop)."""
    mismatched_tokens: int = 0
    token_unit: str = "token"
    text_mismatches: int = 0
    stream_usage_mismatches: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.truncated_200s or self.multiple_finals or self.duplicated_tokens
                    or self.missing_tokens or self.mismatched_tokens or self.text_mismatches
                    or self.stream_usage_mismatches)


MAX_VIOLATIONS_SHOWN = 20


class Ledger:
    """Every request the harness sent, with its prompt's baseline."""

    def __init__(self, baselines: Sequence[Baseline | None] = ()) -> None:
        self.baselines = list(baselines)
        self.records: list[RequestRecord] = []

    def add(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    def verdicts(self) -> list[Verdict]:
        out = []
        for rec in self.records:
            base = self.baselines[rec.prompt] if 0 <= rec.prompt < len(self.baselines) else None
            out.append(judge(rec, base))
        return out

    def check(self) -> tuple[LedgerSummary, list[Verdict]]:
        verdicts = self.verdicts()
        s = LedgerSummary(sent=len(verdicts))
        units: Counter[str] = Counter()
        errs: Counter[str] = Counter()
        for rec, v in zip(self.records, verdicts, strict=True):
            if rec.http_status == 200 and rec.request_id:
                s.accepted += 1
            if v.state == "completed":
                s.completed += 1
            elif v.state == "failed":
                s.failed += 1
                if rec.http_status != 200:
                    s.failed_before_stream += 1
            elif v.state == "cancelled":
                s.cancelled += 1
            elif v.state == "lost":
                s.lost += 1
            elif v.state == "truncated_200":
                s.truncated_200s += 1
            if v.error:
                errs[v.error[:120]] += 1
            if v.finals > 1:
                s.multiple_finals += 1
            s.duplicated_tokens += v.duplicated
            s.missing_tokens += v.missing
            s.missing_tail_tokens += v.missing_tail
            s.mismatched_tokens += v.mismatched
            if not v.text_ok:
                s.text_mismatches += 1
            if not v.usage_ok:
                s.stream_usage_mismatches += 1
            if v.received:
                units[v.token_unit] += 1
            bad = (v.state in ("lost", "truncated_200") or v.finals > 1 or v.duplicated or v.missing
                   or v.mismatched or not v.text_ok or not v.usage_ok)
            if bad and len(s.violations) < MAX_VIOLATIONS_SHOWN:
                s.violations.append({"seq": v.seq, "request_id": v.request_id, "state": v.state, "finals": v.finals,
                                     "duplicated": v.duplicated, "missing": v.missing,
                                     "missing_tail": v.missing_tail, "mismatched": v.mismatched,
                                     "text_ok": v.text_ok, "error": v.error, "notes": v.notes})
        s.token_unit = "token" if not units.get("char") else ("char" if not units.get("token") else "mixed")
        s.errors = dict(errs.most_common(10))
        return s, verdicts
