"""``baton bench fairness``'s pure parts on known inputs, and one whole run against a fake Baton (an httpx
mock transport answering the admin API and streamed chat completions)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from baton.bench import fairness as fb
from baton.bench import report, stats


def _chunk(content: str | None = None, *, role: str | None = None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> str:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    body: dict[str, Any] = {"object": "chat.completion.chunk",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if not usage else []}
    if usage:
        body["usage"] = usage
    return "data: " + json.dumps(body)


def _stream(words: list[str], *, usage: int | None = None) -> str:
    lines = [_chunk(role="assistant", content=""), ""]
    for w in words:
        lines += [_chunk(w), ""]
    lines += [_chunk("", finish="stop"), ""]
    if usage is not None:
        lines += [_chunk(usage={"prompt_tokens": 5, "completion_tokens": usage}), ""]
    lines += ["data: [DONE]", "", ""]
    return "\n".join(lines)


# --- statistics ---------------------------------------------------------------------------------------

def test_percentiles_interpolate_between_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert stats.percentile(xs, 50) == pytest.approx(50.5)
    assert stats.percentile(xs, 99) == pytest.approx(99.01)
    assert stats.percentile([3.0], 99) == 3.0
    assert math.isnan(stats.percentile([], 50))


def test_jain_index_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() -> None:
    assert fb.jain_index([10.0, 10.0, 10.0]) == pytest.approx(1.0)
    assert fb.jain_index([30.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert fb.jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    # weighted: a tenant of weight 2 getting twice as much is a fair share
    assert fb.jain_index([20.0, 10.0], [2.0, 1.0]) == pytest.approx(1.0)
    assert fb.jain_index([10.0, 10.0], [2.0, 1.0]) == pytest.approx(0.9)
    assert math.isnan(fb.jain_index([]))
    assert math.isnan(fb.jain_index([0.0, 0.0]))
    with pytest.raises(ValueError):
        fb.jain_index([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        fb.jain_index([1.0], [0.0])


def test_attainment_counts_ttfts_within_the_target() -> None:
    assert fb.attainment([0.1, 0.2, 0.5, 0.6], 500) == 0.75
    assert fb.attainment([0.5], 500) == 1.0  # at the target is within it
    assert math.isnan(fb.attainment([], 500))


def test_token_shares() -> None:
    assert fb.token_shares({"high": 300, "mid": 100, "low": 100}) == {"high": 0.6, "mid": 0.2, "low": 0.2}
    assert all(math.isnan(v) for v in fb.token_shares({"a": 0, "b": 0}).values())


# --- SSE ----------------------------------------------------------------------------------------------

def test_sse_parser_splits_blocks_names_events_and_joins_data_lines() -> None:
    p = fb.SseParser()
    lines = [": keep-alive", "data: {\"a\": 1}", "", "event: error", "data: {\"error\":", "data:  {\"x\": 2}}", "",
             "data: [DONE]"]
    events = [e for line in lines for e in p.feed(line + "\r\n")] + p.close()
    assert events == [("message", '{"a": 1}'), ("error", '{"error":\n {"x": 2}}'), ("message", "[DONE]")]
    assert fb.SseParser().close() == []


def test_stream_reading_times_the_first_content_chunk_and_takes_usage() -> None:
    parser, reading = fb.SseParser(), fb.StreamReading()
    now = 0.0
    for line in _stream(["Hello", " there", "!"], usage=3).splitlines():
        now += 0.01
        for event, data in parser.feed(line):
            if reading.on_event(event, data, now):
                break
    # the first chunk carries only the role (empty content): not the first token; "Hello" is its event's
    # 3rd line and the blank line that ends it the 4th
    assert reading.first_content_at == pytest.approx(0.04)
    assert reading.content_chunks == 3
    assert reading.tokens == 3
    assert reading.prompt_tokens == 5  # the usage report's, for the share's prompt + 2 x completion
    assert reading.done and reading.finished and reading.complete


def test_stream_reading_without_usage_counts_content_chunks_and_flags_errors() -> None:
    r = fb.StreamReading()
    assert not r.on_event("message", _chunk("a")[6:], 1.0)
    assert not r.on_event("message", _chunk("b")[6:], 2.0)
    assert r.tokens == 2 and not r.complete  # no [DONE], no finish_reason
    assert r.prompt_tokens is None and r.usage_tokens is None
    assert r.on_event("error", json.dumps({"error": {"message": "engine gone"}}), 3.0)
    assert r.error == "stream error: engine gone" and not r.complete
    bad = fb.StreamReading()
    assert bad.on_event("message", "{not json", 1.0)
    assert bad.error == "malformed SSE data"


def test_kinds_of_refusals() -> None:
    assert [fb.kind_of(s) for s in (429, 503, 502, 500, 400, 404)] == ["429", "503", "5xx", "5xx", "4xx", "4xx"]


# --- one request over a mock transport --------------------------------------------------------------------

def _send(handler: Any) -> fb.Outcome:
    async def go() -> fb.Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            body = fb.chat_body("tiny-llama", "hi", 4)
            return await fb.send_chat(client, "http://gw/v1/chat/completions", "bt_key", body, timeout_s=5)

    return asyncio.run(go())


def test_send_chat_reads_a_stream_and_refusals() -> None:
    seen: dict[str, Any] = {}

    def ok(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers["authorization"]
        seen["body"] = json.loads(request.content)
        return httpx.Response(200, text=_stream(["a", "b"], usage=2), headers={"content-type": "text/event-stream"})

    o = _send(ok)
    assert (o.kind, o.status, o.completion_tokens) == ("200", 200, 2)
    assert o.usage is True and o.prompt_tokens == 5
    assert o.ttft_s is not None and 0 <= o.ttft_s <= o.latency_s
    assert seen["auth"] == "Bearer bt_key"
    assert seen["body"]["stream"] is True and seen["body"]["max_tokens"] == 4
    assert seen["body"]["stream_options"] == {"include_usage": True}

    o = _send(lambda r: httpx.Response(429, json={"error": {"message": "queue full"}}, headers={"retry-after": "2"}))
    assert (o.kind, o.retry_after, o.ttft_s) == ("429", "2", None)
    assert "queue full" in o.error
    o = _send(lambda r: httpx.Response(429, json={"error": {"message": "no header"}}))
    assert o.kind == "429" and o.retry_after is None
    assert _send(lambda r: httpx.Response(503, json={})).kind == "503"
    assert _send(lambda r: httpx.Response(502, text="bad gateway")).kind == "5xx"

    def broken(request: httpx.Request) -> httpx.Response:
        text = "\n".join([_chunk("a"), "", "event: error", 'data: {"error": {"message": "gone"}}', "", ""])
        return httpx.Response(200, text=text)

    o = _send(broken)
    assert o.kind == "stream_error" and o.completion_tokens == 1 and o.ttft_s is not None

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert _send(refused).kind == "connection_error"

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    assert _send(slow).kind == "timeout"


# --- summaries ------------------------------------------------------------------------------------------

def _o(kind: str, ttft_ms: float | None = None, tokens: int = 0, retry_after: str | None = None, *,
       prompt: int = 0) -> dict[str, Any]:
    return asdict(fb.Outcome(kind=kind, status=int(kind) if kind.isdigit() else 0,
                             ttft_s=None if ttft_ms is None else ttft_ms / 1000.0, completion_tokens=tokens,
                             retry_after=retry_after, prompt_tokens=prompt, usage=kind == "200"))


def test_summarize_tenant_counts_outcomes_and_retry_after() -> None:
    outs = [fb.Outcome(**_o("200", 100, 10)), fb.Outcome(**_o("200", 300, 10)), fb.Outcome(**_o("429", None, 0, "1")),
            fb.Outcome(**_o("429")), fb.Outcome(**_o("timeout", 50, 4))]
    s = fb.summarize_tenant(outs, elapsed_s=2.0)
    assert s["sent"] == 5 and s["completed"] == 2
    assert s["status"]["200"] == 2 and s["status"]["429"] == 2 and s["status"]["timeout"] == 1
    assert s["status"]["503"] == 0
    assert s["429_without_retry_after"] == 1 and s["retry_after_on_every_429"] is False
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)  # completed requests only
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["completion_tokens"] == 24  # tokens received, a timed-out stream's too
    assert s["tokens_per_s"] == pytest.approx(12.0)
    assert s["prompt_tokens"] == 0 and s["weighted_tokens"] == 48
    assert s["completed_without_usage"] == 0


def _made_up_raw() -> dict[str, list[dict[str, Any]]]:
    b_alone = [_o("200", 100 + i, 16) for i in range(100)]  # p99 = 198.01
    b_beside = [_o("200", 120 + i, 16) for i in range(100)]  # p99 = 218.01
    a_flood = [_o("200", 900, 128) for _ in range(50)] + [_o("429", None, 0, "1") for _ in range(30)]
    high = [_o("200", 100, 64) for _ in range(99)] + [_o("200", 600, 64)]
    mid = [_o("200", 800, 64) for _ in range(30)] + [_o("200", 1200, 64) for _ in range(10)]
    low = [_o("200", 900, 64) for _ in range(10)] + [_o("429", None, 0, "2") for _ in range(40)]
    return {
        "b_alone": [{"tenant": "b", "elapsed_s": 10.0, "outcomes": b_alone}],
        "a_flood_b": [{"tenant": "a", "elapsed_s": 15.0, "outcomes": a_flood},
                      {"tenant": "b", "elapsed_s": 10.0, "outcomes": b_beside}],
        "bands": [{"tenant": "high", "elapsed_s": 10.0, "outcomes": high},
                  {"tenant": "mid", "elapsed_s": 10.0, "outcomes": mid},
                  {"tenant": "low", "elapsed_s": 10.0, "outcomes": low}],
        "share": _share_raw(w2_requests=41),
    }


def _share_raw(*, w2_requests: int, w1_requests: int = 20) -> list[dict[str, Any]]:
    """Each completed request: 100 prompt tokens and 50 completion tokens, 200 as the gateway counts them."""
    def outs(n: int) -> list[dict[str, Any]]:
        return [_o("200", 300, 50, prompt=100) for _ in range(n)]

    return [{"tenant": "w2", "elapsed_s": 10.0, "outcomes": [*outs(w2_requests), _o("429", None, 0, "1")]},
            {"tenant": "w1", "elapsed_s": 10.0, "outcomes": outs(w1_requests)}]


def test_summary_derives_the_ratio_attainment_shares_and_targets() -> None:
    res = fb.summarize(fb.FairnessConfig(), _made_up_raw())
    d = res["derived"]
    assert d["b_ttft_p99_ms_alone"] == pytest.approx(198.01)
    assert d["b_ttft_p99_ratio"] == pytest.approx(218.01 / 198.01)
    assert d["a_never_5xx_or_timeout"] is True
    assert d["every_429_had_retry_after"] is True
    assert d["top_band"] == "high"
    assert d["band_attainment"] == {"high": 0.99, "mid": 0.75, "low": 1.0}
    att = res["phases"]["bands"]["attainment"]
    assert att["low"]["attainment_of_sent"] == pytest.approx(10 / 50)
    assert att["low"]["sheddable"] is True and att["high"]["ttft_ms"] == 500
    assert d["bands_token_share"] == pytest.approx({"high": 6400 / 9600, "mid": 2560 / 9600, "low": 640 / 9600})
    assert d["jain_index"]["bands"] == pytest.approx(fb.jain_index([640.0, 256.0, 64.0]))
    assert set(d["jain_index"]) == {"a_flood_b", "bands", "share"}
    assert d["jain_index"]["share"] == pytest.approx(fb.jain_index([205.0, 100.0], [2.0, 1.0]))
    # the share: prompt + 2 x completion tokens of each tenant, w2's over w1's, against the weights' 2
    share = res["phases"]["share"]["share"]
    assert share["weighted_tokens"] == {"w2": 41 * 200, "w1": 20 * 200}
    assert share["weights"] == {"w2": 2.0, "w1": 1.0} and share["priority"] == 50
    assert d["share_weighted_tokens"] == {"w2": 8200, "w1": 4000}
    assert d["share_ratio"] == pytest.approx(2.05) and d["share_weight_ratio"] == 2.0
    assert d["share_error"] == pytest.approx(0.025)
    assert res["phases"]["share"]["tenants"]["w2"]["prompt_tokens"] == 4100
    assert len(res["b_ttft_ms_samples"]["b_alone"]) == 100
    t = res["targets"]
    assert t["b_ttft_p99_ratio"]["met"] is True and t["b_ttft_p99_ratio"]["target"] == 1.5
    assert t["top_band_attainment"]["met"] is True
    assert t["share_within_10pct_of_weights"] == {"measured": pytest.approx(0.025), "target": 0.10, "op": "<=",
                                                  "met": True}
    assert res["met"] is True


@pytest.mark.parametrize(("w2_requests", "met"), [(43, True), (37, True), (45, False), (35, False), (20, False)])
def test_the_share_is_judged_within_10_percent_of_the_weights(w2_requests: int, met: bool) -> None:
    # w1 served 20 requests: w2's 43 and 37 are ratios 2.15 and 1.85, within 10% of 2; 45 and 35 are not
    res = fb.summarize(fb.FairnessConfig(phases=("share",)), {"share": _share_raw(w2_requests=w2_requests)})
    assert res["derived"]["share_ratio"] == pytest.approx(w2_requests / 20)
    assert res["targets"]["share_within_10pct_of_weights"]["met"] is met
    assert res["met"] is met  # the only target judged


def test_a_share_without_w1_tokens_is_not_judged() -> None:
    raw = _share_raw(w2_requests=10, w1_requests=0)
    res = fb.summarize(fb.FairnessConfig(phases=("share",)), {"share": raw})
    assert res["derived"]["share_ratio"] is None and res["derived"]["share_error"] is None
    assert res["targets"]["share_within_10pct_of_weights"]["met"] is None


def test_weighted_tokens_and_the_share_error() -> None:
    assert fb.weighted_tokens(100, 50) == 200  # a generated token costs two prompt tokens, as in the gateway
    assert fb.share_error(2.2, 2.0) == pytest.approx(0.1)
    assert fb.share_error(1.8, 2.0) == pytest.approx(0.1)
    assert fb.share_error(None, 2.0) is None
    assert fb.share_error(math.nan, 2.0) is None


def test_the_share_phase_two_tenants_in_one_band_weighted_2_and_1() -> None:
    cfg = fb.FairnessConfig(a_concurrency=10, phases=("share",))
    assert fb.PHASES == ("b_alone", "a_flood_b", "bands", "share")  # the share last, after the bands
    roles = fb.roles(cfg)
    assert roles == {"w2": {"priority": 50, "ttft_ms": 1000, "weight": 2.0},
                     "w1": {"priority": 50, "ttft_ms": 1000, "weight": 1.0}}
    assert fb.policy_body("n", tpot_ms=1000, **roles["w2"])["weight"] == 2.0
    assert "weight" not in fb.policy_body("n", tpot_ms=1000, **roles["w1"])
    ds = fb.drivers(cfg, "share", {"w2": "bt_2", "w1": "bt_1"})
    assert [(d.tenant, d.api_key, d.concurrency) for d in ds] == [("w2", "bt_2", 5), ("w1", "bt_1", 5)]
    assert all(d.interval_s is None and d.honour_retry_after and d.window_s == cfg.duration_s for d in ds)
    assert len({(d.prompt_words, d.max_tokens) for d in ds}) == 1  # the same requests: only the weights differ
    assert fb.config_dict(cfg)["share_concurrency"] == 5
    assert fb.config_dict(fb.FairnessConfig(share_concurrency=3))["share_concurrency"] == 3


def test_a_second_gateway_takes_the_light_the_weight_1_and_the_top_band_tenants() -> None:
    one = fb.FairnessConfig(base_url="http://g1:8000/")
    two = fb.FairnessConfig(base_url="http://g1:8000", second_url="http://g2:8011")
    secrets = {"a": "k", "b": "k", "w2": "k", "w1": "k", **{b.name: "k" for b in fb.DEFAULT_BANDS}}
    for phase in fb.PHASES:
        assert {d.url for d in fb.drivers(one, phase, secrets)} == {"http://g1:8000/v1/chat/completions"}
        urls = {d.tenant: d.url for d in fb.drivers(two, phase, secrets)}
        assert all(u == ("http://g2:8011" if t in fb.SECOND_GATEWAY_ROLES else "http://g1:8000")
                   + "/v1/chat/completions" for t, u in urls.items())
    assert {"b", "w1", "high"} == fb.SECOND_GATEWAY_ROLES
    assert fb.config_dict(two)["second_url"] == "http://g2:8011"


def test_summary_fails_targets_on_a_5xx_a_bare_429_and_a_slow_b() -> None:
    raw = _made_up_raw()
    raw["a_flood_b"][0]["outcomes"] += [_o("503"), _o("429")]
    raw["a_flood_b"][1]["outcomes"] = [_o("200", 400, 16) for _ in range(10)]
    raw["bands"][0]["outcomes"] += [_o("200", 900, 64)]
    res = fb.summarize(fb.FairnessConfig(), raw)
    t = res["targets"]
    assert t["a_never_5xx_or_timeout"]["met"] is False
    assert t["every_429_had_retry_after"]["met"] is False
    assert t["b_ttft_p99_ratio"]["met"] is False
    assert t["top_band_attainment"]["met"] is False
    assert res["met"] is False


def test_targets_without_their_phases_are_not_judged() -> None:
    raw = _made_up_raw()
    res = fb.summarize(fb.FairnessConfig(phases=("bands",)), {"bands": raw["bands"]})
    assert res["targets"]["b_ttft_p99_ratio"]["met"] is None
    assert res["targets"]["a_never_5xx_or_timeout"]["met"] is None
    assert res["met"] is True  # the top band's attainment, the one judged


def test_config_written_without_the_admin_token(tmp_path: Path) -> None:
    cfg = fb.FairnessConfig(admin_token="bt_admin_secret", a_concurrency=6)
    out = fb.config_dict(cfg)
    assert "admin_token" not in out and "bt_admin_secret" not in json.dumps(out)
    assert out["band_concurrency"] == 3
    assert "bt_admin_secret" not in repr(cfg)
    env = tmp_path / "baton.env"
    env.write_text("# made by baton up\nBATON_SECURITY__KEY_SECRET=x\nBATON_SECURITY__ADMIN_TOKEN=bt_admin_abc\n")
    assert fb.admin_token_from_env_file(env) == "bt_admin_abc"
    assert fb.admin_token_from_env_file(tmp_path / "missing.env") is None


def test_prompts_differ_from_their_first_word() -> None:
    import random

    rng = random.Random(0)
    a, b = fb.make_prompt(rng, 300, "a-1"), fb.make_prompt(rng, 300, "a-2")
    assert a.split()[0] != b.split()[0]
    assert len(a.split()) == 300


# --- a whole run against a fake Baton -----------------------------------------------------------------------

class FakeBaton:
    """The admin routes the benchmark calls and a chat endpoint: A and low-band keys get every other
    request refused with 429 and Retry-After."""

    def __init__(self) -> None:
        self.model_id = str(uuid.uuid4())
        self.tenants: dict[str, str] = {"old": f"{fb.NAME_PREFIX}-dead01-a", "other": "demo"}
        self.policies: dict[str, dict[str, Any]] = {"oldp": {"name": f"{fb.NAME_PREFIX}-dead01-a"},
                                                    "keep": {"name": "gold"}}
        self.assignments: dict[str, str] = {}
        self.keys: dict[str, dict[str, Any]] = {}
        self.grants: set[tuple[str, str]] = set()
        self.limits: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.chat: dict[str, int] = {}
        self.created_policies: list[dict[str, Any]] = []
        self.records: dict[str, list[dict[str, Any]]] = {}  # tenant id -> its request records, oldest first

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        if path == "/v1/chat/completions":
            return self._chat(request)
        assert request.headers["authorization"] == "Bearer bt_admin_test"
        assert path.startswith("/admin/v1/")
        self.calls.append(f"{method} {path.removeprefix('/admin/v1')}")
        parts = path.removeprefix("/admin/v1/").split("/")
        body = json.loads(request.content) if request.content else {}
        match method, parts:
            case "GET", ["models"]:
                return httpx.Response(200, json={"data": [{"id": self.model_id, "name": "tiny-llama"}], "count": 1,
                                                 "limit": 500, "offset": 0})
            case "GET", ["tenants"]:
                data = [{"id": i, "name": n} for i, n in self.tenants.items() if request.url.params["name"] in n]
                return httpx.Response(200, json={"data": data, "count": len(data), "limit": 500, "offset": 0})
            case "GET", ["slo-policies"]:
                data = [{"id": i, **p} for i, p in self.policies.items()]
                return httpx.Response(200, json={"data": data, "count": len(data), "limit": 500, "offset": 0})
            case "POST", ["tenants"]:
                tid = str(uuid.uuid4())
                self.tenants[tid] = body["name"]
                return httpx.Response(201, json={"id": tid, **body})
            case "PUT", ["tenants", tid, "models", mid]:
                assert mid == self.model_id
                self.grants.add((tid, mid))
                return httpx.Response(204)
            case "PUT", ["tenants", tid, "rate-limit"]:
                self.limits[tid] = body
                return httpx.Response(200, json={"id": str(uuid.uuid4()), "tenant_id": tid, **body})
            case "POST", ["slo-policies"]:
                pid = str(uuid.uuid4())
                self.policies[pid] = body
                self.created_policies.append(body)
                return httpx.Response(201, json={"id": pid, **body})
            case "POST", ["slo-assignments"]:
                aid = str(uuid.uuid4())
                self.assignments[aid] = body["tenant_id"]
                return httpx.Response(201, json={"id": aid, **body})
            case "POST", ["tenants", tid, "keys"]:
                kid = str(uuid.uuid4())
                self.keys[kid] = {"tenant": tid, "secret": f"bt_{self.tenants[tid]}", "revoked": False}
                return httpx.Response(201, json={"key": {"id": kid}, "secret": self.keys[kid]["secret"]})
            case "POST", ["tenants", tid, "keys", kid, "revoke"]:
                self.keys[kid]["revoked"] = True
                return httpx.Response(200, json={"id": kid})
            case "GET", ["requests"]:
                mine = self.records.get(request.url.params["tenant_id"], [])[::-1]
                offset, limit = int(request.url.params["offset"]), int(request.url.params["limit"])
                return httpx.Response(200, json={"data": mine[offset:offset + limit], "count": len(mine),
                                                 "limit": limit, "offset": offset})
            case "DELETE", ["slo-assignments", aid]:
                return httpx.Response(204 if self.assignments.pop(aid, None) else 404)
            case "DELETE", ["slo-policies", pid]:
                return httpx.Response(204 if self.policies.pop(pid, None) else 404)
            case "DELETE", ["tenants", tid]:
                return httpx.Response(204 if self.tenants.pop(tid, None) else 404)
        return httpx.Response(404, json={"title": "not here"})

    def _chat(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["authorization"].removeprefix("Bearer ")
        owner = next(k for k in self.keys.values() if k["secret"] == key)
        assert not owner["revoked"]
        name = self.tenants[owner["tenant"]]
        self.chat[name] = self.chat.get(name, 0) + 1
        if name.endswith(("-a", "-low")) and self.chat[name] % 2 == 0:
            return httpx.Response(429, json={"error": {"message": "queue full"}}, headers={"retry-after": "1"})
        self.records.setdefault(owner["tenant"], []).append({
            "started_at": dt.datetime.now(dt.UTC).isoformat(), "queue_ms": 2.0 if name.endswith("-a") else 0.0,
            "ttft_ms": 5.0})
        return httpx.Response(200, text=_stream(["x"] * 4, usage=4), headers={"content-type": "text/event-stream"})


def test_a_whole_run_against_a_fake_baton_cleans_up_after_itself(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeBaton()
    cfg = fb.FairnessConfig(base_url="http://gw", admin_token="bt_admin_test", duration_s=0.4, b_interval_s=0.1,
                            a_concurrency=2, lead_s=0.1, gap_s=0.0, settle_s=0.0, warmup_requests=1,
                            a_retry_pause_s=0.02)
    logs: list[str] = []
    bars: dict[str, int] = {}

    def progress(desc: str, total: int) -> Any:
        bars[desc] = 0

        def advance(n: Any) -> None:
            bars[desc] += n

        return advance

    res = asyncio.run(fb.run_async(cfg, log=logs.append, progress=progress, transport=httpx.MockTransport(fake)))
    # what an earlier run left went first; everything this run made is gone; the rest is untouched
    assert fake.tenants == {"other": "demo"}
    assert fake.policies == {"keep": {"name": "gold"}}
    assert fake.assignments == {}
    assert all(k["revoked"] for k in fake.keys.values()) and len(fake.keys) == 7
    assert res["cleanup"] == {"deleted": {"assignments": 7, "policies": 7, "keys": 7, "tenants": 7}, "errors": []}
    assert len(fake.grants) == 7
    assert all(lim == fb.GENEROUS_LIMITS for lim in fake.limits.values())
    created = [p for p in fake.calls if p == "POST /slo-policies"]
    assert len(created) == 7
    assert set(bars) == {"b_alone", "a_flood_b", "bands", "share"} and bars["b_alone"] == 1

    assert res["benchmark"] == "fairness" and "admin_token" not in res["config"]
    assert res["tenants"]["high"]["policy"]["priority"] == 90
    assert res["tenants"]["low"]["policy"]["sheddable"] is True
    b = res["phases"]["b_alone"]["tenants"]["b"]
    assert b["sent"] == 4 and b["status"]["200"] == 4 and b["completion_tokens"] == 16
    a = res["phases"]["a_flood_b"]["tenants"]["a"]
    assert a["status"]["429"] > 0 and a["retry_after_on_every_429"] is True
    assert res["derived"]["a_never_5xx_or_timeout"] is True
    # Baton's records of each phase's requests: as many as answered 200, with their queue wait
    recs = res["phases"]["a_flood_b"]["records"]
    assert recs["a"]["records"] == a["status"]["200"] and recs["a"]["queue_ms"]["p50"] == 2.0
    assert recs["b"]["records"] == res["phases"]["a_flood_b"]["tenants"]["b"]["status"]["200"]
    assert recs["b"]["queue_ms"]["p99"] == 0.0 and recs["b"]["ttft_after_queue_ms"]["p50"] == 5.0
    assert res["phases"]["b_alone"]["records"]["b"]["records"] == 4  # the warm-up's are outside every phase
    assert res["phases"]["bands"]["tenants"]["low"]["status"]["429"] > 0
    assert res["derived"]["top_band_attainment"] == 1.0
    assert set(res["targets"]) == {"b_ttft_p99_ratio", "a_never_5xx_or_timeout", "every_429_had_retry_after",
                                   "top_band_attainment", "share_within_10pct_of_weights"}
    # the share's tenants: weights 2 and 1 in band 50; each answer 5 prompt and 4 completion tokens (usage)
    assert res["tenants"]["w2"]["policy"] == {"priority": 50, "ttft_ms": 1000, "weight": 2.0}
    assert {p.get("weight") for p in fake.created_policies if p["name"].endswith(("-w2", "-w1"))} == {2.0, None}
    sh = res["phases"]["share"]["tenants"]
    for name in ("w2", "w1"):
        assert sh[name]["completed"] > 0 and sh[name]["completed_without_usage"] == 0
        assert sh[name]["weighted_tokens"] == sh[name]["completed"] * (5 + 2 * 4)
    assert res["derived"]["share_ratio"] == pytest.approx(sh["w2"]["completed"] / sh["w1"]["completed"])
    assert res["targets"]["share_within_10pct_of_weights"]["measured"] == res["derived"]["share_error"]

    from baton.cli.bench import _print_fairness

    _print_fairness(res)  # the command's summary table reads every figure it names
    out = capsys.readouterr().out
    assert "baton bench fairness" in out and "top_band_attainment" in out and "band low" in out
    assert "share_within_10pct_of_weights" in out and "w2 (weight 2)" in out

    path = report.write_json(tmp_path / "bench-fairness.json", res)
    loaded = json.loads(path.read_text())
    assert "bt_admin_test" not in path.read_text() and "bt_bench" not in path.read_text()
    from baton.bench import docreport

    text = docreport.render("fairness", loaded)  # the docs' tables, Baton's records under each phase's
    assert text.count("in Baton's request records") == 4 and "| b | 4 | 0.0 | 0.0 | 5.0 | 5.0 |" in text
    png = fb.plot(tmp_path / "bench-fairness.png", loaded)
    assert png.stat().st_size > 10_000


def test_setup_failure_still_deletes_what_was_made() -> None:
    fake = FakeBaton()

    def failing(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/slo-assignments") and request.method == "POST":
            return httpx.Response(422, json={"title": "no"})
        return fake(request)

    cfg = fb.FairnessConfig(base_url="http://gw", admin_token="bt_admin_test", settle_s=0.0)
    with pytest.raises(fb.AdminError, match="422"):
        asyncio.run(fb.run_async(cfg, log=lambda _: None, transport=httpx.MockTransport(failing)))
    assert fake.tenants == {"other": "demo"}
    assert fake.policies == {"keep": {"name": "gold"}}


def test_unknown_phase_and_missing_token_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown phase"):
        asyncio.run(fb.run_async(fb.FairnessConfig(admin_token="x", phases=("nope",))))
    with pytest.raises(ValueError, match="admin token"):
        asyncio.run(fb.run_async(fb.FairnessConfig()))


def test_a_can_offer_an_open_loop_past_what_the_model_serves() -> None:
    secrets = {"a": "k", "b": "k"}
    closed = {d.tenant: d for d in fb.drivers(fb.FairnessConfig(), "a_flood_b", secrets)}
    assert closed["a"].interval_s is None and closed["a"].concurrency == 16
    opened = {d.tenant: d for d in fb.drivers(fb.FairnessConfig(a_rate=20.0), "a_flood_b", secrets)}
    assert opened["a"].interval_s == 0.05 and not opened["a"].honour_retry_after
    assert opened["b"].interval_s == 0.5  # B as ever
    assert fb.config_dict(fb.FairnessConfig(a_rate=20.0))["a_rate"] == 20.0
