#!/usr/bin/env bash
# The vLLM tests, in their own venv (.venv-vllm, made by setup-vllm.sh): the vLLM engine against the
# transformers engine, and the app served with `engine: vllm`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-vllm.sh"
exec python -m pytest -q tests/vllm "$@"
