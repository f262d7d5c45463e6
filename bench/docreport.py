"""``baton bench report``: the tables of ``docs/benchmarks.md`` written from the committed JSON results.

A generated block in the document sits between ``<!-- report:NAME -->`` and ``<!-- /report -->``; NAME is
the JSON beside the document (``docs/bench-NAME.json``; ``docs/NAME.json`` for a chaos run, NAME
``chaos-...``) and the JSON's ``benchmark`` field picks the renderer (NAME does for older results without
one): ``serve``, ``gateway``, ``handoff``, ``pd``, ``path``, ``recovery``, ``chaos``, ``idle``, ``ingest``,
``ratelimit``, ``revoke``, ``fairness``, ``batch``. Everything inside a block is this module's output, byte for byte,
so a figure in such a block always comes from a result that says where it came from (its ``provenance``:
commit, command, machine, load). :func:`check` is what the test suite runs: the document must equal
:func:`render_document`'s output for the committed JSON.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from baton.bench.path import HOPS

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


def _rows(cols: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    return f"| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n" + "".join(f"| {' | '.join(r)} |\n" for r in rows)


def _table(cols: list[str], cells: list[str]) -> str:
    """A one-row Markdown table."""
    return _rows(cols, [cells])


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


# -- helpers of the request-level benchmarks (serve, gateway, pd, path, ...) ------------------------------


def _signed(v: Any, digits: int = 1) -> str:
    if not isinstance(v, int | float):
        return "n/a"
    return f"{v:+,.{digits}f}"


def _ms(stat: dict[str, Any] | None, key: str, digits: int = 1) -> str:
    """One figure of a :func:`baton.bench.stats.describe` block (``{"p50": ..., "p99": ...}``)."""
    return _num((stat or {}).get(key), digits)


def _pct(share: Any) -> str:
    """A share (0..1) as a percentage."""
    return f"{100 * share:.0f}%" if isinstance(share, int | float) else "n/a"


def _rate(v: Any) -> str:
    """An offered request rate: a number, or ``inf`` (a string in the JSON)."""
    return f"{v:g}" if isinstance(v, int | float) else str(v)


def _div(a: Any, b: Any, scale: float = 1.0) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return a / b * scale


def _span(p50: Any, worst: Any, digits: int) -> str:
    """``p50 s / max s`` (seconds), or n/a."""
    if not isinstance(p50, int | float) and not isinstance(worst, int | float):
        return "n/a"
    return f"{_num(p50, digits)} s / {_num(worst, digits)} s"


def _okfail(s: dict[str, Any]) -> str:
    return f"{s['completed']}/{s['failed']}"


def _slo(slo: dict[str, Any]) -> str:
    return ", ".join(f"{name} <= {ms:g} ms" for name, ms in slo.items())


def _verdict(measured: Any, target: float, *, at_most: bool = True) -> str:
    """Whether ``measured`` meets a target the result states without a verdict of its own."""
    if not isinstance(measured, int | float):
        return "n/a"
    return _met(measured <= target if at_most else measured >= target)


def _judged(targets: dict[str, Any]) -> str:
    """A result's ``targets`` block (``{name: {"measured", "target", "met"}}``) as a table."""
    rows = [[f"`{name}`", _num(r["measured"], 2), f"{r['target']:g}", "n/a" if r["met"] is None else _met(r["met"])]
            for name, r in targets.items()]
    return _rows(["target", "measured", "limit", "met"], rows) if rows else ""


# -- baton bench serve -----------------------------------------------------------------------------------


