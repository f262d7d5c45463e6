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

from baton.dataplane.render import DIRECT_STREAMING_ENV, render_llm_config
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


def build_pd_app(spec: DeploymentSpec) -> Application:
    """Prefill and decode pools with the KV handed off by the connector (NIXL)."""
    from ray import serve
    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs
    from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDPrefillServer
    from ray.serve.llm import build_llm_deployment
    from ray.serve.llm.ingress import make_fastapi_ingress

    from baton.dataplane.pd import BatonPDDecodeServer

    # Ray's own validation of a P/D pair (same model id, kv_transfer_config on both sides, decode's
    # NIXL side-channel port base shifted off prefill's).
    args: Any = PDServingArgs.model_validate(
        {
            "prefill_config": render_llm_config(spec, "prefill"),
            "decode_config": render_llm_config(spec, "decode"),
            "ingress_deployment_config": ingress_deployment_config(spec),
        }
    )
    prefill_cls: Any = PDPrefillServer
    prefill = build_llm_deployment(args.prefill_config, name_prefix="Prefill:", deployment_cls=prefill_cls)
    decode_cls: Any = BatonPDDecodeServer  # an LLMServer subclass in Ray's code
    if direct_streaming():
        # The decode server is the app's ingress: its own chat/completions (prefill, then decode) serve
        # HTTP; Ray's PDOrchestratorMixin re-points vLLM's native routes at them.
        decode_cls = serve.ingress()(BatonPDDecodeServer)
    decode = build_llm_deployment(
        args.decode_config,
        name_prefix="Decode:",
        bind_kwargs={"prefill_server": prefill},
        deployment_cls=decode_cls,
    )
    if direct_streaming():
        return decode
    ingress_cls = args.ingress_cls_config.ingress_cls
    options = maybe_apply_llm_deployment_config_defaults(
        ingress_cls.get_deployment_options([args.decode_config]), args.ingress_deployment_config
    )
    model_id = args.decode_config.model_id
    ingress: Any = serve.deployment(make_fastapi_ingress(ingress_cls), **options)
    app: Application = ingress.bind(
        llm_deployments={model_id: decode},
        model_cards={model_id: to_model_metadata(model_id, args.decode_config)},
        lora_paths={},
        **args.ingress_cls_config.ingress_extra_kwargs,
    )
    return app


def build_spec_app(spec: DeploymentSpec) -> Application:
    """The Serve application of a validated spec."""
    return build_pd_app(spec) if spec.mode == "pd" else build_aggregated_app(spec)


def build_app(args: dict[str, Any]) -> Application:
    """Ray Serve import-path entry point: `args` is `DeploymentSpec.model_dump(mode="json")`."""
    return build_spec_app(DeploymentSpec.model_validate(args))
