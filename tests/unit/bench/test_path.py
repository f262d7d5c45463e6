"""`baton bench path`'s arithmetic: a P/D request's TTFT split into hops from its spans, and the report."""

from baton.bench.docreport import render
from baton.bench.path import HOPS, attribute, targets_met

MS = 1_000_000


def _span(name: str, start_ms: float, end_ms: float, **attrs) -> dict:
    return {"name": name, "start": int(start_ms * MS), "end": int(end_ms * MS), "attrs": attrs}


def test_the_hops_of_a_pd_request_add_up_to_its_ttft():
    sent = 1_000 * MS
    spans = [
        _span("gateway.request", 1002, 1200), _span("gateway.auth", 1002, 1003), _span("gateway.ratelimit", 1004, 1005),
        _span("dataplane.prefill", 1008, 1040, **{"baton.server.received_unix_nano": 1007 * MS}),
        _span("dataplane.decode", 1041, 1200), _span("dataplane.kv_handoff", 1041, 1060),
        _span("dataplane.kv_transfer", 1045, 1047),
    ]
    hops = attribute(spans, sent, 0.065)
    assert hops == {"gateway": 5.0, "to decode server": 2.0, "decode server, before prefill": 1.0,
                    "remote prefill call": 32.0, "decode server, prefill to decode": 1.0, "KV transfer (NIXL)": 2.0,
                    "first decode step": 17.0, "back to the client": 5.0}
    assert sum(hops.values()) == 65.0
    assert set(hops) <= set(HOPS)


def test_a_request_without_its_data_plane_spans_is_not_attributed():
    assert attribute([_span("gateway.request", 1, 2)], 0, 0.01) is None


def test_targets_are_judged_against_the_engine_at_concurrency_one():
    def arm(added: float, itl: float) -> dict:
        return {"added_ttft_p50_ms": added, "itl_p50_ratio": itl}

    result = {"concurrency": {"1": {"baton-pd": arm(14.0, 1.05), "baton-agg": arm(3.5, 1.0)}},
              "saturation_vs_engine": {"baton-pd": 0.4}}
    met = targets_met(result)
    assert met["baton_pd_added_ttft_p50_ms"]["met"] is True
    assert met["baton_agg_added_ttft_p50_ms"]["met"] is False
    assert met["pd_saturation_vs_engine"]["met"] is False
    assert met["baton_pd_itl_p50_vs_engine"]["met"] is True


def test_the_report_renders_every_arm_and_hop():
    summary = {"completed": 2, "failed": 0, "ttft_ms": {"p50": 20.0, "p99": 30.0}, "itl_ms": {"p50": 4.0, "p99": 9.0},
               "output_throughput": 100.0}
    result = {"arms": ["engine", "serve-pd"],
              "concurrency": {"1": {"engine": {"summary": summary, "added_ttft_p50_ms": 0.0, "itl_p50_ratio": 1.0},
                                    "serve-pd": {"summary": summary, "added_ttft_p50_ms": 1.0, "itl_p50_ratio": 1.0,
                                                 "hops_ms_median": {"remote prefill call": 10.0}}}},
              "saturation": {"engine": summary, "serve-pd": summary},
              "saturation_vs_engine": {"engine": 1.0, "serve-pd": 1.0},
              "cpu_ms_per_request_c1": {"engine": {"bare engine: engine core": 3.0}},
              "targets": targets_met({"concurrency": {}})}
    text = render("path", result)
    assert "| 1 | serve-pd | 2/0 | 20.00 |" in text and "| remote prefill call | 10.00 |" in text
    assert "| bare engine: engine core | 3.00 |" in text


def test_the_ray_arms_call_a_pd_app_of_their_own_with_serve_s_default_replica_settings(tmp_path):
    from baton.bench.path import PathConfig, _specs, app_of, is_pd
    from baton.dataplane.render import engine_env

    assert [app_of(a) for a in ("engine", "serve-agg", "baton-pd", "serve-pd-ray")] == [
        "engine", "agg", "pd", "pd-ray"]
    assert [is_pd(a) for a in ("engine", "baton-agg", "serve-pd", "baton-pd-ray")] == [False, False, True, True]

    _agg, pd, ray = _specs(PathConfig(), tmp_path, "http://127.0.0.1:4318", "redis://127.0.0.1:6379", 24000)
    assert (pd.name, ray.name) == ("path-pd", "path-pd-ray")
    assert ray.model.served_name == "tiny-pd-ray" and ray.route_prefix == "/path-pd-ray"
    # Baton's app runs Serve's throughput-optimized preset in its replicas; the ray arms' app does not.
    for role in ("prefill", "decode"):
        assert engine_env(pd, role)["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
        assert engine_env(ray, role)["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"
    # Everything else is the P/D app's, on NIXL ports of its own.
    assert ray.kv.nixl_port_base != pd.kv.nixl_port_base
    assert ray.kv.model_dump(exclude={"nixl_port_base"}) == pd.kv.model_dump(exclude={"nixl_port_base"})
    assert ray.engine == pd.engine and ray.mode == pd.mode == "pd"
