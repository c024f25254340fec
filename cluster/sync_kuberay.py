"""Writes the KubeRay manifests from the serve configs: serve_config.gpu.yaml into
cluster/kuberay-rayservice.yaml's serveConfigV2, verbatim (its leading comments aside), and
cluster/kuberay-rayservice-vllm.yaml as that manifest with serve_config.vllm-gpu.yaml, the vLLM
image and vLLM's compile cache on the shared volume. Each pod's terminationGracePeriodSeconds is set
above its config's drains. Run after editing either config; a unit test fails while they differ.

    python cluster/sync_kuberay.py
"""

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IMAGE = "ghcr.io/your-org/tandem:0.1.0"
VLLM_ENV = "                - {name: VLLM_CACHE_ROOT, value: /mnt/hf-cache/vllm}   # compiled graphs, once per model\n"


def with_serve_config(manifest: str, config_file: str) -> str:
    from tandem.config import load_tandem_config
    from tandem.deploy_checks import pod_grace_needed

    serve = (ROOT / config_file).read_text()
    body = serve[serve.index("proxy_location:"):].rstrip()
    embedded = "\n".join(("    " + line) if line.strip() else "" for line in body.splitlines())
    head, rest = manifest.split("  serveConfigV2: |\n", 1)
    tail = rest[rest.index("\n  rayClusterConfig:"):]
    app = yaml.safe_load(serve)["applications"][0]
    grace = int(pod_grace_needed(load_tandem_config(app["args"]), app["deployments"]))
    tail = re.sub(r"terminationGracePeriodSeconds: \d+", f"terminationGracePeriodSeconds: {grace}", tail)
    return f"{head}  serveConfigV2: |\n{embedded}\n{tail}"


def vllm_variant(manifest: str) -> str:
    head, body = manifest.split("apiVersion: v1", 1)
    head = ("# KubeRay RayService for Tandem on the vLLM engine: cluster/kuberay-rayservice.yaml with\n"
            "# serve_config.vllm-gpu.yaml, the vLLM image (cluster/Dockerfile, target vllm) and VLLM_CACHE_ROOT on\n"
            "# the shared volume. Written by `python cluster/sync_kuberay.py`: edit that manifest or the config.\n"
            + "\n".join(line for line in head.splitlines()[4:]) + "\n")
    body = body.replace(IMAGE, IMAGE + "-vllm")
    body = body.replace("                - {name: HF_HOME, value: /mnt/hf-cache}\n",
                        "                - {name: HF_HOME, value: /mnt/hf-cache}\n" + VLLM_ENV)
    return with_serve_config(head + "apiVersion: v1" + body, "serve_config.vllm-gpu.yaml")


def main() -> None:
    path = ROOT / "cluster" / "kuberay-rayservice.yaml"
    manifest = with_serve_config(path.read_text(), "serve_config.gpu.yaml")
    path.write_text(manifest)
    (ROOT / "cluster" / "kuberay-rayservice-vllm.yaml").write_text(vllm_variant(manifest))


if __name__ == "__main__":
    main()
