"""The cluster files and the GPU serve config must agree: a deployment that asks for a pool no node
type provides would sit pending forever on a real cluster. Checked here, on a machine without GPUs."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from tandem.config import DEPLOYMENT_NAMES, load_tandem_config

ROOT = Path(__file__).resolve().parents[2]
POOLS = {"VisionEncoder": "tandem_vision", "SmallReasoner": "tandem_small", "LargeAnswerer": "tandem_large",
         "Router": "tandem_router"}


# What the node types named by the cluster files have (AWS's published sizes): vCPUs, GiB, GPUs.
INSTANCE_TYPES = {"m6i.2xlarge": (8, 32, 0), "g6.xlarge": (4, 16, 1), "g6.2xlarge": (8, 32, 1),
                  "g6.4xlarge": (16, 64, 1), "g6e.xlarge": (4, 32, 1), "g6e.2xlarge": (8, 64, 1)}
SCHEDULABLE = 0.85  # of a node's capacity a pod may ask for: the kubelet and system reserve the rest
KUBERAY_GROUP = {"gpu_vision": "gpu-vision", "gpu_small": "gpu-small", "gpu_large": "gpu-large",
                 "cpu_router": "cpu-router"}


def load(path: str):
    """A YAML file's one document; for the KubeRay manifest, its RayService."""
    docs = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]
    if len(docs) > 1:
        docs = [d for d in docs if d.get("kind") == "RayService"]
    return docs[0]


GPU_CONFIGS = ["serve_config.gpu.yaml", "serve_config.vllm-gpu.yaml"]  # transformers and vLLM engines


def gpu_deployments(path: str = "serve_config.gpu.yaml") -> dict:
    app = load(path)["applications"][0]
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


def test_vllm_gpu_config_is_the_gpu_config_with_the_model_servers_on_vllm():
    plain, vllm = (load(p)["applications"][0] for p in GPU_CONFIGS)
    config = load_tandem_config(vllm["args"])
    assert config.engine == "vllm" and config.selector.kind != "attention"
    assert (config.small.model, config.large.model) == (plain["args"]["small"]["model"], plain["args"]["large"]["model"])
    def same_part(args: dict) -> dict:
        """All but the models, the engine and the deadlines (sized per engine from its decode step)."""
        out = {k: v for k, v in args.items() if k not in ("small", "large", "engine")}
        out["limits"] = {k: v for k, v in out["limits"].items() if k != "stage_timeout_s"}
        out["http"] = {k: v for k, v in out["http"].items() if k != "request_timeout_s"}
        return out
    assert same_part(vllm["args"]) == same_part(plain["args"])
    assert config.large.vllm.max_model_len >= config.limits.max_prompt_tokens + config.limits.max_request_tokens


def test_documented_vllm_32b_variant_validates():
    """cluster/README.md's 32B overlay on vLLM: tensor-parallel over a placement group of 2 GPUs."""
    text = (ROOT / "cluster" / "README.md").read_text()
    block = text[text.index("**32B answerer on vLLM**"):]
    overlay = yaml.safe_load(block[block.index("```yaml") + 7:block.index("```", block.index("```yaml") + 7)])
    app = load("serve_config.vllm-gpu.yaml")["applications"][0]
    args = dict(app["args"], large=overlay["large"])
    config = load_tandem_config(args)
    assert config.large.vllm.tensor_parallel_size == 2
    bundles = overlay["LargeAnswerer"]["placement_group_bundles"]
    assert sum(b.get("GPU", 0) for b in bundles) == config.large.vllm.tensor_parallel_size
    assert overlay["LargeAnswerer"]["ray_actor_options"].get("num_gpus", 0) == 0  # the shards hold the GPUs


@pytest.mark.parametrize("path", GPU_CONFIGS)
def test_each_deployment_is_pinned_to_its_own_pool_with_gpus_where_it_needs_them(path):
    deps = gpu_deployments(path)
    for name, pool in POOLS.items():
        opts = deps[name]["ray_actor_options"]
        assert set(opts["resources"]) == {pool}, name
        assert "autoscaling_config" in deps[name] and deps[name]["autoscaling_config"]["max_replicas"] > 1
    assert deps["Router"]["ray_actor_options"].get("num_gpus", 0) == 0
    assert 0 < deps["VisionEncoder"]["ray_actor_options"]["num_gpus"] < 1  # fractional: shares a GPU
    assert deps["SmallReasoner"]["ray_actor_options"]["num_gpus"] >= 1
    assert deps["LargeAnswerer"]["ray_actor_options"]["num_gpus"] >= 1


