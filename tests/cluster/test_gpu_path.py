"""The GPU path's deployment arithmetic, checked without GPUs: replicas drain their longest call
before they stop and pods outlive the drain; each deployment fits the GPU it is put on; the manifests
are written from the serve configs and state what a cluster needs; the launcher runs the built
image."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tandem.config import load_tandem_config
from tandem.deploy_checks import drain_defaults, drain_problems, gpu_fit, pod_grace_needed

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = {"cluster/kuberay-rayservice.yaml": "serve_config.gpu.yaml",
             "cluster/kuberay-rayservice-vllm.yaml": "serve_config.vllm-gpu.yaml"}


def app_of(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())["applications"][0]


def config_of(path: str):
    return load_tandem_config(app_of(path)["args"])


def pods(manifest: str) -> dict[str, dict]:
    service = next(d for d in yaml.safe_load_all((ROOT / manifest).read_text()) if d and d["kind"] == "RayService")
    cluster = service["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"]["template"]["spec"],
            **{g["groupName"]: g["template"]["spec"] for g in cluster["workerGroupSpecs"]}}


def validate(path: Path, *flags: str):
    return subprocess.run([sys.executable, "-m", "tandem.cli", "validate-config", str(path), *flags],
                          capture_output=True, text=True)


def test_the_manifests_are_written_from_the_serve_configs():
    sys.path.insert(0, str(ROOT / "cluster"))
    import sync_kuberay

    manifest = (ROOT / "cluster/kuberay-rayservice.yaml").read_text()
    assert sync_kuberay.with_serve_config(manifest, "serve_config.gpu.yaml") == manifest
    assert sync_kuberay.vllm_variant(manifest) == (ROOT / "cluster/kuberay-rayservice-vllm.yaml").read_text()


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_every_deployment_drains_its_longest_call_and_every_pod_outlives_the_drains(manifest):
    app, config = app_of(MANIFESTS[manifest]), config_of(MANIFESTS[manifest])
    assert drain_problems(config, app["deployments"]) == []
    for dep in app["deployments"]:  # set in the file, where an operator sees it
        assert dep["graceful_shutdown_timeout_s"] >= drain_defaults(config)[dep["name"]], dep["name"]
    assert drain_defaults(config)["Router"] > config.http.request_timeout_s
    assert drain_defaults(config)["LargeAnswerer"] > config.limits.stage_timeout_s
    for name, spec in pods(manifest).items():
        assert spec["terminationGracePeriodSeconds"] >= pod_grace_needed(config, app["deployments"]), name
        assert spec["terminationGracePeriodSeconds"] > max(d["graceful_shutdown_timeout_s"] for d in app["deployments"])


def test_a_drain_shorter_than_the_longest_call_is_refused(tmp_path):
    text = (ROOT / "serve_config.gpu.yaml").read_text().replace("graceful_shutdown_timeout_s: 125",
                                                                 "graceful_shutdown_timeout_s: 20")
    (tmp_path / "c.yaml").write_text(text)
    out = validate(tmp_path / "c.yaml")
    assert out.returncode != 0
    assert "'Router': graceful_shutdown_timeout_s (20) is below its longest call (http.request_timeout_s)" in out.stderr


def test_a_stage_deadline_shorter_than_the_longest_reasoning_is_refused(tmp_path):
    import json

    profile = {"generators": {role: {"step": [{"batch": 1, "ms": 20.0}, {"batch": 16, "ms": 50.0},
                                              {"batch": 64, "ms": 80.0}]} for role in ("small", "large")}}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    out = validate(ROOT / "serve_config.gpu.yaml", "--profile", str(tmp_path / "p.json"))
    # batch 16 (the model servers' max_batch_size): 2 x 1024 x 50 ms = 102 s > 90 s
    assert out.returncode != 0 and "limits.stage_timeout_s (90.0) is below" in out.stderr and "102 s" in out.stderr
    fast = {"generators": {role: {"step": [{"batch": 16, "ms": 30.0}, {"batch": 64, "ms": 40.0}]}
                           for role in ("small", "large")}}
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    assert validate(ROOT / "serve_config.gpu.yaml", "--profile", str(tmp_path / "fast.json")).returncode == 0


def test_the_gpu_arithmetic_of_the_shipped_configs():
    """The 8B at batch 16 x 6,144 tokens: 15.3 GiB of weights + 13.5 GiB of KV, over a 24 GB card."""
    app, config = app_of("serve_config.gpu.yaml"), config_of("serve_config.gpu.yaml")
    fits = {gpu: {r["deployment"]: r for r in gpu_fit(config, app["deployments"], gpu)} for gpu in ("A10G", "L4", "L40S", "H100")}
    large = fits["A10G"]["LargeAnswerer"]
    assert not large["fits"] and "weights 15.3" in large["why"] and "kv 13.5" in large["why"]
    assert not fits["L4"]["LargeAnswerer"]["fits"] and fits["L40S"]["LargeAnswerer"]["fits"]
    assert all(r["fits"] for r in fits["H100"].values())
    assert fits["L4"]["SmallReasoner"]["fits"] and fits["L4"]["VisionEncoder"]["fits"]  # cluster/'s L4 pools
    assert fits["L4"]["VisionEncoder"]["have_gib"] == pytest.approx(22.5 / 2, abs=0.1)  # num_gpus 0.5


def test_vllm_engines_sharing_a_gpu_may_not_take_more_than_it_has(tmp_path):
    app, config = app_of("serve_config.vllm-gpu.yaml"), config_of("serve_config.vllm-gpu.yaml")
    assert all(r["fits"] for r in gpu_fit(config, app["deployments"], "L40S"))
    for dep in app["deployments"]:
        if dep["name"] == "SmallReasoner":
            dep["ray_actor_options"]["num_gpus"] = 0.5  # two replicas on one GPU at 0.9 each
    small = next(r for r in gpu_fit(config, app["deployments"], "L40S") if r["deployment"] == "SmallReasoner")
    assert not small["fits"] and "2 replicas share a GPU" in small["why"] and "1.80 > 0.9" in small["why"]


def test_validate_config_prints_the_table_and_fails_where_a_deployment_does_not_fit():
    out = validate(ROOT / "serve_config.gpu.yaml", "--gpu", "A10G", "--gpu", "H100")
    assert out.returncode != 0
    assert "LargeAnswerer" in out.stdout and "DOES NOT FIT" in out.stdout
    assert "deployment 'LargeAnswerer' does not fit A10G" in out.stderr and "does not fit H100" not in out.stderr
    assert validate(ROOT / "serve_config.gpu.yaml", "--gpu", "H100").returncode == 0


def test_build_app_refuses_limits_that_contradict():
    from deployments.app import build_app

    args = dict(app_of("serve_config.yaml")["args"])
    args["limits"] = {**args["limits"], "max_prompt_tokens": 64}  # below what the HTTP limits admit
    with pytest.raises(ValueError, match="limits.max_prompt_tokens \\(64\\) is below the longest"):
        build_app(args)


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_the_manifests_state_their_prerequisites_and_pull_with_a_secret(manifest):
    header = (ROOT / manifest).read_text().split("apiVersion:", 1)[0]
    for needed in ("root disk of 100 GB", "NVIDIA driver of the R570 branch", "R580", "pull secret", "prefetch"):
        assert needed in header, needed
    for name, spec in pods(manifest).items():
        assert spec["imagePullSecrets"] == [{"name": "tandem-registry"}], name


def test_the_launcher_runs_the_built_image_and_sends_no_local_state():
    launcher = yaml.safe_load((ROOT / "cluster/aws.yaml").read_text())
    image = pods("cluster/kuberay-rayservice.yaml")["head"]["containers"][0]["image"]
    assert launcher["docker"]["image"] == image
    assert not any("pip install" in c for c in launcher.get("setup_commands") or [])  # the image is pinned
    assert {"**/.git", ".venv*"} <= set(launcher["rsync_exclude"])
    for name, node in launcher["available_node_types"].items():
        disks = node["node_config"].get("BlockDeviceMappings") or []
        assert disks and disks[0]["Ebs"]["VolumeSize"] >= 100, name


def test_the_prefetch_job_fills_the_cache_the_replicas_read_offline():
    job = yaml.safe_load((ROOT / "cluster/prefetch-job.yaml").read_text())["spec"]["template"]["spec"]
    container = job["containers"][0]
    command = " ".join(container["command"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    for config in MANIFESTS.values():
        assert f"tandem prefetch {config}" in command
        assert app_of(config)["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"
        assert f" {config}" in (ROOT / "cluster/Dockerfile").read_text()  # in the image the job runs
    pod = pods("cluster/kuberay-rayservice.yaml")["head"]
    claim = next(v for v in pod["volumes"] if v["name"] == "hf-cache")["persistentVolumeClaim"]["claimName"]
    assert next(v for v in job["volumes"] if v["name"] == "hf-cache")["persistentVolumeClaim"]["claimName"] == claim
    assert env["HF_HOME"] == next(e["value"] for e in pod["containers"][0]["env"] if e["name"] == "HF_HOME")
    assert container["image"] == pod["containers"][0]["image"]
