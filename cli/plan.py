"""``baton plan``: should a model be disaggregated, and at which P:D ratio? (the planner's cost model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from baton.core.contracts import DTYPE_BYTES


def register(app: typer.Typer) -> None:
    app.command(name="plan")(plan)


def _shape_from_dir(path: Path) -> dict[str, Any]:
    cfg = json.loads((path / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").removeprefix("torch.")
    return {
        "name": path.name,
        "num_layers": int(cfg["num_hidden_layers"]),
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        "dtype": dtype if dtype in DTYPE_BYTES else "float32",  # a size the KV formula knows
        "params_b": None,
    }


def plan(  # noqa: PLR0917 (a command: one parameter per option)
    model: Annotated[str | None, typer.Option(help="Catalogue model name: its shape and, with --calibrate, "
                                                   "its measured request records.")] = None,
    model_dir: Annotated[Path | None, typer.Option(help="A model folder (reads config.json).")] = None,
    layers: Annotated[int | None, typer.Option(help="Shape without a model: layers.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="Shape without a model: KV heads.")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Shape without a model: head dim.")] = None,
    dtype: Annotated[str, typer.Option(help="Shape without a model: dtype.")] = "bfloat16",
    params_b: Annotated[float | None, typer.Option(help="Parameters in billions (weights in memory).")] = None,
    ttft_ms: Annotated[float, typer.Option(help="TTFT SLO (ms).")] = 1000.0,
    tpot_ms: Annotated[float, typer.Option(help="TPOT SLO (ms).")] = 50.0,
    percentile: Annotated[float, typer.Option(help="SLO percentile.")] = 90.0,
    prompt_mean: Annotated[float, typer.Option(help="Mean prompt tokens.")] = 1024.0,
    output_mean: Annotated[float, typer.Option(help="Mean output tokens.")] = 128.0,
    cv: Annotated[float, typer.Option(help="Coefficient of variation of the lengths (lognormal).")] = 0.5,
    rate: Annotated[float | None, typer.Option(help="Total arrival rate (req/s): count replicas needed.")] = None,
    bandwidth: Annotated[float | None, typer.Option(help="KV link, GB/s (default: settings).")] = None,
    prefill_tps: Annotated[float | None, typer.Option(help="Prefill tokens/s of one replica.")] = None,
    decode_step_ms: Annotated[float | None, typer.Option(help="Decode step at batch 1 (ms).")] = None,
    decode_ms_per_seq: Annotated[float | None, typer.Option(help="Extra step ms per batched sequence.")] = None,
    memory_gib: Annotated[float | None, typer.Option(help="Memory per replica for weights + KV (GiB).")] = None,
    calibrate: Annotated[bool, typer.Option(help="With --model: calibrate from request records.")] = False,
    out: Annotated[Path | None, typer.Option(help="Write plan.json, plan.png and plan.svg here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object (what plan.json "
                                                         "holds) instead of the table, for scripts.")] = False,
) -> None:
    """Goodput per GPU within the SLO for aggregated serving and each P:D ratio, and a recommendation."""
    from rich.console import Console
    from rich.table import Table

    from baton.control import pd_cost_model as cost
    from baton.core.settings import load_settings

    settings = load_settings()
    c = settings.control
    records: list[dict[str, Any]] = []
    if model:
        from baton.core import models as m
        from baton.core.db import Database

        db = Database.for_services(settings)
        try:
            with db.system() as uow:
                row = uow.models.by_name(model)
                if row is None:
                    raise typer.BadParameter(f"no model named {model!r} in the catalogue", param_hint="--model")
                shape = cost.ModelShape(row.num_layers, row.num_kv_heads, row.head_dim, row.dtype, row.params_b)
                if calibrate:
                    recs = uow.requests.scalars(
                        uow.requests.query(model=row.name, status=m.RequestStatus.COMPLETED).limit(5000))
                    records = [{k: getattr(r, k) for k in ("prompt_tokens", "completion_tokens", "ttft_ms",
                                                           "tpot_ms", "handoff_ms", "kv_bytes", "started_at")}
                               for r in recs]
        finally:
            db.dispose()
    elif model_dir:
        s = _shape_from_dir(model_dir)
        shape = cost.ModelShape(s["num_layers"], s["num_kv_heads"], s["head_dim"], s["dtype"], params_b)
    elif layers and kv_heads and head_dim:
        shape = cost.ModelShape(layers, kv_heads, head_dim, dtype, params_b)
    else:
        raise typer.BadParameter("give --model, --model-dir, or --layers/--kv-heads/--head-dim")

    hw = cost.Hardware(
        prefill_tokens_per_s=prefill_tps or c.prefill_tokens_per_s,
        decode_step_ms=decode_step_ms or c.decode_step_ms,
        decode_ms_per_seq=c.decode_ms_per_seq if decode_ms_per_seq is None else decode_ms_per_seq,
        memory_bytes=memory_gib * 2**30 if memory_gib else None,
        link_bandwidth_gbps=bandwidth or settings.telemetry.link_bandwidth_gbps,
    )
    traffic = cost.Traffic.lognormal(prompt_mean=prompt_mean, output_mean=output_mean, cv=cv, arrival_rate=rate)
    cal = cost.calibrate(records, hw) if records else None
    if cal:
        hw, traffic = cal.hardware, cal.traffic if rate is None else cost.Traffic(
            cal.traffic.prompt_tokens, cal.traffic.output_tokens, rate)
    result = cost.plan(shape, hw, traffic, cost.Slo(ttft_ms, tpot_ms, percentile))

    if as_json:
        typer.echo(json.dumps(result.as_dict(), default=str))
        if out:
            _write(out, result)
        return
    console = Console()
    console.print(f"KV per token {result.kv_bytes_per_token:,} B; per request {result.kv_bytes_per_request:,.0f} B "
                  f"(p99 {result.kv_bytes_p99:,.0f} B); transfer >= {result.transfer_lower_bound_ms:.3f} ms at "
                  f"{hw.link_bandwidth_gbps:g} GB/s" + (f"; calibrated from {cal.samples} records" if cal else ""))
    table = Table("config", "replicas", "goodput/GPU (req/s)", f"TTFT p{percentile:g} ms",
                  f"TPOT p{percentile:g} ms", "limited by", "replicas needed")
    for r in result.configs:
        mark = " *" if r.name == result.recommended else ""
        table.add_row(r.name + mark, str(r.gpus), f"{r.goodput_per_gpu:.4g}", f"{r.ttft_ms:.4g}", f"{r.tpot_ms:.4g}",
                      r.bottleneck, "" if r.gpus_needed is None else str(r.gpus_needed))
    console.print(table)
    console.print(result.reason)
    if out:
        _write(out, result)
        console.print(f"wrote {out}/plan.json, plan.png, plan.svg")


def _write(out: Path, result: Any) -> None:
    from baton.control import pd_cost_model as cost

    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(result.as_dict(), indent=2, default=str))
    (out / "plan.png").write_bytes(cost.render_plot(result, "png"))
    (out / "plan.svg").write_bytes(cost.render_plot(result, "svg"))
