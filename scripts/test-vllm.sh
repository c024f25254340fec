#!/usr/bin/env bash
# The vLLM tests, in their own venv (.venv-vllm, made by setup-vllm.sh, with the transformers vLLM
# pins): the unit tests again on that transformers, the vLLM engine against the transformers engine
# (tests/vllm), then every Serve test again with the app on `engine: vllm`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-vllm.sh"
python -m pytest -q tests/core tests/training tests/tasks tests/benchmarks tests/capacity tests/vllm "$@"
TANDEM_TEST_ENGINE=vllm exec python -m pytest -q tests/serve "$@"