def _serve(d: dict[str, Any]) -> str:
    c = d["config"]
    rows = [[_rate(r["request_rate"]), _okfail(r), _num(r["request_throughput"], 2), _num(r["output_throughput"], 0),
             _ms(r["ttft_ms"], "p50"), _ms(r["ttft_ms"], "p99"), _ms(r["tpot_ms"], "p50", 2),
             _ms(r["tpot_ms"], "p99", 2),
             _ms(r["itl_ms"], "p50", 3), _ms(r["itl_ms"], "p99", 3), _ms(r["e2el_ms"], "p50"),
             f"{_num(r['goodput'], 2)} req/s ({_pct(r.get('goodput_fraction'))})" if "goodput" in r else "n/a"]
            for r in d["runs"]]
    conc = f", at most {c['max_concurrency']} in flight" if c.get("max_concurrency") else ""
    head = (f"`{c['model']}`, dataset `{c['dataset']}`, {c['input_len']:,} prompt tokens, {c['output_len']} output "
            f"tokens, {c['num_prompts']} requests per rate{conc}; ms:\n\n")
    slo = next((r["slo_ms"] for r in d["runs"] if r.get("slo_ms")), None)
    tail = f"\nGoodput counts requests within the SLO ({_slo(slo)}); a failed request is a miss.\n" if slo else ""
    return head + _rows(["rate (req/s)", "ok/fail", "req/s", "output tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                         "TPOT p99", "ITL p50", "ITL p99", "E2E p50", "goodput (within SLO)"], rows) + tail


# -- baton bench gateway ---------------------------------------------------------------------------------


def _gateway(d: dict[str, Any]) -> str:
    c, rounds = d["config"], d.get("rounds") or []
    parts = [_gateway_upstream(c)]
    for r in rounds:
        parts.append(f"Concurrency {r['concurrency']}, {r['requests_per_arm']:,} requests per arm ({c['input_len']} "
                     f"prompt tokens, {c['output_len']} output tokens each), ms:\n\n" + _gateway_round(r)
                     + _gateway_ratios(r.get("ratios") or {}))
    if d.get("throughput"):
        parts.append(f"Throughput at concurrency {c['throughput_concurrency']}:\n\n"
                     + _gateway_throughput(d["throughput"]))
    if d.get("per_token"):
        parts.append(_gateway_per_token(d["per_token"]))
    parts.append(_gateway_targets(d.get("headline") or {}, rounds, latency=c["upstream"] == "zero"))
    return "\n".join(p for p in parts if p)


def _gateway_upstream(c: dict[str, Any]) -> str:
    if c["upstream"] != "zero":
        at = f" at {c['engine_url']}" if c.get("engine_url") else ""
        return f"Upstream: a vLLM engine (`{c['model_dir']}`{at}).\n"
    if c.get("stub_batched"):
        how = " (each stream written whole: the ITL figures time the client's parser, not the relay)"
    elif isinstance(c.get("stub_token_gap_ms"), int | float):
        how = f" (each token its own write, {c['stub_token_gap_ms']:g} ms apart)"
    else:
        how = ""
    return f"Upstream: the zero-latency stub{how}.\n"


def _gateway_round(r: dict[str, Any]) -> str:
    rows = []
    for name, a in r["arms"].items():
        add = r["added"].get(name)
        added = ([_signed(add["ttft_ms"]["p50"]), _signed(add["ttft_ms"]["p99"]), _signed(add["itl_ms"]["p50"], 3),
                  _signed(add["itl_ms"]["p99"], 3)] if add else [""] * 4)
        cpu = a.get("proxy_cpu_ms_per_request")
        rows.append([name, _okfail(a), _ms(a["ttft_ms"], "p50", 2), _ms(a["ttft_ms"], "p99", 2),
                     _ms(a["itl_ms"], "p50", 3), _ms(a["itl_ms"], "p99", 3), *added,
                     "" if cpu is None else f"{_num(cpu, 2)} ms"])
    return _rows(["arm", "ok/fail", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "added TTFT p50", "added TTFT p99",
                  "added ITL p50", "added ITL p99", "proxy CPU / request"], rows)


def _gateway_ratios(ratios: dict[str, Any]) -> str:
    lines = []
    for name, v in ratios.items():
        if name.endswith("_over_litellm"):
            lines.append(f"{name.removesuffix('_over_litellm')} / LiteLLM: added TTFT p50 {_num(v['ttft_p50'], 2)}, "
                         f"p99 {_num(v['ttft_p99'], 2)}, added E2E p50 {_num(v['e2el_p50'], 2)}, CPU per request "
                         f"{_num(v['cpu_per_request'], 2)}.")
        elif name == "flow_control_overhead":
            lines.append(f"Flow control on minus off (nothing queues at concurrency 1): added TTFT p50 "
                         f"{_signed(v['ttft_p50_ms'], 2)} ms, E2E p50 {_signed(v['e2el_p50_ms'], 2)} ms, CPU "
                         f"{_signed(v['cpu_ms_per_request'], 2)} ms per request (64 requests: the CPU clock's "
                         "10 ms tick makes this one coarse; the throughput table's requests per CPU-second are "
                         "the finer figure).")
        elif name == "libraries":
            what = {"baton-httpx": "httpx for upstream calls", "baton-redispy": "redis-py (hiredis) for admission",
                    "baton-otelsdk": "OpenTelemetry's OTLP exporter"}
            for arm, lib in v.items():
                lines.append(f"{what.get(arm, arm)} (`{arm}`) against Baton's own part (`{lib['against']}`): CPU "
                             f"{_num(lib['cpu_ms_per_request'], 2)} ms per request against "
                             f"{_num(lib['hand_written_cpu_ms_per_request'], 2)} ({_num(lib['cpu_ratio'], 2)}x), "
                             f"added TTFT p50 {_signed(lib['added_ttft_p50_ms'], 2)} ms against "
                             f"{_signed(lib['hand_written_added_ttft_p50_ms'], 2)} ms.")
        elif name == "tracing_overhead":
            lines.append(f"Tracing on minus off: added TTFT p50 {_signed(v['ttft_p50_ms'], 2)} ms, E2E p50 "
                         f"{_signed(v['e2el_p50_ms'], 2)} ms, CPU {_signed(v['cpu_ms_per_request'], 2)} ms "
                         "per request.")
    return "\n" + "\n\n".join(lines) + "\n" if lines else ""


def _gateway_throughput(tp: dict[str, Any]) -> str:
    rows = [[name, f"{a['completed']:,}/{a['requests']:,}", _num(a["requests_per_s"], 0),
             "" if a.get("proxy_cpu_s") is None else _num(a.get("requests_per_cpu_s"), 0),
             "" if a.get("rss_mb") is None else f"{_num(a['rss_mb'], 0)} MB", _ms(a["ttft_ms"], "p50"),
             _ms(a["ttft_ms"], "p99")] for name, a in tp.items()]
    return _rows(["arm", "ok/sent", "req/s", "req per proxy CPU-second", "proxy RSS", "TTFT p50", "TTFT p99"], rows)


def _gateway_per_token(pt: dict[str, Any]) -> str:
    short, long = pt["lengths"]
    rows = [[name, f"{a['requests']:,}", f"{_num(a['cpu_ms_per_request'][str(short)], 3)} ms",
             f"{_num(a['cpu_ms_per_request'][str(long)], 3)} ms", f"{_num(a['cpu_ms_per_token'], 4)} ms"]
            for name, a in pt.items() if isinstance(a, dict)]
    return (f"CPU per relayed token (concurrency {pt['concurrency']}; the same requests with {short} and {long} "
            f"output tokens, the difference over the {long - short} extra tokens):\n\n"
            + _rows(["arm", "requests per length", f"CPU / request, {short} token", f"CPU / request, {long} tokens",
                     "CPU / token"], rows))


def _gateway_target_rows(h: dict[str, Any], *, latency: bool = True) -> list[list[str]]:
    """``[figure, target, measured, met]`` of a gateway result's headline. The added-latency targets are
    the proxies' own, judged against the zero-latency upstream (``latency``); in front of an engine, whose
    own TTFT varies by more than a proxy adds, only the CPU figures are."""
    t, ratios, rows = (h.get("targets") or {}) if latency else {}, h.get("ratios") or {}, []
    for arm in ("baton", "baton-notrace"):
        a, lite = h.get(arm), ratios.get(f"{arm}_over_litellm")
        for key, what, digits in (("added_ttft_p50_ms", "added TTFT p50", 2),
                                  ("added_ttft_p99_ms", "added TTFT p99", 2), ("added_itl_p50_ms", "added ITL p50", 3)):
            if a and key in t:
                rows.append([f"{arm}: {what}", f"<= {t[key]:g} ms", f"{_signed(a[key], digits)} ms",
                             _verdict(a[key], t[key])])
        if lite and "baton_over_litellm" in t:
            rows.append([f"{arm} / LiteLLM, added TTFT p50", f"<= {t['baton_over_litellm']:g}",
                         _num(lite["ttft_p50"], 2), _verdict(lite["ttft_p50"], t["baton_over_litellm"])])
    tp = h.get("throughput") or {}
    tt = tp.get("targets") or {}
    if "requests_per_cpu_s" in tt:
        cps = tp["requests_per_cpu_s"]
        rows.append(["baton: requests per gateway CPU-second", f">= {tt['requests_per_cpu_s']:,}", _num(cps, 0),
                     _verdict(cps, tt["requests_per_cpu_s"], at_most=False)])
    if "rss_mb" in tt:
        rows.append(["baton: gateway RSS", f"<= {tt['rss_mb']:g} MB", f"{_num(tp['rss_mb'], 0)} MB",
                     _verdict(tp["rss_mb"], tt["rss_mb"])])
    if "workers_over_one" in tt:
        rows.append([f"baton: req/s of {tp['workers']} worker processes / one", f">= {tt['workers_over_one']:g}",
                     _num(tp["workers_over_one"], 2), _verdict(tp["workers_over_one"], tt["workers_over_one"],
                                                               at_most=False)])
    pt = h.get("per_token") or {}
    for arm in ("baton", "baton-notrace"):
        per = (pt.get("cpu_ms_per_token") or {}).get(arm)
        if per is not None:
            rows.append([f"{arm}: CPU per relayed token", f"<= {pt['target']:g} ms", f"{_num(per, 4)} ms",
                         _verdict(per, pt["target"])])
    return rows


def _gateway_targets(h: dict[str, Any], rounds: list[dict[str, Any]], *, latency: bool) -> str:
    """The headline (the concurrency-1 round, or the first, and the throughput phase) against its targets."""
    rows = _gateway_target_rows(h, latency=latency)
    if not rows:
        return ""
    first = rounds[0]["concurrency"] if rounds else "?"
    conc = next((r["concurrency"] for r in rounds if r["concurrency"] == 1), first)
    return (f"Targets (latency at concurrency {conc}):\n\n"
            + _rows(["figure", "target", "measured", "met"], rows))


# -- baton bench handoff, baton bench pd -----------------------------------------------------------------


def _handoff(d: dict[str, Any]) -> str:
    t, mem, rows, judged = d.get("target") or {}, d["memcpy"], [], []
    for s in d["shapes"]:
        for r in s["by_length"]:
            at = bool(t) and r["prompt_len"] >= t["prompt_len_min"]
            met = _verdict(r["efficiency"], t["efficiency"], at_most=False) if at else ""
            judged += [met] if at else []
            rows.append([s["shape"], f"{r['prompt_len']:,}", _num(_div(r["kv_bytes"], 1e6), 2),
                         _num(r["nixl_xfer_ms"], 3), _num(r["ideal_memcpy_ms"], 3), _num(r["efficiency"], 2),
                         _num(_div(r["kv_bytes"], r["nixl_xfer_ms"], 1e-6), 1), _num(r["failed_transfers"], 0),
                         f">= {t['efficiency']:g}" if at else "", met])
    kv = ", ".join(f"`{s['shape']}` {s['kv_bytes_per_token']:,} B of KV per token" for s in d["shapes"])
    head = (f"memcpy {_num(mem['best_GBps'], 2)} GB/s best ({_num(mem['median_GBps'], 2)} median), link setting "
            f"{_num(d['link_bandwidth_GBps'], 1)} GB/s; {kv}. Medians of {d['config']['repeats']} requests per length "
            "(ms; efficiency = ideal / NIXL transfer):\n\n")
    tail = (f"\nTarget: efficiency >= {t['efficiency']:g} from {t['prompt_len_min']:,} prompt tokens: met in "
            f"{judged.count('yes')} of {len(judged)} rows.\n" if t else "")
    return head + _rows(["shape", "prompt tokens", "KV MB", "NIXL transfer", "ideal (memcpy)", "efficiency",
                         "effective GB/s", "failed transfers", "target", "met"], rows) + tail


def _pd(d: dict[str, Any]) -> str:
    c, rows = d["config"], []
    for arm, runs in d["arms"].items():
        for r in runs:
            s, lg = r["by_kind"]["short"], r["by_kind"]["long"]
            rows.append([arm, _rate(r["request_rate"]), _okfail(r), _ms(r["ttft_ms"], "p50"), _ms(r["ttft_ms"], "p90"),
                         _ms(r["ttft_ms"], "p99"), _ms(r["tpot_ms"], "p90", 2), _ms(r["itl_ms"], "p99", 2),
                         _ms(s["itl_ms"], "p99", 2), _ms(s["ttft_ms"], "p90"), _ms(lg["ttft_ms"], "p90"),
                         f"{_num(r.get('goodput'), 2)} req/s", _pct(r.get("goodput_fraction")), _kv_reads(r.get("kv"))])
    head = (f"{c['num_prompts']} requests per arm and rate, {_pct(c['long_fraction'])} with {c['long_len']:,}-token "
            f"prompts, the rest {c['short_len']:,}, {c['output_len']} output tokens; SLO {_slo(d['slo_ms'])} "
            "(failures are misses); ms:\n\n")
    return head + _rows(["arm", "rate", "ok/fail", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p90", "ITL p99",
                         "short-prompt ITL p99", "short TTFT p90", "long TTFT p90", "goodput", "within SLO",
                         "KV reads (failed, lease expired)"], rows) + _pd_prediction(d.get("prediction") or {}, c)


def _kv_reads(kv: dict[str, int] | None) -> str:
    """A P/D run's KV reads on the decode engine (results from before they were counted have none)."""
    if not kv:
        return ""
    return f"{kv['transfers']:,} ({kv['failed_transfers']:,}, {kv['expired_leases']:,})"


def _pd_prediction(pred: dict[str, Any], c: dict[str, Any]) -> str:
    if not pred:
        return ""
    if "error" in pred:
        return f"\nPlanner: {pred['error']}.\n"
    hw, pct = pred.get("hardware") or {}, f"p{c.get('slo_percentile', 90):g}"
    rows = [[_rate(row["request_rate"]), name, _num(k["goodput_two_cores"], 2), _ms(k.get("at_rate"), "ttft_ms"),
             _ms(k.get("at_rate"), "tpot_ms", 2), "n/a" if not k.get("at_rate") else _met(k["at_rate"]["ok"]),
             "**yes**" if name == row["recommended"] else ""]
            for row in pred.get("by_rate", []) for name, k in row["configs"].items()]
    head = (f"\nPlanner ({'calibrated' if pred.get('calibrated') else 'not calibrated'}: prefill "
            f"{_num(hw.get('prefill_tokens_per_s'), 0)} tokens/s, decode step {_num(hw.get('decode_step_ms'), 1)} ms):"
            "\n\n")
    return head + _rows(["rate", "configuration", "max goodput on 2 cores (req/s)", f"predicted TTFT {pct}",
                         "predicted TPOT", "within SLO", "recommended"], rows)


# -- baton bench path ------------------------------------------------------------------------------------


def _path(d: dict[str, Any]) -> str:
    c1 = d["concurrency"].get("1", {})
    parts = [_path_latency(d["concurrency"]), _path_saturation(d), _path_hops(c1, d["arms"]),
             _path_cpu(d.get("cpu_ms_per_request_c1") or {}), _judged(d.get("targets") or {})]
    return "\n".join(p for p in parts if p)


def _path_latency(by_conc: dict[str, Any]) -> str:
    rows = [[conc, arm, _okfail(e["summary"]), _ms(e["summary"]["ttft_ms"], "p50", 2),
             _ms(e["summary"]["ttft_ms"], "p99", 2), _signed(e.get("added_ttft_p50_ms"), 2),
             _ms(e["summary"]["itl_ms"], "p50", 2), _ms(e["summary"]["itl_ms"], "p99", 2),
             _num(e.get("itl_p50_ratio"), 2)] for conc, block in by_conc.items() for arm, e in block.items()]
    return _rows(["concurrency", "arm", "ok/fail", "TTFT p50", "TTFT p99", "added TTFT p50", "ITL p50", "ITL p99",
                  "ITL p50 / engine"], rows)


def _path_saturation(d: dict[str, Any]) -> str:
    vs = d.get("saturation_vs_engine") or {}
    rows = [[arm, _num(s["output_throughput"], 0), _num(vs.get(arm), 2)]
            for arm, s in (d.get("saturation") or {}).items()]
    return _rows(["arm", "output tok/s at saturation", "vs engine"], rows) if rows else ""


def _path_hops(c1: dict[str, Any], arms: list[str]) -> str:
    pd = [a for a in arms if c1.get(a, {}).get("hops_ms_median")]
    if not pd:
        return ""
    seen = {h for a in pd for h in c1[a]["hops_ms_median"]}
    hops = [h for h in HOPS if h in seen] + sorted(seen - set(HOPS))
    rows = [[h, *(_num(c1[a]["hops_ms_median"].get(h), 2) for a in pd)] for h in hops]
    rows.append(["**sum (= TTFT of the median request per hop)**",
                 *(_num(sum(c1[a]["hops_ms_median"].values()), 2) for a in pd)])
    return _rows(["hop (median ms, concurrency 1)", *pd], rows)


def _path_cpu(cpu: dict[str, dict[str, float]]) -> str:
    """CPU ms per request of the ten costliest processes, by arm."""
    if not cpu:
        return ""
    labels = list(dict.fromkeys(k for per in cpu.values() for k in per))
    top = sorted(labels, key=lambda k: -max(per.get(k, 0.0) for per in cpu.values()))[:10]
    rows = [[label, *(_num(per.get(label), 2) for per in cpu.values())] for label in top]
    rows.append(["**all processes**", *(_num(sum(per.values()), 2) for per in cpu.values())])
    return _rows(["CPU ms per request (concurrency 1)", *cpu], rows)


# -- baton bench recovery, baton chaos run ---------------------------------------------------------------


def _recovery(d: dict[str, Any]) -> str:
    c, trials, rows = d["config"], d.get("trials") or [], []
    for topo, arms in d["summary"].items():
        for arm, s in arms.items():
            ts = [t for t in trials if t["topology"] == topo and t["arm"] == arm]
            each = f" ({', '.join(_num(t.get('client_gap_ms')) for t in ts if t.get('resumed_after') is not None)})"
            rungs = Counter(str(t["rung"]) for t in ts)
            served = "; ".join(f"{rung}, {n} of {len(ts)}" for rung, n in rungs.items()) or ", ".join(s["rungs"])
            equal = _met(s["all_equal_undisturbed"]) + (
                f", {sum(bool(t['equal_undisturbed']) for t in ts)} of {len(ts)}" if ts else "")
            after = s.get("after_replacement_ratio_median")
            hit = s.get("kills_that_hit")
            if isinstance(hit, int) and hit < len(ts):
                each += f", {len(ts) - hit} of {len(ts)} kills missed the stream (not counted)"
            rows.append([topo, arm, f"{_num(s.get('client_gap_ms_median'))} ms{each}",
                         f"{_num(s.get('record_gap_ms_median'))} ms", f"{_num(s['fresh_ttft_ms_median'])} ms",
                         f"{_num(s['ratio_median'], 2)} ({_num(s['ratio_max'], 2)})", f"<= {s['target_ratio']:g}",
                         _verdict(s["ratio_median"], s["target_ratio"]),
                         f"{_num(after, 2)} ({_num(s.get('after_replacement_ratio_max'), 2)})",
                         _verdict(after, s.get("after_replacement_target", 1.5)), served, equal,
                         _met(s["all_completed"])])
    at = [t["victim"]["tokens_at_kill"] for t in trials if isinstance(t.get("victim", {}).get("tokens_at_kill"), int)]
    when = f" ({min(at)}-{max(at)} tokens had arrived)" if at else ""
    head = (f"A {c['prompt_len']:,}-token prompt, {c['max_tokens']:,} tokens, the decode replica killed once "
            f"{c['kill_after']} tokens reached the client and the engines' gauges named the replica serving the "
            f"stream{when}, {c['repeats']} kills per topology and arm. Gap = the longest "
            "wait between two tokens at the client from the last one before the kill on; ratio = that gap / a fresh "
            "TTFT; after the replacement = the first request's TTFT once Serve calls the pool whole again / a "
            "fresh TTFT (target <= 1.5); targets on the median"
            + (f"; the stall arm SIGSTOPs the decode replica instead (SIGCONT {_num(c.get('stall_s'), 0)} s later), "
               f"its target {_num(c.get('stall_itl_multiple'), 0)}x the undisturbed stream's ITL p99 plus a fresh "
               "TTFT, over a fresh TTFT" if any(t["arm"] == "stall" for t in trials) else "")
            + ":\n\n")
    return head + _rows(["topology", "arm", "largest client gap: median (each)", "the gateway's figure (median)",
                         "fresh TTFT (median)", "ratio median (max)", "target", "met",
                         "first after the replacement: ratio median (max)", "met", "rung that served",
                         "text = undisturbed", "all completed"], rows)


def _chaos(d: dict[str, Any]) -> str:
    fired = d.get("faults_fired") or {}
    n_fired, unmatched = sum(fired.values()), d.get("faults_unmatched")
    matched = n_fired - unmatched if isinstance(unmatched, int) else "n/a"
    rungs = (", ".join(d["prefill_rungs_seen"]) or "none") if "prefill_rungs_seen" in d else "n/a"
    cells = [f"{d['sent']:,}", f"{d['completed']:,}", str(d["failed"]), str(d["cancelled"]), str(d["lost"]),
             f"{d['duplicated_tokens']} / {d['missing_tokens']} / {d['mismatched_tokens']}", str(d["text_mismatches"]),
             f"{sum((d.get('faults_planned') or {}).values())} / {n_fired} / {matched}", rungs, _met(d["ok"])]
    load = d.get("load") or {}
    head = (f"Faults fired: {', '.join(f'{k} {n}' for k, n in fired.items()) or 'none'}; "
            f"{_num(load.get('seconds'), 0)} s of load, {load.get('concurrency', '?')} streams at all times "
            f"({_num(load.get('requests_per_s'), 2)} req/s):\n\n")
    invariants = _rows(["invariant", "holds"], [[f"`{k}`", _met(v)] for k, v in d["invariants"].items()])
    return (head + _table(["sent", "completed", "failed", "cancelled by the client", "lost",
                           "duplicated / missing / wrong tokens", "text mismatches",
                           "faults planned / fired / matched to a step", "prefill rungs seen", "ok"], cells)
            + "\n" + invariants + _chaos_recovery(d.get("recovery") or {}))


def _chaos_recovery(rec: dict[str, Any]) -> str:
    """Fault to the next token (worst stream per fault) and Ray's replacement of the replica, by fault kind."""
    ftn = {k: v for k, v in (rec.get("fault_to_next_token") or {}).items() if isinstance(v, dict) and "faults" in v}
    repl = rec.get("replacement_s") or {}
    rows = []
    for kind in dict.fromkeys([*ftn, *repl]):
        f, r = ftn.get(kind) or {}, repl.get(kind) or {}
        rows.append([kind, str(f.get("faults", r.get("count", ""))),
                     _span(_div(f.get("worst_stream_ms_p50"), 1000), _div(f.get("worst_stream_ms_max"), 1000), 2),
                     _span(r.get("p50"), r.get("max"), 1)])
    if not rows:
        return ""
    fresh = (f"\nFresh request TTFT p50 under the same load: {_num(rec.get('fresh_ttft_ms_p50'))} ms.\n"
             if "fresh_ttft_ms_p50" in rec else "")
    return "\n" + _rows(["fault", "faults", "fault to next token, worst stream: p50 / max",
                         "pool whole again after: p50 / max"], rows) + fresh


# -- baton bench fairness ----------------------------------------------------------------------------------


def _fairness_caption(phase: str, c: dict[str, Any]) -> str:
    """What the tenants of one phase sent (from the result's ``config``)."""
    dur = _rate(c.get("duration_s", "?"))
    if phase == "b_alone":
        return (f"`b_alone`: B alone, a {c.get('b_prompt_words', '?')}-word request (max_tokens "
                f"{c.get('b_max_tokens', '?')}) every {_rate(c.get('b_interval_s', '?'))} s, open loop, for {dur} s")
    if phase == "a_flood_b" and c.get("a_rate"):
        return (f"`a_flood_b`: A sends a {c.get('a_prompt_words', '?')}-word request (max_tokens "
                f"{c.get('a_max_tokens', '?')}) {_rate(c['a_rate'])} times a second, open loop, ignoring Retry-After, "
                f"from {_rate(c.get('lead_s', '?'))} s before B's {dur} s window; B as alone, in A's band")
    if phase == "a_flood_b":
        n = c.get("a_concurrency", "?")
        return (f"`a_flood_b`: A keeps {n} stream{'' if n == 1 else 's'} of {c.get('a_prompt_words', '?')} words "
                f"(max_tokens {c.get('a_max_tokens', '?')}) in flight, ignoring Retry-After, from "
                f"{_rate(c.get('lead_s', '?'))} s before B's {dur} s window; B as alone, in A's band")
    if phase == "bands":
        return (f"`bands`: {_band_streams(c)} streams of {c.get('band_prompt_words', '?')} words "
                f"(max_tokens {c.get('band_max_tokens', '?')}) in flight per tenant, Retry-After honoured, for {dur} s")
    if phase == "share":
        return (f"`share`: two tenants of weights 2 and 1 in one band, {c.get('share_concurrency', '?')} streams of "
                f"{c.get('share_prompt_words', '?')} words (max_tokens {c.get('share_max_tokens', '?')}) in flight "
                f"each, Retry-After honoured, for {dur} s")
    return f"`{phase}`"


def _fairness_tenants(tenants: dict[str, Any], policies: dict[str, Any]) -> str:
    rows = []
    for name, t in tenants.items():
        pol = (policies.get(name) or {}).get("policy") or {}
        c = t["status"]
        other = c.get("4xx", 0) + c.get("connection_error", 0) + c.get("stream_error", 0)
        ra = ("no 429" if not c["429"] else "yes" if t["retry_after_on_every_429"]
              else f"**no** ({t['429_without_retry_after']} without)")
        rows.append([name, str(pol.get("priority", "?")), f"{pol.get('weight', 1.0):g}",
                     "yes" if pol.get("sheddable") else "no", f"{t['sent']:,}", f"{t['completed']:,}", f"{c['200']:,}",
                     f"{c['429']:,}", f"{c['503']:,}", f"{c['5xx']:,}", f"{c['timeout']:,}", f"{other:,}", ra,
                     _ms(t["ttft_ms"], "p50"), _ms(t["ttft_ms"], "p90"), _ms(t["ttft_ms"], "p99"),
                     _num(t["tokens_per_s"], 1)])
    return _rows(["tenant", "priority", "weight", "sheddable", "sent", "completed", "200", "429", "503", "5xx",
                  "timeouts", "other errors", "Retry-After on every 429", "TTFT p50", "TTFT p90", "TTFT p99",
                  "tokens/s"], rows)


def _fairness_records(records: dict[str, Any]) -> str:
    """Each tenant's requests as Baton's own records saw them: the wait in the gateway's queue and the
    time to first token after it."""
    rows = [[name, f"{r['records']:,}", _ms(r["queue_ms"], "p50"), _ms(r["queue_ms"], "p99"),
             _ms(r["ttft_after_queue_ms"], "p50"), _ms(r["ttft_after_queue_ms"], "p99")]
            for name, r in records.items()]
    return ("\nThe same requests in Baton's request records (`GET /admin/v1/requests`), in ms: the wait in the "
            "gateway's flow-control queue, and the time to first token after it as the gateway timed it:\n\n"
            + _rows(["tenant", "records", "queue p50", "queue p99", "TTFT after the queue p50",
                     "TTFT after the queue p99"], rows))


def _fairness_bands(p: dict[str, Any]) -> str:
    share = p.get("token_share") or {}
    rows = [[name, str(a["priority"]), f"{a['ttft_ms']:g} ms", _num(a["attainment"], 3),
             _num(a.get("attainment_of_sent"), 3), _pct(share.get(name))]
            for name, a in (p.get("attainment") or {}).items()]
    if not rows:
        return ""
    return "\n" + _rows(["band", "priority", "TTFT target", "attainment (of completed)", "of sent",
                         "share of the tokens"], rows)


def _fairness_share(sh: dict[str, Any]) -> str:
    served = ", ".join(f"{name} (weight {(sh.get('weights') or {}).get(name, 1.0):g}) {_num(v, 0)}"
                       for name, v in (sh.get("weighted_tokens") or {}).items())
    err, wr = sh.get("error"), sh.get("weight_ratio")
    weights = f"{wr:g}" if isinstance(wr, int | float) else "n/a"
    return ("\nTokens as the gateway's fair share counts them (prompt + 2 x completion, from each stream's usage "
            f"report): {served}; ratio {_num(sh.get('ratio'), 2)} against the weights' {weights} "
            f"(error {_num(None if err is None else 100 * err, 1)}%).\n")


def _band_streams(c: dict[str, Any]) -> str:
    bands = c.get("bands") or []
    if bands and all(isinstance(b, dict) and b.get("streams") for b in bands):
        return " / ".join(f"{b['streams']} ({b.get('name', '?')})" for b in bands)
    return str(c.get("band_concurrency", "?"))


def _fairness(d: dict[str, Any]) -> str:
    c, phases, policies = d.get("config") or {}, d.get("phases") or {}, d.get("tenants") or {}
    parts = []
    for phase, p in phases.items():
        text = (_fairness_caption(phase, c) + "; TTFT in ms at the client:\n\n"
                + _fairness_tenants(p["tenants"], policies))
        if p.get("records"):
            text += _fairness_records(p["records"])
        if phase == "bands":
            text += _fairness_bands(p)
        if phase == "share" and p.get("share"):
            text += _fairness_share(p["share"])
        fault = d.get("fault")
        if phase == "a_flood_b" and isinstance(fault, dict):
            what = "killed" if fault.get("killed") else "not killed"
            text += (f"\nFault: a decode replica of `{fault.get('app', '?')}` SIGKILLed "
                     f"{_rate(fault.get('at_s', '?'))} s into the phase ({what}: {fault.get('detail', '?')}).\n")
        if phase != "b_alone" and isinstance(p.get("jain_index"), int | float):
            text += f"\nJain's index over the tenants' tokens/s divided by their weights: {_num(p['jain_index'], 3)}.\n"
        parts.append(text)
    parts.append("Against the targets:\n\n" + _rows(["figure", "target", "measured", "met"], _fairness_target_rows(d)))
    return "\n".join(parts)


def _fairness_target_rows(d: dict[str, Any]) -> list[list[str]]:
    """``[figure, target, measured, met]`` of a fairness result's targets (met ``n/a`` where a phase it
    needs did not run)."""
    t, der, phases = d.get("targets") or {}, d.get("derived") or {}, d.get("phases") or {}

    def met(key: str) -> str:
        m = (t.get(key) or {}).get("met")
        return "n/a" if m is None else _met(m)

    def limit(key: str, default: float) -> float:
        v = (t.get(key) or {}).get("target")
        return v if isinstance(v, int | float) else default

    rows = []
    alone, beside = der.get("b_ttft_p99_ms_alone"), der.get("b_ttft_p99_ms_beside_a")
    b_p99 = (f"{_num(beside)} ms / {_num(alone)} ms = {_num(der.get('b_ttft_p99_ratio'), 2)}"
             if isinstance(alone, int | float) or isinstance(beside, int | float) else "n/a")
    rows.append(["B's TTFT p99 beside A's flood / alone", f"<= {limit('b_ttft_p99_ratio', 1.5):g}", b_p99,
                 met("b_ttft_p99_ratio")])
    a = ((phases.get("a_flood_b") or {}).get("tenants") or {}).get("a")
    refused = " / ".join(str(a["status"][k]) for k in ("503", "5xx", "timeout")) if a else "n/a"
    rows.append(["A refused with 429 only: its 503 / 5xx / client timeouts", "0 / 0 / 0", refused,
                 met("a_never_5xx_or_timeout")])
    tenants = [x for p in phases.values() for x in (p.get("tenants") or {}).values()]
    n429 = sum(x["status"]["429"] for x in tenants)
    bare = sum(x["429_without_retry_after"] for x in tenants)
    rows.append(["every 429 with Retry-After", "all", f"{n429 - bare:,} of {n429:,}" if tenants else "n/a",
                 met("every_429_had_retry_after")])
    top = der.get("top_band")
    band = ((phases.get("bands") or {}).get("attainment") or {}).get(top) or {}
    within = f" with TTFT <= {band['ttft_ms']:g} ms" if "ttft_ms" in band else ""
    which = f" ({top}, priority {band['priority']})" if "priority" in band else ""
    rows.append([f"top band{which}: completed requests{within}",
                 f">= {limit('top_band_attainment', 0.99):g}", _num(der.get("top_band_attainment"), 3),
                 met("top_band_attainment")])
    err, wr = der.get("share_error"), der.get("share_weight_ratio")
    wr_text = f"{wr:g}" if isinstance(wr, int | float) else "2"
    rows.append(["share: weight-2 tenant's tokens / weight-1 tenant's (prompt + 2 x completion)",
                 f"within {100 * limit('share_within_10pct_of_weights', 0.10):g}% of {wr_text}",
                 f"{_num(der.get('share_ratio'), 2)} (error {_num(100 * err, 1)}%)" if err is not None
                 else _num(der.get("share_ratio"), 2),
                 met("share_within_10pct_of_weights")])
    return rows


def _batch_target_rows(d: dict[str, Any]) -> list[list[str]]:
    der, t = d.get("derived") or {}, (d.get("derived") or {}).get("targets") or {}
    rows = []
    if "ttft_p99_ratio" in der:
        rows.append(["an interactive tenant's TTFT p99 beside a batch / alone (same load)",
                     f"<= {t.get('ttft_p99_ratio', 1.1):g}", _num(der["ttft_p99_ratio"], 2),
                     _met(der.get("ttft_p99_ratio_met"))])
    if "batch_within_window" in der:
        b = d["beside"]["batch"]
        rows.append([f"a {b['input']:,}-line batch beside it ends within its window (24 h)", "completed",
                     f"{b['status']} in {_num(b['seconds'], 0)} s", _met(der["batch_within_window"])])
    if "slack_use" in der:
        rows.append(["a batch alone: lines per second / requests per second at saturation",
                     f">= {t.get('slack_use', 0.8):g}", _num(der["slack_use"], 2), _met(der.get("slack_use_met"))])
    if "kill_met" in der:
        k = d["kill"]
        rows.append([f"a gateway running lines SIGKILLed {len(k['kills_at_s'])} times: lines lost, duplicated; usage "
                     "rows = completed lines", "0, 0; equal", f"{k['lost']}, {k['duplicated']}; {k['usage_rows']} for "
                     f"{k['completed']}", _met(der["kill_met"])])
    return rows


def _batch(d: dict[str, Any]) -> str:
    c = d["config"]
    head = (f"Lines: a chat request of ~{c['line_words']} words and {c['line_max_tokens']} tokens each; interactive "
            f"tenant: a streamed request of ~20 words and 16 tokens every {c['interval_s']:g} s for "
            f"{c['window_s']:g} s, TTFT at the client:\n\n")
    rows = []
    for phase, label in (("alone", "interactive alone"), ("beside", "interactive beside the batch")):
        p = d.get(phase)
        if not p:
            continue
        s = p.get("interactive", p)
        ttft = s["ttft_ms"]
        rows.append([label, str(s["sent"]), str(s["completed"]), _num(ttft.get("p50")), _num(ttft.get("p90")),
                     _num(ttft.get("p99"))])
    table = _rows(["phase", "sent", "completed", "TTFT p50 ms", "p90", "p99"], rows) if rows else ""
    runs = []
    if "beside" in d:
        b = d["beside"]["batch"]
        runs.append(["beside the interactive load", f"{b['input']:,}", b["status"], f"{b['completed']:,} / "
                     f"{b['failed']:,}", _num(b["seconds"], 0), _num(b["lines_per_s"], 2),
                     f"{b['lost']}, {b['duplicated']}"])
    if "batch_alone" in d:
        b = d["batch_alone"]
        runs.append(["alone", f"{c['alone_lines']:,}", b["status"], f"{b['completed']:,} / {b['failed']:,}",
                     _num(b["seconds"], 0), _num(b["lines_per_s"], 2), "-"])
    if "kill" in d:
        k = d["kill"]
        att = k.get("attempts") or {}
        runs.append([f"a second gateway SIGKILLed at {', '.join(_num(x, 0) + ' s' for x in k['kills_at_s'])} "
                     f"({att.get('lines_run_again', 'n/a')} lines run again)", f"{k['input']:,}", k["status"],
                     f"{k['completed']:,} / {k['failed']:,}", _num(k["seconds"], 0), _num(k["lines_per_s"], 2),
                     f"{k['lost']}, {k['duplicated']}"])
    sat = d.get("saturation")
    tail = (f"\nAt saturation ({c['saturation_concurrency']} requests of a line's shape in flight for "
            f"{c['saturation_s']:g} s) the pool served {_num(sat['requests_per_s'], 2)} requests per second.\n"
            if sat else "")
    return (head + table + "\n" + _rows(["batch", "lines", "status", "completed / failed", "seconds", "lines/s",
                                          "lost, duplicated"], runs) + tail + "\n"
            + _rows(["figure", "target", "measured", "met"], _batch_target_rows(d)))


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "idle": _idle, "ingest": _ingest, "ratelimit": _ratelimit, "revoke": _revoke, "serve": _serve,
    "gateway": _gateway, "handoff": _handoff, "pd": _pd, "path": _path, "recovery": _recovery, "chaos": _chaos,
    "fairness": _fairness, "batch": _batch,
}
"""Renderer by the result's ``benchmark`` (by the block's name for older results without one); a ``chaos``
renderer also takes every name that starts with ``chaos`` (``chaos-20-kills``)."""


def _renderer(kind: str) -> Callable[[dict[str, Any]], str] | None:
    return RENDERERS.get(kind) or (RENDERERS["chaos"] if kind.startswith("chaos") else None)


def render(kind: str, data: dict[str, Any]) -> str:
    """The tables of one result of benchmark ``kind`` (without the provenance line)."""
    renderer = _renderer(kind)
    if renderer is None:
        raise ValueError(f"no renderer for a {kind!r} result")
    return renderer(data)


def json_name(name: str) -> str:
    """The JSON of block ``name``: ``bench-NAME.json``; ``NAME.json`` for a chaos run (``chaos-...``)."""
    return f"{name}.json" if name.startswith("chaos") else f"bench-{name}.json"


# -- the summary: every result's targets in one table ----------------------------------------------------


def _handoff_targets(d: dict[str, Any]) -> list[list[str]]:
    t = d.get("target") or {}
    if not t:
        return []
    out = []
    for s in d["shapes"]:
        effs = [r["efficiency"] for r in s["by_length"]
                if r["prompt_len"] >= t["prompt_len_min"] and isinstance(r["efficiency"], int | float)]
        if effs:
            out.append([f"KV handoff efficiency, `{s['shape']}` model, >= {t['prompt_len_min']:,} tokens",
                        f">= {t['efficiency']:g}", " - ".join(dict.fromkeys((_num(min(effs), 2), _num(max(effs), 2)))),
                        _met(min(effs) >= t["efficiency"])])
    return out


def _pd_targets(d: dict[str, Any]) -> list[list[str]]:
    """Whether the planner's recommendation is the arm that measured the higher goodput, rate by rate."""
    pred = d.get("prediction") or {}
    rows = []
    for row in pred.get("by_rate", []):
        measured = {arm: r.get("goodput") for arm, runs in d["arms"].items() for r in runs
                    if r["request_rate"] == row["request_rate"]}
        if len(measured) < 2 or not all(isinstance(v, int | float) for v in measured.values()):
            continue
        best = max(measured, key=lambda a: measured[a] or 0.0)
        said = "aggregated" if str(row["recommended"]).startswith("agg") else next(
            (a for a in measured if a != "aggregated"), "P/D")
        rows.append([f"planner's call at {_rate(row['request_rate'])} req/s (aggregated vs P/D)",
                     "the arm with more goodput", f"recommends {said}; measured best {best}", _met(said == best)])
    return rows


def _recovery_targets(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    for topo, arms in d["summary"].items():
        for arm, s in arms.items():
            fault = "a decode stall (SIGSTOP)" if arm == "stall" else "a decode kill"
            rows.append([f"recovery, {topo}, {arm}: largest client gap around {fault} / fresh TTFT (median)",
                         f"<= {s['target_ratio']:g}", _num(s["ratio_median"], 2),
                         _verdict(s["ratio_median"], s["target_ratio"])])
            if s.get("after_replacement_ratio_median") is not None:
                target = s.get("after_replacement_target", 1.5)
                rows.append([f"recovery, {topo}, {arm}: first request after the replacement / fresh TTFT (median)",
                             f"<= {target:g}", _num(s["after_replacement_ratio_median"], 2),
                             _verdict(s["after_replacement_ratio_median"], target)])
    return rows


def _chaos_targets(d: dict[str, Any]) -> list[list[str]]:
    tokens = d["duplicated_tokens"] + d["missing_tokens"] + d["mismatched_tokens"]
    return [["chaos drill: lost / failed requests, wrong tokens, text mismatches", "0 / 0 / 0 / 0",
             f"{d['lost']} / {d['failed']} / {tokens} / {d['text_mismatches']}",
             _met(d["lost"] == d["failed"] == tokens == d["text_mismatches"] == 0)],
            ["chaos drill: every invariant (each fault fired, matched to a recovery step, ...)", "all hold",
             f"{sum(bool(v) for v in d['invariants'].values())} of {len(d['invariants'])}", _met(d["ok"])]]


def _idle_targets(d: dict[str, Any]) -> list[list[str]]:
    t = d["targets"]
    return [[f"idle CPU, {what}", f"<= {100 * t[key]['target']:g}% of a core", f"{100 * t[key]['measured']:.1f}%",
             _met(t[key]["met"])] for key, what in (("engine_core_share", "each vLLM engine"),
                                                    ("stack_core_share", "the whole `baton up` stack"))]


def _path_targets(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, r in (d.get("targets") or {}).items():
        m, t = r["measured"], r["target"]
        # the result states no direction: the one its own verdict implies
        at_most = r["met"] is None or not isinstance(m, int | float) or r["met"] == (m <= t)
        rows.append([f"serving path: `{name}`", f"{'<=' if at_most else '>='} {t:g}", _num(m, 2),
                     "n/a" if r["met"] is None else _met(r["met"])])
    return rows


def _gateway_summary(d: dict[str, Any]) -> list[list[str]]:
    zero = d["config"]["upstream"] == "zero"
    where = "zero-latency" if zero else "vLLM engine"
    return [[f"gateway ({where} upstream), {r[0]}", *r[1:]]
            for r in _gateway_target_rows(d.get("headline") or {}, latency=zero)]


TARGETS: dict[str, Callable[[dict[str, Any]], list[list[str]]]] = {
    "gateway": _gateway_summary,
    "path": _path_targets,
    "idle": _idle_targets,
    "handoff": _handoff_targets,
    "pd": _pd_targets,
    "recovery": _recovery_targets,
    "chaos": _chaos_targets,
    "ingest": lambda d: [["usage records into Postgres, across a Postgres outage (0 lost)",
                          f">= {d['target']['records_per_s']:,}/s",
                          f"{_num(d['records_per_s'], 0)}/s, {d['lost']} lost", _met(d["met"])]],
    "ratelimit": lambda d: [["rate-limit decisions on one Redis", f">= {d['target']['decisions_per_s']:,}/s",
                             f"{_num(d['decisions_per_s'], 0)}/s", _met(d["met"])]],
    "revoke": lambda d: [["key revocation seen by every gateway process, p99", f"< {d['target']['p99_ms']:g} ms",
                          f"{_num(d['seen_by_all_ms']['p99'])} ms", _met(d["met"])]],
    "fairness": lambda d: [[f"flow control: {row[0]}", *row[1:]] for row in _fairness_target_rows(d)
                           if row[3] != "n/a"],
    "batch": lambda d: [[f"Batch API: {row[0]}", *row[1:]] for row in _batch_target_rows(d)],
}
"""The target rows (``[figure, target, measured, met]``) of a result, by its benchmark."""

#: The results the summary reads, in the order of the document (those present).
SUMMARY = ("gateway-zero", "gateway-engine", "path", "idle", "handoff", "pd", "recovery", "chaos-default-topology",
           "ingest", "ratelimit", "revoke", "fairness", "batch")


def _load(name: str, docs_dir: Path) -> tuple[str, dict[str, Any]]:
    jname = json_name(name)
    data = json.loads((docs_dir / jname).read_text())
    kind = data.get("benchmark", name)
    if _renderer(kind) is None:
        raise ValueError(f"no renderer for a {kind!r} result ({jname})")
    if not isinstance(data.get("provenance"), dict):
        raise ValueError(f"{jname} has no provenance: its figures cannot be shown")
    return kind, data


def render_summary(docs_dir: Path) -> str:
    """Every committed result's targets in one table, each row linked to its JSON."""
    rows = []
    for name in SUMMARY:
        if not (docs_dir / json_name(name)).exists():
            continue
        kind, data = _load(name, docs_dir)
        targets = TARGETS.get("chaos" if kind.startswith("chaos") else kind)
        when = (data["provenance"].get("start") or {}).get("time", "?")[:10]
        src = f"[`{json_name(name)}`]({json_name(name)}), {when}"
        rows += [[*row, src] for row in (targets(data) if targets else [])]
    met = sum(r[3] == "yes" for r in rows)
    return (_rows(["figure", "target", "measured", "met", "from"], rows)
            + f"\n{met} of {len(rows)} targets met. Each row's JSON says which commit, machine and load it came from; "
            "its section below has the whole table.\n")


def render_block(name: str, docs_dir: Path) -> str:
    """The body of block ``name``: its table and where its figures come from (``summary``: every result's
    targets)."""
    if name == "summary":
        return render_summary(docs_dir)
    kind, data = _load(name, docs_dir)
    return render(kind, data) + "\n" + _provenance(data, json_name(name))


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
