#!/usr/bin/env bash
# The test command: installs what is missing, then runs every test (unit and Serve).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec python -m pytest -q --durations=15 "$@"
