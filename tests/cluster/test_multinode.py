"""Pools and autoscaling on a simulated multi-node cluster (ray.cluster_utils.Cluster): one node per
pool, each carrying only its pool's custom resource, running the real app with tiny models. Checks
every replica lands on a node of its pool, and that a burst scales a model deployment up and, after
it, back down, with every request succeeding throughout."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serve.conftest import ROOT, _free_port, deploy

pytestmark = pytest.mark.serve

POOLS = {"Router": "tandem_router", "VisionEncoder": "tandem_vision", "SmallReasoner": "tandem_small",
         "LargeAnswerer": "tandem_large"}


def pooled_config() -> dict:
    """serve_config.yaml with each deployment pinned to its pool, and short autoscaling delays on the
    large answerer (test-only numbers: seconds, not minutes)."""
    import yaml

    app = copy.deepcopy(yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0])
    for dep in app["deployments"]:
        dep["ray_actor_options"] = {"num_cpus": 0, "resources": {POOLS[dep["name"]]: 1}}
        if dep["name"] == "LargeAnswerer":
            dep.pop("num_replicas")
            dep["user_config"] = {"max_batch_size": 1, "batch_wait_timeout_s": 0.0}
            dep["max_ongoing_requests"] = 4
            dep["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                                         "upscale_delay_s": 1, "downscale_delay_s": 4, "look_back_period_s": 11}
    return app


@pytest.fixture(scope="module")
def cluster_url():
    # Replicas and handles report load every 0.5 s (the default 10 s would make this test slow).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
        env.setenv("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
        yield from _cluster()


def _cluster():
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {pool: cluster.add_node(num_cpus=1, resources={pool: 2}) for pool in POOLS.values()}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy([pooled_config()])
        yield f"http://127.0.0.1:{port}", {pool: node.node_id for pool, node in nodes.items()}
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def replica_nodes() -> dict[str, list[str]]:
    """Deployment name -> node ids of its live replica actors, from the GCS actor table."""
    from ray._private.state import actors

    placed: dict[str, list[str]] = {}
    for info in actors(actor_state_name="ALIVE").values():
        name = info["ActorClassName"]
        if name.startswith("ServeReplica:tandem:"):
            placed.setdefault(name.rsplit(":", 1)[1], []).append(info["Address"]["NodeID"])
    return placed


def running_replicas(deployment: str) -> int:
    from ray import serve

    states = serve.status().applications["tandem"].deployments[deployment].replica_states
    return states.get("RUNNING", 0)


def test_every_replica_lands_on_its_pool(cluster_url):
    url, pool_nodes = cluster_url
    placed = replica_nodes()
    assert set(placed) == set(POOLS)
    for deployment, node_ids in placed.items():
        assert set(node_ids) == {pool_nodes[POOLS[deployment]]}, deployment
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "tandem:mutual", "max_tokens": 4, "messages": [{"role": "user", "content": "ping?"}]})
    assert r.status_code == 200 and r.json()["tandem"]["path"] in ("agree", "transfer")


def test_burst_scales_large_answerer_up_then_down_with_no_failures(cluster_url):
    url, pool_nodes = cluster_url
    assert running_replicas("LargeAnswerer") == 1
    stop = threading.Event()
    statuses: list[int] = []

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "model": "tandem:large_reasoning", "max_tokens": 2,
                "messages": [{"role": "user", "content": f"burst {i} {n}?"}]})
            statuses.append(r.status_code)
            n += 1

    peak = 1
    with ThreadPoolExecutor(6) as pool:
        for i in range(6):
            pool.submit(client, i)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and peak < 2:
            peak = max(peak, running_replicas("LargeAnswerer"))
            time.sleep(0.5)
        placed_at_peak = replica_nodes()["LargeAnswerer"]
        time.sleep(2)  # the new replica serves part of the burst
        stop.set()
    assert peak == 2
    assert placed_at_peak == [pool_nodes["tandem_large"]] * 2  # the new replica landed in the large pool too
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests, statuses {set(statuses)}"

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and running_replicas("LargeAnswerer") > 1:
        time.sleep(1)
    assert running_replicas("LargeAnswerer") == 1
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "tandem:large", "max_tokens": 2, "messages": [{"role": "user", "content": "after?"}]})
    assert r.status_code == 200
