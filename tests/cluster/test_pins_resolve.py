"""Each image's pins must install together: pip resolves every constraints file in cluster/ against
the package registry (metadata only, nothing installed), so a pin that cannot install fails here and
not in `docker build` on a user's machine. Needs the registry: without it this fails, loudly — a
resolution that was not checked is not a resolution that passed.

`--isolated` ignores this machine's pip configuration (local wheel folders, its caps on torch), so
the answer is the registry's alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# constraints file -> what its image installs with it (cluster/Dockerfile)
IMAGES = {"constraints-gpu.txt": ["torch", "torchvision", f"tandem @ file://{ROOT}"],
          "constraints-vllm-gpu.txt": ["torch", "torchvision", f"tandem[vllm] @ file://{ROOT}"]}


def pins(name: str) -> dict[str, str]:
    lines = (ROOT / "cluster" / name).read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


@pytest.mark.slow
def test_every_images_constraints_resolve_against_the_registry(tmp_path):
    procs = {}
    for name, requirements in IMAGES.items():  # at once: each is minutes of metadata fetched
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
             "--report", str(tmp_path / f"{name}.json"), "-c", str(ROOT / "cluster" / name), *requirements],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=1200)
        assert proc.returncode == 0, f"{name} does not resolve (or the registry is unreachable):\n{out[-3000:]}"
        installed = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                     for i in json.loads((tmp_path / f"{name}.json").read_text())["install"]}
        for package, version in pins(name).items():
            if package != "ray":  # the base image's; pip takes it as pinned
                assert installed[package.lower()].split("+")[0] == version, (name, package)


def test_the_vllm_image_pins_a_vllm_with_the_versions_it_was_built_for():
    vllm, gpu = pins("constraints-vllm-gpu.txt"), pins("constraints-gpu.txt")
    assert {"vllm", "torch", "torchvision", "transformers"} <= set(vllm)
    assert vllm["torch"] == gpu["torch"] and vllm["ray"] == gpu["ray"]  # one Ray and torch across the images
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    vllm_stage = dockerfile[dockerfile.index("AS vllm"):]
    assert "-c cluster/constraints-vllm-gpu.txt" in vllm_stage and "import torch, vllm, vllm._C" in vllm_stage
    assert "whl/cu" not in vllm_stage  # vLLM's torch is PyPI's CUDA 13 build, not the cu128 index's
