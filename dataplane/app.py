"""Ray Serve application builders: DeploymentSpec -> Serve `Application`.

`build_app` is the import path the control plane puts into Ray Serve's declarative config
(`{"import_path": "baton.dataplane.app:build_app", "args": spec.model_dump(mode="json")}`); it
validates the args as a `DeploymentSpec` first, so a bad spec fails before any deployment exists.

Aggregated mode is Ray Serve LLM's `build_openai_app`. P/D mode follows Ray's `build_pd_openai_app`
(ingress -> decode server -> prefill server) but builds the decode side from
`baton.dataplane.pd.BatonPDDecodeServer`, Baton's seam for the recovery ladder; Ray's builder has no
parameter for that class.

On a cluster with Ray Serve LLM's direct streaming (``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1``, part
of :func:`baton.dataplane.render.ray_cluster_env`) the LLM server itself is the app's ingress (the
aggregated server, or the decode server in P/D), as Ray's own builders do under that flag; without
Ray's ingress request router, since Serve's HAProxy balances the replicas by least connections.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from baton.dataplane.render import DIRECT_STREAMING_ENV, prefill_app_name, render_llm_config
from baton.dataplane.spec import DeploymentSpec

if TYPE_CHECKING:
    from ray.serve.deployment import Application


def ingress_deployment_config(spec: DeploymentSpec) -> dict[str, Any]:
    """Options of the OpenAI ingress deployment: one small replica per app on CPU machines."""
    if spec.device == "cpu":
        return {
            "autoscaling_config": {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1},
            "ray_actor_options": {"num_cpus": 0},
        }
    return {}


def direct_streaming() -> bool:
    """Whether the Ray cluster serves apps with the LLM server as their HTTP ingress (see
    :func:`baton.dataplane.render.ray_cluster_env`)."""
    return os.environ.get(DIRECT_STREAMING_ENV, "0") == "1"


def build_aggregated_app(spec: DeploymentSpec) -> Application:
    """Each replica prefills and decodes (Ray Serve LLM `build_openai_app`; under direct streaming the
    LLM server is the app's ingress, behind Serve's HAProxy with its own load balancing)."""
    from ray import serve
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import LLMConfig, build_llm_deployment, build_openai_app

    if direct_streaming():
        direct: Application = build_llm_deployment(LLMConfig(**render_llm_config(spec, "aggregated")),
                                                   deployment_cls=serve.ingress()(LLMServer))
        return direct
    return build_openai_app(
        {
            "llm_configs": [LLMConfig(**render_llm_config(spec, "aggregated"))],
            "ingress_deployment_config": ingress_deployment_config(spec),
        }
    )


def _pd_args(spec: DeploymentSpec) -> Any:
    """Ray's own validation of a P/D pair (same model id, kv_transfer_config on both sides, decode's NIXL
    side-channel port base shifted off prefill's)."""
    from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs

    return PDServingArgs.model_validate(
        {
            "prefill_config": render_llm_config(spec, "prefill"),
            "decode_config": render_llm_config(spec, "decode"),
            "ingress_deployment_config": ingress_deployment_config(spec),
        }
    )


def _prefill_deployment(spec: DeploymentSpec, args: Any, *, ingress: bool) -> Any:
    from ray import serve
    from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDPrefillServer
    from ray.serve.llm import build_llm_deployment

    cls: Any = serve.ingress()(PDPrefillServer) if ingress else PDPrefillServer
    return build_llm_deployment(args.prefill_config, name_prefix="Prefill:", deployment_cls=cls)


def _openai_ingress_app(spec: DeploymentSpec, args: Any, llm_config: Any, deployment: Any) -> Application:
    """Ray's OpenAI ingress deployment in front of one LLM deployment (clusters without direct streaming)."""
    from ray import serve
    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.serve.llm.ingress import make_fastapi_ingress

    ingress_cls = args.ingress_cls_config.ingress_cls
    options = maybe_apply_llm_deployment_config_defaults(
        ingress_cls.get_deployment_options([llm_config]), args.ingress_deployment_config
    )
    model_id = llm_config.model_id
    ingress: Any = serve.deployment(make_fastapi_ingress(ingress_cls), **options)
    app: Application = ingress.bind(
        llm_deployments={model_id: deployment},
        model_cards={model_id: to_model_metadata(model_id, llm_config)},
        lora_paths={},
        **args.ingress_cls_config.ingress_extra_kwargs,
    )
    return app


def build_prefill_app(args: dict[str, Any]) -> Application:
    """Serve import-path entry of a P/D deployment's prefill pool (:func:`render.prefill_app_name`).

    The pool is an application of its own so that it is reachable over HTTP as well as by the decode
    servers' handle: Ray's prefill server is a whole LLM server (a request without the connector's
    ``kv_transfer_params`` is prefilled and decoded there), which the gateway uses when the decode pool
    has no live replica."""
    spec = DeploymentSpec.model_validate(args)
    pd = _pd_args(spec)
    if direct_streaming():
        direct: Application = _prefill_deployment(spec, pd, ingress=True)
        return direct
    return _openai_ingress_app(spec, pd, pd.prefill_config, _prefill_deployment(spec, pd, ingress=False))


def build_pd_app(spec: DeploymentSpec) -> Application:
    """The decode pool of a P/D deployment, with the KV handed off by the connector (NIXL) from the
    prefill pool, which runs as the application :func:`render.prefill_app_name` (:func:`build_prefill_app`)."""
    from ray import serve
    from ray.serve.llm import build_llm_deployment

    from baton.dataplane.pd import BatonPDDecodeServer

    args = _pd_args(spec)
    # The prefill deployment's name as Ray's builder gives it (the handle is looked up by name).
    prefill_name = _prefill_deployment(spec, args, ingress=False)._bound_deployment.name
    decode_cls: Any = BatonPDDecodeServer  # an LLMServer subclass in Ray's code
    if direct_streaming():
        # The decode server is the app's ingress: its own chat/completions (prefill, then decode) serve
        # HTTP; Ray's PDOrchestratorMixin re-points vLLM's native routes at them.
        decode_cls = serve.ingress()(BatonPDDecodeServer)
    decode = build_llm_deployment(
        args.decode_config,
        name_prefix="Decode:",
        bind_kwargs={"prefill_server": None, "prefill_app": prefill_app_name(spec),
                     "prefill_deployment": prefill_name},
        deployment_cls=decode_cls,
    )
    if direct_streaming():
        return decode
    return _openai_ingress_app(spec, args, args.decode_config, decode)


def build_spec_app(spec: DeploymentSpec) -> Application:
    """The Serve application of a validated spec."""
    return build_pd_app(spec) if spec.mode == "pd" else build_aggregated_app(spec)


def serve_run(spec: DeploymentSpec, *, route_prefix: str | None = None) -> None:
    """Runs the spec's applications with ``serve.run`` (development and tests; production goes through
    the declarative config of :func:`render.render_serve_config`); returns once they run. A P/D
    deployment's prefill application is run first: the decode servers look its deployment up."""
    from ray import serve

    from baton.dataplane.render import prefill_route

    if spec.mode == "pd":
        serve.run(build_prefill_app(spec.model_dump(mode="json")), name=prefill_app_name(spec),
                  route_prefix=prefill_route(spec))
    serve.run(build_spec_app(spec), name=spec.name, route_prefix=route_prefix or spec.route_prefix)


def build_app(args: dict[str, Any]) -> Application:
    """Ray Serve import-path entry point: `args` is `DeploymentSpec.model_dump(mode="json")`."""
    return build_spec_app(DeploymentSpec.model_validate(args))
