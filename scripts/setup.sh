#!/usr/bin/env bash
# Creates .venv and installs Tandem with its dev extra, once per pyproject.toml and pin file: torch
# first, pinned, so pip takes the CPU wheel rather than a multi-GB CUDA build; the rest held to the
# versions the GPU image pins (cluster/constraints-gpu.txt), so the tests run what the image ships and
# a new release upstream changes neither until the pins move. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
stamp=".venv/.tandem-installed"
want=$(cat pyproject.toml cluster/constraints-gpu.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[dev]" -c cluster/constraints-gpu.txt
  echo "$want" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
export HF_HUB_OFFLINE=1
export TANDEM_CACHE="${TANDEM_CACHE:-$PWD/.tandem-cache}"
