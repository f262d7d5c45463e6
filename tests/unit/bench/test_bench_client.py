"""The load generator's client against the zero-latency stub (a real HTTP server on loopback), the
datasets' exact lengths, and the rate parser."""

from __future__ import annotations

import asyncio
import math
import socket
from pathlib import Path

import pytest

from baton.bench import client, datasets, stub
from baton.bench.serve import parse_rates, vllm_bench_command


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _with_stub(fn):  # type: ignore[no-untyped-def]
    server = await stub.serve()
    port = server.sockets[0].getsockname()[1]
    try:
        return await fn(port)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streamed_request_is_timed_token_by_token(endpoint: str) -> None:
    async def go(port: int):  # type: ignore[no-untyped-def]
        target = client.Target(base_url=f"http://127.0.0.1:{port}/v1", model="m", endpoint=endpoint, name="a")
        sample = datasets.SampleRequest("hello world", 2, 7)
        session = client.make_session(2)
        try:
            return await client.send_one(session, target, sample)
        finally:
            await session.close()

    r = _run(_with_stub(go))
    assert r.success, r.error
    assert r.arm == "a"
    assert r.output_tokens == 7
    assert len(r.itl) == 6          # one gap between each pair of content chunks
    assert 0 < r.ttft <= r.latency
    assert r.latency >= r.ttft + sum(r.itl) - 1e-9


def test_run_load_returns_results_in_send_order_with_failures() -> None:
    async def go(port: int):  # type: ignore[no-untyped-def]
        target = client.Target(base_url=f"http://127.0.0.1:{port}/v1", model="m")
        samples = [datasets.SampleRequest("x", 1, n) for n in (1, 2, 3, 4, 5)]
        return await client.run_load(target, samples, request_rate=1000.0, max_concurrency=2, seed=1)

    results, duration = _run(_with_stub(go))
    assert duration > 0
    assert [r.output_tokens for r in results] == [1, 2, 3, 4, 5]
    assert all(r.success for r in results)
    assert results[0].itl == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_is_a_failed_request_not_an_exception() -> None:
    async def go():  # type: ignore[no-untyped-def]
        target = client.Target(base_url=f"http://127.0.0.1:{_free_port()}/v1", model="m")
        return await client.run_load(target, [datasets.SampleRequest("x", 1, 3)])

    results, _ = _run(go())
    assert not results[0].success
    assert results[0].error


def test_http_errors_are_failures_with_the_openai_message() -> None:
    async def go(port: int):  # type: ignore[no-untyped-def]
        target = client.Target(base_url=f"http://127.0.0.1:{port}/x", model="m")
        session = client.make_session(1)
        try:
            return await client.send_one(session, target, datasets.SampleRequest("x", 1, 3))
        finally:
            await session.close()

    r = _run(_with_stub(go))
    assert not r.success
    assert r.error.startswith("HTTP 404")


def test_request_body_asks_for_a_fixed_output_length() -> None:
    t = client.Target(base_url="http://h/v1", model="m", api_key="sk-1")
    body = t.body(datasets.SampleRequest("p", 1, 9))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9 and body["min_tokens"] == 9 and body["ignore_eos"] is True
    assert body["messages"] == [{"role": "user", "content": "p"}]
    assert t.request_headers()["Authorization"] == "Bearer sk-1"
    plain = client.Target(base_url="http://h/v1", model="m", endpoint="completions", ignore_eos=False)
    b2 = plain.body(datasets.SampleRequest("p", 1, 9))
    assert "ignore_eos" not in b2 and b2["prompt"] == "p"
    assert plain.url() == "http://h/v1/completions"


def test_parse_rates() -> None:
    assert parse_rates(["1", "2.5,4", "inf"]) == [1.0, 2.5, 4.0, math.inf]
    with pytest.raises(ValueError):
        parse_rates(["0"])


def test_vllm_bench_command_drives_the_module_not_the_cli() -> None:
    cmd = vllm_bench_command(["--num-prompts", "3"])
    assert cmd[1] == "-c" and "vllm.benchmarks.serve" in cmd[2] and cmd[-2:] == ["--num-prompts", "3"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> datasets.HFTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = [" ".join(datasets.WORDS[i:] + datasets.WORDS[:i]) for i in range(len(datasets.WORDS))]
    tok.train_from_iterator(text, trainer)
    folder: Path = tmp_path_factory.mktemp("tok")
    tok.save(str(folder / "tokenizer.json"))
    return datasets.HFTokenizer(folder)


def test_random_prompts_have_the_exact_token_length(tokenizer: datasets.HFTokenizer) -> None:
    samples = datasets.random_dataset(20, 64, 8, seed=3, tokenizer=tokenizer)
    assert [s.prompt_len for s in samples] == [64] * 20
    assert all(len(tokenizer.encode(s.prompt)) == 64 for s in samples)
    assert not any(t in s.prompt for s in samples for t in ("<|begin_of_text|>", "<|end|>"))
    again = datasets.random_dataset(20, 64, 8, seed=3, tokenizer=tokenizer)
    assert [s.prompt for s in samples] == [s.prompt for s in again]


def test_prefix_dataset_shares_prefixes(tokenizer: datasets.HFTokenizer) -> None:
    samples = datasets.prefix_dataset(8, 32, 16, 4, num_prefixes=2, seed=1, tokenizer=tokenizer)
    assert samples[0].prompt[:40] == samples[2].prompt[:40]
    assert samples[0].prompt != samples[2].prompt
    assert samples[0].prompt[:40] != samples[1].prompt[:40]
    words = datasets.prefix_dataset(4, 10, 5, 4, num_prefixes=1, seed=1)
    assert all(len(s.prompt.split()) == 15 for s in words)


def test_mix_dataset_draws_long_and_short_from_the_seed() -> None:
    a = datasets.mix_dataset(200, long_len=50, short_len=5, long_fraction=0.25, output_len=4, seed=9)
    b = datasets.mix_dataset(200, long_len=50, short_len=5, long_fraction=0.25, output_len=4, seed=9)
    assert [s.kind for s in a] == [s.kind for s in b]
    longs = [s for s in a if s.kind == "long"]
    assert len(longs) == 50
    assert [s.kind for s in a] != sorted(s.kind for s in a)  # shuffled, not all long first
    assert all(len(s.prompt.split()) == 50 for s in longs)
    assert all(len(s.prompt.split()) == 5 for s in a if s.kind == "short")
