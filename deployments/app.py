"""The application builder: `serve run serve_config.yaml` calls `build_app(args)`.

Validates `args` into the core's TandemConfig (unknown keys rejected, named) before anything is
bound, then binds the four deployments. Each is separately named so `serve_config.yaml`'s
`deployments:` section can set its resources, autoscaling, queue limits and `user_config`.
"""

from __future__ import annotations

from ray import serve
from ray.serve import Application

from deployments.large_answerer import LargeAnswerer
from deployments.router import Router
from deployments.small_reasoner import SmallReasoner
from deployments.vision_encoder import VisionEncoder
from tandem.config import ROUTER_MAX_ONGOING, TandemConfig, limit_problems, load_tandem_config
from tandem.deploy_checks import drain_defaults

# Defaults sized for one small CPU machine; serve_config.yaml overrides each.
_DEFAULT_OPTIONS = {
    "Router": dict(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=ROUTER_MAX_ONGOING),
    "VisionEncoder": dict(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=32),
    "SmallReasoner": dict(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=32),
    "LargeAnswerer": dict(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=32),
}


def bind_app(config: TandemConfig, options: dict[str, dict] | None = None) -> Application:
    """Bind the four deployments for a validated config; `options` overrides per deployment name.

    A new `user_config` in a redeployed config file (`serve deploy`) reconfigures replicas in place:
    Serve keys the code version on the import path, args and runtime env, not on user_config.
    """
    options = options or {}
    drains = drain_defaults(config)

    def deployment(cls):
        name = cls.__name__
        # A replica being stopped finishes its longest call first (a config file may set more).
        opts = {**_DEFAULT_OPTIONS[name], "graceful_shutdown_timeout_s": drains[name], **options.get(name, {})}
        return serve.deployment(cls, name=name, **opts)

    vision = deployment(VisionEncoder).bind(config)
    small = deployment(SmallReasoner).bind(config)
    large = deployment(LargeAnswerer).bind(config)
    return deployment(Router).bind(vision, small, large, config)


def build_app(args: dict) -> Application:
    """Refuses (before anything is bound) a config whose limits contradict each other, as
    `tandem validate-config` does: a request every HTTP limit admits must not fail in a model server."""
    config = load_tandem_config(args)
    if problems := limit_problems(config):
        raise ValueError("contradictory limits: " + "; ".join(problems))
    return bind_app(config)
