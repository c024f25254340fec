#!/usr/bin/env bash
# The prepared GPU check: on one H200 with no network, in under 10 minutes, the latency profile of
# random-init Qwen3-VL 8B and 2B at their real sizes (bf16), then a short strategies run on the same
# pair (checkpoints built on the GPU into $TANDEM_CACHE; weights random, so accuracy means nothing,
# latency and paths do), then a stage profile of that pair for the simulator; where vLLM is installed,
# also both engines' batching on the 8B (5 more minutes at most). Writes everything under OUT_DIR.
#   bash benchmarks/gpu_check.sh OUT_DIR
set -euo pipefail
out="${1:?usage: bash benchmarks/gpu_check.sh OUT_DIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TANDEM_CACHE="${TANDEM_CACHE:-/tmp/tandem-cache}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/gpu.txt"

timeout 240 python -m benchmarks.latency_profile --device cuda --grid gpu \
  --models random:qwen3-vl-8b,random:qwen3-vl-2b --out "$out" 2>&1 | tee "$out/latency_profile.log"

cat > "$out/strategies.yaml" <<'YAML'
small: {model: "random:qwen3-vl-2b", reasoning_format: think_tags, dtype: bfloat16, device: cuda,
        min_pixels: 65536, max_pixels: 262144}
large: {model: "random:qwen3-vl-8b", reasoning_format: prompted, dtype: bfloat16, device: cuda,
        min_pixels: 65536, max_pixels: 262144}
limits: {answer_max_tokens: 16, reasoning_max_tokens: 128}
YAML
timeout 240 python -m benchmarks.strategies --config "$out/strategies.yaml" --n 6 --out "$out" 2>&1 \
  | tee "$out/strategies.log"

# The same pair as a stage profile (quick grid), the capacity simulator's input: a GPU profile
# for `python -m capacity.plan --profile "$out/stage_profile.json" ...` (cluster/README.md).
timeout 150 python -m capacity.stage_profile --config "$out/strategies.yaml" --quick --threads 0 \
  --out "$out/stage_profile.json" 2>&1 | tee "$out/stage_profile.log"

# The shipped GPU config against that profile: does its stage deadline let the longest reasoning finish
# at the decode step measured here, and its memory arithmetic on an H100 (the nearest table entry).
python -m tandem.cli validate-config serve_config.gpu.yaml --profile "$out/stage_profile.json" --gpu H100 \
  2>&1 | tee "$out/validate_config.log" || true

# Both engines on the real-size 8B, LargeAnswerer alone, 1 vs 16 concurrent calls (README, "vLLM
# engine"). Needs vLLM installed beside Tandem; the lent H200s have none, and its wheel is too large
# to carry there, so this part is skipped where `import vllm` fails.
if python -c "import vllm" 2>/dev/null; then
  timeout 300 python -m benchmarks.engine_batching --gpu --model random:qwen3-vl-8b --repeats 2 2>&1 \
    | tee "$out/engine_batching.log"
else
  echo "vLLM not installed: engine_batching skipped" | tee "$out/engine_batching.log"
fi
