"""vLLM's own serving benchmark (`vllm bench serve`, driven through its module) runs against Baton's
`/v1` unchanged: a real gateway with a Postgres tenant and key, the zero-latency stub as upstream."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from baton.bench import arms
from baton.bench.procs import start_stub
from baton.bench.serve import vllm_bench_command

pytestmark = pytest.mark.e2e  # imports vllm (about 20 s and 1 GB), though it starts no engine


def test_vllm_bench_serve_runs_against_baton(pg_url: str, tmp_path: Path) -> None:
    pytest.importorskip("vllm.benchmarks.serve")
    from baton.dataplane.tinymodel import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    with contextlib.ExitStack() as stack:
        stub, stub_url = start_stub("stub-vllm-bench")
        stack.callback(stub.stop)
        arms.migrate(pg_url)
        tenant = arms.provision_tenant(pg_url, model="tiny-vb", model_source=str(model))
        gw, url = arms.start_gateway("gw-vllm-bench", arms.gateway_env(
            tenant, upstreams={"tiny-vb": stub_url}, tracing=True, otlp_endpoint=None))
        stack.callback(gw.stop)
        args = ["--backend", "openai-chat", "--base-url", url.removesuffix("/v1"), "--endpoint",
                "/v1/chat/completions", "--model", "tiny-vb", "--tokenizer", str(model), "--dataset-name", "random",
                "--random-input-len", "32", "--random-output-len", "6", "--num-prompts", "12", "--request-rate", "20",
                "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir",
                str(tmp_path), "--result-filename", "vb.json"]
        env = {**os.environ, "OPENAI_API_KEY": tenant.api_key, "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(vllm_bench_command(args), env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "vb.json").read_text())
    assert res["completed"] == 12
    assert res["failed"] == 0
    assert res["total_output_tokens"] == 12 * 6
