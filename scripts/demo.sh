#!/usr/bin/env bash
# The main job: installs what is missing, starts a local Ray cluster serving serve_config.yaml (the
# tiny Qwen3-VL pair trained on the grid task, shipped in tandem/trained/), sends the sample request
# (examples/grid.png, a held-out grid item) and prints the answer with its trace and the expected
# answer. Exits afterwards; with --serve it keeps serving until Ctrl-C.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
keep=0; [ "${1:-}" = "--serve" ] && keep=1
url="http://127.0.0.1:8000"
log="${TMPDIR:-/tmp}/tandem-serve.$$.log"

tandem validate-config serve_config.yaml
# `serve run` gets its own process group (job control), and is stopped with SIGTERM, on which Ray
# shuts its local cluster down: SIGINT would not do, since a shell started in the background passes
# SIGINT on ignored.
set -m
serve run serve_config.yaml >"$log" 2>&1 &
server=$!
stop() { kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
trap stop EXIT
trap 'exit 130' INT TERM

echo "starting Ray and Serve (log: $log) ..."
for _ in $(seq 1 180); do
  if curl -sf "$url/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$server" 2>/dev/null; then echo "serve run exited; last lines of $log:"; tail -30 "$log"; exit 1; fi
  sleep 1
done
curl -sf "$url/readyz" >/dev/null || { echo "Tandem did not come up in 180 s; see $log"; exit 1; }
echo "Tandem is up at $url. Sample request (examples/grid.png, model=tandem):"
python examples/request.py "$url"
if [ "$keep" = 1 ]; then
  echo "serving at $url until Ctrl-C"
  wait "$server"
fi
