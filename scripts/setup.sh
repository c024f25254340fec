#!/usr/bin/env bash
# Creates .venv and installs Tandem with its dev extra, once per pyproject.toml: torch first, pinned,
# so pip takes the CPU wheel rather than a multi-GB CUDA build. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
stamp=".venv/.tandem-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
export HF_HUB_OFFLINE=1
export TANDEM_CACHE="${TANDEM_CACHE:-$PWD/.tandem-cache}"
