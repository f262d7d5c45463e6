"""`baton serve ...`: deployment specs and Ray Serve applications of the data plane."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Deployment specs and Ray Serve applications.", no_args_is_help=True)

SpecArg = Annotated[Path, typer.Argument(help="Deployment spec (JSON file, or - for stdin).")]


def _load_spec(path: Path) -> Any:
    from pydantic import ValidationError

    from baton.dataplane.spec import DeploymentSpec

    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    try:
        return DeploymentSpec.model_validate_json(text)
    except ValidationError as err:
        typer.echo(f"invalid deployment spec:\n{err}", err=True)
        raise typer.Exit(2) from None


@app.command("example")
def example(
    model: Annotated[str, typer.Option(help="Model folder (e.g. from `baton model make-tiny`).")],
    name: Annotated[str, typer.Option(help="Deployment name.")] = "tiny",
    served_name: Annotated[str, typer.Option(help="Model name clients send.")] = "tiny",
    mode: Annotated[str, typer.Option(help="aggregated or pd.")] = "pd",
    redis_url: Annotated[str | None, typer.Option(help="LMCache Redis tier, e.g. redis://127.0.0.1:6379.")] = None,
) -> None:
    """Print a deployment spec for a model folder (CPU profile, small KV cache)."""
    from baton.dataplane.spec import DeploymentSpec

    kv: dict[str, Any] = {"connector": "nixl" if mode == "pd" else "none"}
    if redis_url:
        kv["lmcache"] = {"redis_url": redis_url, "local_cpu_gib": 0.25}
    spec = DeploymentSpec(
        name=name,
        model={"path": str(Path(model).resolve()), "served_name": served_name},
        mode=mode,
        engine={"kv_cache_space_gib": 0.25, "max_num_seqs": 16},
        kv=kv,
    )
    typer.echo(json.dumps(spec.model_dump(mode="json"), indent=2))


@app.command("validate")
def validate(spec: SpecArg) -> None:
    """Validate a deployment spec (exit 2 with the reasons if it is invalid)."""
    s = _load_spec(spec)
    typer.echo(f"ok: {s.name} ({s.mode}, {s.device})")


@app.command("render")
def render(
    spec: SpecArg,
    port: Annotated[int, typer.Option(help="Ray Serve HTTP proxy port.")] = 8001,
) -> None:
    """Print the Ray Serve config (for `PUT /api/serve/applications/`) of a spec."""
    from baton.dataplane.render import render_serve_config

    typer.echo(json.dumps(render_serve_config([_load_spec(spec)], http_port=port), indent=2))


@app.command("run")
def run(
    spec: SpecArg,
    port: Annotated[int, typer.Option(help="Ray Serve HTTP proxy port (Baton's gateway owns 8000).")] = 8001,
    num_cpus: Annotated[int, typer.Option(help="CPUs Ray may hand out (replicas ask fractions).")] = 8,
) -> None:
    """Run a spec on a local, loopback-only Ray cluster until interrupted (development helper)."""
    import time

    s = _load_spec(spec)
    import ray
    from ray import serve

    from baton.dataplane.app import serve_run
    from baton.dataplane.render import ray_cluster_env

    os.environ.update(ray_cluster_env())  # the cluster's processes inherit it
    ray.init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    route = s.route_prefix
    serve_run(s)
    base = f"http://127.0.0.1:{port}{route.rstrip('/')}/v1"
    typer.echo(f"{s.name} is running: OpenAI base URL {base}, model {s.model.served_name!r}. Ctrl-C stops it.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
