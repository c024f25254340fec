"""The cluster files and the GPU serve config must agree: a deployment that asks for a pool no node
type provides would sit pending forever on a real cluster. Checked here, on a machine without GPUs."""

from pathlib import Path

import pytest
import yaml

from tandem.config import DEPLOYMENT_NAMES, load_tandem_config

ROOT = Path(__file__).resolve().parents[2]
POOLS = {"VisionEncoder": "tandem_vision", "SmallReasoner": "tandem_small", "LargeAnswerer": "tandem_large",
         "Router": "tandem_router"}


def load(path: str):
    return yaml.safe_load((ROOT / path).read_text())


def gpu_deployments() -> dict:
    app = load("serve_config.gpu.yaml")["applications"][0]
    return {d["name"]: d for d in app["deployments"]}


def launcher_pools() -> dict[str, dict]:
    return {name: t for name, t in load("cluster/aws.yaml")["available_node_types"].items()}


def kuberay_pools() -> dict[str, dict]:
    groups = load("cluster/kuberay-rayservice.yaml")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {g["groupName"]: g for g in groups}


def _kuberay_resources(group: dict) -> dict:
    return yaml.safe_load(yaml.safe_load(group["rayStartParams"]["resources"]))


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in
                                        [*ROOT.glob("*.yaml"), *(ROOT / "cluster").glob("*.yaml")]))
def test_every_yaml_file_parses(path):
    assert load(path)


def test_gpu_config_validates_without_gpus():
    app = load("serve_config.gpu.yaml")["applications"][0]
    config = load_tandem_config(app["args"])
    assert config.small.model == "Qwen/Qwen3-VL-2B-Thinking" and config.large.model == "Qwen/Qwen3-VL-8B-Instruct"
    assert config.small.dtype == config.large.dtype == "bfloat16"
    assert {d["name"] for d in app["deployments"]} == set(DEPLOYMENT_NAMES)


def test_documented_32b_variant_validates():
    """cluster/README.md's 32B overlay: the large model and the LargeAnswerer's GPUs."""
    app = load("serve_config.gpu.yaml")["applications"][0]
    args = dict(app["args"], large=dict(app["args"]["large"], model="Qwen/Qwen3-VL-32B-Instruct", device="auto"))
    assert load_tandem_config(args).large.device == "auto"
    assert "Qwen/Qwen3-VL-32B-Instruct" in (ROOT / "cluster" / "README.md").read_text()


def test_each_deployment_is_pinned_to_its_own_pool_with_gpus_where_it_needs_them():
    deps = gpu_deployments()
    for name, pool in POOLS.items():
        opts = deps[name]["ray_actor_options"]
        assert set(opts["resources"]) == {pool}, name
        assert "autoscaling_config" in deps[name] and deps[name]["autoscaling_config"]["max_replicas"] > 1
    assert deps["Router"]["ray_actor_options"].get("num_gpus", 0) == 0
    assert 0 < deps["VisionEncoder"]["ray_actor_options"]["num_gpus"] < 1  # fractional: shares a GPU
    assert deps["SmallReasoner"]["ray_actor_options"]["num_gpus"] >= 1
    assert deps["LargeAnswerer"]["ray_actor_options"]["num_gpus"] >= 1


@pytest.mark.parametrize("pools, resources_of, gpus_of", [
    (launcher_pools, lambda t: t["resources"], lambda t: t["resources"].get("GPU", 0)),
    (kuberay_pools, _kuberay_resources, lambda g: int(g["rayStartParams"].get("num-gpus", 0))),
])
def test_cluster_files_provide_every_pool_the_serve_config_asks_for(pools, resources_of, gpus_of):
    provided = {}
    for node in pools().values():
        for resource, amount in resources_of(node).items():
            if resource.startswith("tandem_"):
                provided[resource] = (amount, gpus_of(node))
    for name, dep in gpu_deployments().items():
        opts = dep["ray_actor_options"]
        (resource, per_replica), = opts["resources"].items()
        assert resource in provided, f"{name} asks for {resource}; no node provides it"
        per_node, node_gpus = provided[resource]
        replicas_per_node = per_node // per_replica
        assert replicas_per_node >= 1
        assert replicas_per_node * opts.get("num_gpus", 0) <= node_gpus, f"{name}: pool has too few GPUs"
    assert set(provided) == set(POOLS.values())  # no pool without a deployment


def test_kuberay_embeds_the_gpu_serve_config_verbatim():
    embedded = yaml.safe_load(load("cluster/kuberay-rayservice.yaml")["spec"]["serveConfigV2"])
    assert embedded == load("serve_config.gpu.yaml")


def test_kuberay_gpu_groups_request_gpus_and_tolerate_gpu_taints():
    for name, group in kuberay_pools().items():
        spec = group["template"]["spec"]
        limits = spec["containers"][0]["resources"]["limits"]
        if name.startswith("gpu-"):
            assert limits["nvidia.com/gpu"] == int(group["rayStartParams"]["num-gpus"])
            assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
            assert spec["nodeSelector"]
        else:
            assert "nvidia.com/gpu" not in limits
        assert group["minReplicas"] <= group["maxReplicas"]
