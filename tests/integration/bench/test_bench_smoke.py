"""The control-plane benchmarks run as a user runs them (``baton bench ingest|ratelimit|revoke``, tiny sizes)
against the real Postgres and Redis: each writes its JSON with provenance, and the behaviour its figure
rests on holds (nothing lost across the outage, which really happened; every revocation seen by every
process; every decision taken). The figures themselves are the benchmarks' to report, not the tests'."""

from __future__ import annotations

from pathlib import Path

from tests.bench_cli import run_bench


def test_ingest_loses_nothing_across_a_postgres_outage(pg_url: str, tmp_path: Path) -> None:
    r = run_bench(tmp_path, "ingest", "--records", "3000", "--outage", "1", "--batch-size", "200", "--db-url", pg_url)
    assert r["outage_seen"] and r["failed_flushes"] > 0  # the outage happened: writes failed and were retried
    assert (r["usage_rows"], r["request_rows"], r["lost"], r["duplicated"]) == (3000, 3000, 0, 0)
    assert r["records_per_s"] > 0


def test_ratelimit_decides_from_several_processes(tmp_path: Path) -> None:
    r = run_bench(tmp_path, "ratelimit", "--processes", "2", "--concurrency", "4", "--duration", "0.5")
    assert r["decisions"] > 0 and r["denied"] == 0 and len(r["per_process_per_s"]) == 2
    assert all(x > 0 for x in r["per_process_per_s"]) and r["latency_ms"]["p99"] > 0


def test_revoke_is_seen_by_every_gateway_process(pg_url: str, tmp_path: Path) -> None:
    r = run_bench(tmp_path, "revoke", "--gateways", "2", "--revocations", "3", "--db-url", pg_url)
    assert r["missed"] == 0 and r["seen_by_all_ms"]["count"] == 3
    assert [g["count"] for g in r["per_gateway_ms"]] == [3, 3]


def test_serve_loads_an_openai_endpoint_and_writes_its_plot(tmp_path: Path) -> None:
    from baton.bench.procs import start_stub

    stub, url = start_stub("stub-serve-smoke", token_gap_ms=0.5)
    try:
        r = run_bench(tmp_path, "serve", "--base-url", url, "--model", "stub", "--request-rate", "8,inf",
                   "--num-prompts", "6", "--input-len", "16", "--output-len", "4", "--warmup", "1")
    finally:
        stub.stop()
    assert [run["request_rate"] for run in r["runs"]] == [8.0, "inf"]
    assert all(run["completed"] == 6 and run["failed"] == 0 for run in r["runs"])
    assert (tmp_path / "serve.png").exists()
