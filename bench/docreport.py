"""``baton bench report``: the tables of ``docs/benchmarks.md`` written from the committed JSON results.

A generated block in the document sits between ``<!-- report:NAME -->`` and ``<!-- /report -->``; NAME is
the JSON beside the document (``docs/bench-NAME.json``) and picks the renderer (the JSON's ``benchmark``
field). Everything inside a block is this module's output, byte for byte, so a figure in such a block
always comes from a result that says where it came from (its ``provenance``: commit, command, machine,
load). :func:`check` is what the test suite runs: the document must equal :func:`render_document`'s
output for the committed JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOCK = re.compile(r"(<!-- report:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)


def _num(v: Any, digits: int = 1) -> str:
    if not isinstance(v, int | float):
        return "n/a"
    return f"{v:,.{digits}f}"


def _met(ok: Any) -> str:
    return "yes" if ok else "**no**"


def _provenance(d: dict[str, Any], json_name: str) -> str:
    p = d.get("provenance") or {}
    machine = p.get("machine") or {}
    start, end = p.get("start") or {}, p.get("end") or {}
    load = start.get("loadavg") or [None]
    load_end = end.get("loadavg") or [None]
    commit = (p.get("commit") or "unknown")[:7] + (" (uncommitted changes)" if p.get("dirty") else "")
    cmd = " ".join(p.get("command") or [])
    return (f"From [`{json_name}`]({json_name}): commit `{commit}`, {start.get('time', '?')}, "
            f"{machine.get('cpus', '?')} cores ({machine.get('cpu_model', '?')}), "
            f"{machine.get('memory_gib', '?')} GiB, load average {_num(load[0], 2)} at the start and "
            f"{_num(load_end[0], 2)} at the end; `{cmd}`.\n")


def _idle(d: dict[str, Any]) -> str:
    rows = ["| process | share of one core |", "|---|---|"]
    procs = d["processes"]
    for r in procs[:15]:
        name = r["process"]
        name = name.rsplit("/", 1)[1] if name.startswith("/") and " " not in name else name  # a binary's path
        rows.append(f"| `{name}` | {100 * r['core_share']:.1f}% |")
    if len(procs) > 15:
        rest = sum(r["core_share"] for r in procs[15:])
        rows.append(f"| {len(procs) - 15} other processes | {100 * rest:.1f}% |")
    rows.append(f"| **whole stack** | **{100 * d['stack_core_share']:.1f}%** |")
    t = d["targets"]
    e, s = t["engine_core_share"], t["stack_core_share"]
    return ("\n".join(rows) + "\n\n"
            f"Targets: each engine <= {100 * e['target']:g}% (measured {100 * e['measured']:.1f}%, met: "
            f"{_met(e['met'])}), whole stack <= {100 * s['target']:g}% ({100 * s['measured']:.1f}%, met: "
            f"{_met(s['met'])}).\n")


def _table(cols: list[str], cells: list[str]) -> str:
    """A one-row Markdown table."""
    return f"| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n| {' | '.join(cells)} |\n"


def _ingest(d: dict[str, Any]) -> str:
    c = d["config"]
    return _table(
        ["outcomes", "outage", "records/s (outage excluded)", "overall/s", "lost", "duplicated",
         "failed flushes (retried)", "target", "met"],
        [f"{c['records']:,}", f"{c['outage_s']:g} s", f"**{_num(d['records_per_s'], 0)}**",
         _num(d["overall_per_s"], 0), str(d["lost"]), str(d["duplicated"]), str(d["failed_flushes"]),
         f">= {d['target']['records_per_s']:,}/s, 0 lost", _met(d["met"])])


def _ratelimit(d: dict[str, Any]) -> str:
    c, lat = d["config"], d["latency_ms"]
    return _table(
        ["processes", "in flight each", "decisions", "decisions/s", "latency p50", "p99", "target", "met"],
        [str(c["processes"]), str(c["concurrency"]), f"{d['decisions']:,}", f"**{_num(d['decisions_per_s'], 0)}**",
         f"{_num(lat['p50'], 2)} ms", f"{_num(lat['p99'], 2)} ms", f">= {d['target']['decisions_per_s']:,}/s",
         _met(d["met"])])


def _revoke(d: dict[str, Any]) -> str:
    c, s = d["config"], d["seen_by_all_ms"]
    return _table(
        ["gateway processes", "revocations", "seen by all: p50", "p99", "max", "missed", "target", "met"],
        [str(c["gateways"]), str(c["revocations"]), f"{_num(s['p50'])} ms", f"**{_num(s['p99'])} ms**",
         f"{_num(s['max'])} ms", str(d["missed"]), f"p99 < {d['target']['p99_ms']:g} ms", _met(d["met"])])


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "idle": _idle, "ingest": _ingest, "ratelimit": _ratelimit, "revoke": _revoke,
}


def render_block(name: str, docs_dir: Path) -> str:
    """The body of block ``name``: its table and where its figures come from."""
    json_name = f"bench-{name}.json"
    data = json.loads((docs_dir / json_name).read_text())
    kind = data.get("benchmark", name)
    if kind not in RENDERERS:
        raise ValueError(f"no renderer for a {kind!r} result ({json_name})")
    if not isinstance(data.get("provenance"), dict):
        raise ValueError(f"{json_name} has no provenance: its figures cannot be shown")
    return RENDERERS[kind](data) + "\n" + _provenance(data, json_name)


def render_document(text: str, docs_dir: Path) -> str:
    """``text`` with every report block rewritten from its JSON."""
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group("name"), docs_dir) + m.group(4), text)


def blocks(text: str) -> list[str]:
    return [m.group("name") for m in BLOCK.finditer(text)]


def write(doc: Path) -> bool:
    """Rewrites ``doc``'s blocks; True if anything changed."""
    text = doc.read_text()
    out = render_document(text, doc.parent)
    if out != text:
        doc.write_text(out)
    return out != text


def check(doc: Path) -> list[str]:
    """The blocks of ``doc`` that differ from their JSON (empty: in sync)."""
    text = doc.read_text()
    return [name for m in BLOCK.finditer(text)
            if m.group("body") != render_block((name := m.group("name")), doc.parent)]