@pytest.mark.parametrize("path", GPU_CONFIGS)
@pytest.mark.parametrize("pools, resources_of, gpus_of", [
    (launcher_pools, lambda t: t["resources"], lambda t: t["resources"].get("GPU", 0)),
    (kuberay_pools, _kuberay_resources, lambda g: int(g["rayStartParams"].get("num-gpus", 0))),
])
def test_cluster_files_provide_every_pool_the_serve_config_asks_for(pools, resources_of, gpus_of, path):
    provided = {}
    for node in pools().values():
        for resource, amount in resources_of(node).items():
            if resource.startswith("tandem_"):
                provided[resource] = (amount, gpus_of(node))
    for name, dep in gpu_deployments(path).items():
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


def _kuberay_pods() -> dict[str, dict]:
    cluster = load("cluster/kuberay-rayservice.yaml")["spec"]["rayClusterConfig"]
    pods = {"head": cluster["headGroupSpec"]}
    pods.update({g["groupName"]: g for g in cluster["workerGroupSpecs"]})
    return pods


def _gib(quantity: str) -> float:
    units = {"Gi": 1, "Mi": 1 / 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[:-len(suffix)]) * factor
    raise AssertionError(f"memory quantity {quantity!r}: use Gi or Mi")


def test_every_pod_asks_for_less_than_its_node_type_can_give():
    for name, group in _kuberay_pods().items():
        spec = group["template"]["spec"]
        node = spec["nodeSelector"]["node.kubernetes.io/instance-type"]
        assert node in INSTANCE_TYPES, f"{name}: node type {node} is not in the table"
        cpus, gib, gpus = INSTANCE_TYPES[node]
        for container in spec["containers"]:
            req = container["resources"]["requests"]
            assert float(req["cpu"]) <= SCHEDULABLE * cpus, f"{name}: {req['cpu']} CPU on a {cpus}-vCPU {node}"
            assert _gib(req["memory"]) <= SCHEDULABLE * gib, f"{name}: {req['memory']} on a {gib} GiB {node}"
            assert int(req.get("nvidia.com/gpu", 0)) <= gpus
            assert container["resources"]["limits"]["memory"] == req["memory"]  # no overcommit of memory


def test_ray_resources_on_each_node_cover_the_replicas_placed_there():
    deps = gpu_deployments()
    for name, group in kuberay_pools().items():
        tandem = {k: v for k, v in _kuberay_resources(group).items() if k.startswith("tandem_")}
        for resource, slots in tandem.items():
            dep = next(d for d, r in POOLS.items() if r == resource)
            opts = deps[dep]["ray_actor_options"]
            replicas = slots // opts["resources"][resource]
            assert replicas * opts.get("num_cpus", 1) <= float(group["rayStartParams"]["num-cpus"]), name


def test_launcher_and_kuberay_use_the_same_node_types():
    launcher = launcher_pools()
    for pool, group in KUBERAY_GROUP.items():
        node = kuberay_pools()[group]["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"]
        assert launcher[pool]["node_config"]["InstanceType"] == node, pool
    for t in launcher.values():
        assert t["node_config"]["InstanceType"] in INSTANCE_TYPES


def test_no_deprecated_rayservice_fields():
    spec = load("cluster/kuberay-rayservice.yaml")["spec"]
    for field in ("serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold"):
        assert field not in spec, f"{field} is deprecated in KubeRay"


def test_every_pod_shares_the_hf_cache_and_may_read_a_token():
    docs = list(yaml.safe_load_all((ROOT / "cluster" / "kuberay-rayservice.yaml").read_text()))
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for name, group in _kuberay_pods().items():
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["hf-cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"], name
        for container in spec["containers"]:
            env = {e["name"]: e for e in container["env"]}
            mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "hf-cache")
            assert env["HF_HOME"]["value"] == mount, name
            assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True, name


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="the image pins .venv's versions; .venv-vllm has vLLM's transformers (scripts/test-vllm.sh)")
def test_the_image_pins_the_versions_tested():
    import importlib.metadata as md

    pins = dict(line.split("==") for line in (ROOT / "cluster" / "constraints-gpu.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    for package in ("torch", "transformers", "accelerate", "tokenizers"):
        assert pins[package] == md.version(package).split("+")[0], package  # +cpu here, a CUDA build there
    assert "torchvision" in pins  # the real Qwen3-VL processors want it
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    assert f"torch=={pins['torch']} torchvision=={pins['torchvision']}" in dockerfile
    assert "-c cluster/constraints-gpu.txt" in dockerfile and "whl/cu" in dockerfile
    assert not any("[" in name for name in pins), "pip refuses extras in a constraints file"
