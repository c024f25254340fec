"""One local Ray cluster and Serve instance for the whole Serve test session, with two Tandem apps
deployed from serve_config.yaml through the controller's config path (what `serve deploy` does):
`tandem` (random-init tiny small + tiny large, chosen because they disagree on everything, so a
`mutual` request always transfers) and `agree` (the same tiny checkpoint in both roles: greedy
answers agree; API keys on; its Router admits 4 chat requests at a time and its LargeAnswerer one,
queueing one more, so overload is easy to provoke). Torn down at the end.

`TANDEM_TEST_ENGINE=vllm` (scripts/test-vllm.sh, in .venv-vllm) deploys the same two apps with
`engine: vllm`, so every Serve test runs against vLLM too: the small role is then tiny:small-h32
(vLLM's CPU attention takes heads of 32 and up; tiny:small's are 16)."""

from __future__ import annotations

import copy
import os
import socket
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TEST_BATCH = {"max_batch_size": 8, "batch_wait_timeout_s": 0.05}
FORCED_BATCH = {"max_batch_size": 8, "batch_wait_timeout_s": 0.5, "batch_wait_mode": "always"}
API_KEY = "test-key-1"
ENGINE = os.environ.get("TANDEM_TEST_ENGINE", "transformers")
# serve_config.vllm-cpu.yaml's engine arguments.
VLLM_CPU = {"enforce_eager": True, "block_size": 32, "max_model_len": 8192, "max_num_seqs": 32, "cpu_kv_cache_gib": 1}


def _model(ref: str, reasoning_format: str) -> dict:
    if ENGINE != "vllm":
        return {"model": ref, "reasoning_format": reasoning_format}
    return {"model": {"tiny:small": "tiny:small-h32"}.get(ref, ref), "reasoning_format": reasoning_format,
            "vllm": dict(VLLM_CPU)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_configs(large_batch: dict | None = None, *, forced_batches: bool = False) -> list[dict]:
    """The two test apps. `forced_batches`: every batching deployment of `tandem` waits long enough
    (`FORCED_BATCH`) that requests sent together are batched together — the fault-isolation tests
    need that whatever the default waits become."""
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]
    tandem = copy.deepcopy(base)
    tandem["args"]["small"] = _model("tiny:small", "think_tags")
    tandem["args"]["large"] = _model("tiny:large", "prompted")
    tandem["args"]["engine"] = ENGINE
    for dep in tandem["deployments"]:
        if dep["name"] in ("SmallReasoner", "LargeAnswerer"):
            dep["user_config"] = dict(FORCED_BATCH if forced_batches else TEST_BATCH)
        if dep["name"] == "LargeAnswerer" and large_batch:
            dep["user_config"] = dict(large_batch)
        if dep["name"] == "VisionEncoder" and forced_batches:
            dep["user_config"] = dict(dep.get("user_config") or {}, **FORCED_BATCH)
    agree = copy.deepcopy(tandem)
    agree.update(name="agree", route_prefix="/agree")
    agree["args"]["small"] = _model("tiny:large", "prompted")
    agree["args"]["http"] = dict(agree["args"]["http"], api_keys_env="TANDEM_API_KEYS", max_in_flight=4)
    agree["runtime_env"] = {"env_vars": dict(agree["runtime_env"]["env_vars"], TANDEM_API_KEYS=f"{API_KEY},other")}
    for dep in agree["deployments"]:
        if dep["name"] == "LargeAnswerer":
            dep.update(max_ongoing_requests=1, max_queued_requests=1)
    return [tandem, agree]


# How long the apps may take to come up. Four vLLM engines (two apps, two generators each) start at
# once on the 2-core test machine: in one CI run the last was still starting when the
# old 240 s wait ran out, its engine ready a second before (156 s from the replica's start to its
# weights, 53 s of engine profile and warm-up), the others healthy; every Serve test then errored.
# A start-up budget, not a measurement: a replica that really hangs still fails the run, after this long.
DEPLOY_TIMEOUT_S = 600 if ENGINE == "vllm" else 240


def deploy(configs: list[dict], timeout_s: float = DEPLOY_TIMEOUT_S) -> None:
    from ray import serve
    from ray.serve._private.api import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema(applications=configs))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        apps = serve.status().applications
        states = {name: apps[name].status for name in (c["name"] for c in configs) if name in apps}
        if len(states) == len(configs) and all(s == "RUNNING" for s in states.values()):
            return
        if any(s in ("DEPLOY_FAILED", "UNHEALTHY") for s in states.values()):
            raise RuntimeError(f"deploy failed: {[(n, apps[n].message) for n in states]}")
        time.sleep(1)
    raise TimeoutError(f"apps not RUNNING after {timeout_s} s: {serve.status().applications}")


@pytest.fixture(scope="session")
def serve_url():
    import ray
    from ray import serve

    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy(app_configs())
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def handle(deployment: str, app: str = "tandem"):
    from ray import serve

    return serve.get_deployment_handle(deployment, app_name=app)
