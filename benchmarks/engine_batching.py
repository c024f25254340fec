"""What batching buys at one model server: a LargeAnswerer deployment alone under Serve, sent 1 and
then 16 concurrent generate calls (direct prompts with an image, 64 output tokens each), once per
engine, in one run and on the same checkpoint. Token throughput at each concurrency, and the gain
(tokens/s at 16 over tokens/s at 1).

    python -m benchmarks.engine_batching                     # in .venv-vllm: transformers and vllm
    python -m benchmarks.engine_batching --engines transformers --concurrency 1,4,16
    python -m benchmarks.engine_batching --gpu --model random:qwen3-vl-8b   # one GPU (benchmarks/gpu_check.sh)

The checkpoint is random-init (tiny:large by default): calls seldom stop before their 64 tokens
(an early end of sequence is the same call on both engines: greedy, same tokens), and throughput
counts the tokens decoded. Prefix caching is off for the run, and every call has an image of its own: what is measured is
batching, not reuse. Table, and one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import time

from tandem.config import ModelConfig, TandemConfig, VllmOptions
from tandem.prompts import direct_prompt
from tandem.schemas import GenerationRequest, SamplingParams

# serve_config.vllm-cpu.yaml's engine arguments, prefix caching off (see above).
VLLM_CPU = VllmOptions(enforce_eager=True, block_size=32, max_model_len=4096, max_num_seqs=32, cpu_kv_cache_gib=1,
                       enable_prefix_caching=False)
# On a GPU the two engines run one after the other, each with the GPU to itself; eager, so no
# compilation eats the prepared GPU check's minutes.
VLLM_GPU = VllmOptions(enforce_eager=True, max_model_len=4096, max_num_seqs=32, gpu_memory_utilization=0.85,
                       enable_prefix_caching=False)


def png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(96, 128, 3) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def config_for(engine: str, model: str, gpu: bool = False) -> TandemConfig:
    placement = dict(dtype="bfloat16", device="cuda", vllm=VLLM_GPU) if gpu else dict(vllm=VLLM_CPU)
    large = ModelConfig(model=model, reasoning_format="prompted", **placement)
    return TandemConfig(engine=engine, large=large)


def make_requests(features: list, n: int, max_tokens: int, tag: str) -> list[GenerationRequest]:
    return [GenerationRequest(direct_prompt(f"Question {tag}-{i}: what is shown?", 1, "prompted"), [features[i]],
                              SamplingParams(max_tokens=max_tokens), request_id=f"{tag}-{i}")
            for i in range(n)]


async def measure(handle, features, concurrency: int, max_tokens: int, repeats: int, tag: str) -> dict:
    """Median over repeats of one burst of `concurrency` calls: tokens per second of the burst and the
    calls' p50 latency."""
    rates, latencies, tokens = [], [], []
    for r in range(repeats):
        feats = features[(r * concurrency) % len(features):][:concurrency]
        batch = make_requests(feats, concurrency, max_tokens, f"{tag}-{concurrency}-{r}")
        start = time.perf_counter()
        outs = await asyncio.gather(*[handle.generate.remote(req) for req in batch])
        wall = time.perf_counter() - start
        rates.append(sum(o.completion_tokens for o in outs) / wall)
        latencies += [o.latency_ms for o in outs]
        tokens += [o.completion_tokens for o in outs]
    return {"tok_s": round(statistics.median(rates), 1), "p50_ms": round(statistics.median(latencies), 1),
            "mean_tokens": round(statistics.mean(tokens), 1)}


def run_engine(engine: str, args, features: list) -> dict:
    from ray import serve

    from deployments.large_answerer import LargeAnswerer

    config = config_for(engine, args.model, args.gpu)
    app = serve.deployment(LargeAnswerer, name="LargeAnswerer", ray_actor_options={"num_cpus": 0, "num_gpus": int(args.gpu)},
                           max_ongoing_requests=64, user_config={"max_batch_size": max(args.concurrency),
                                                                 "batch_wait_timeout_s": 0.01}).bind(config)
    name = f"batching-{engine}"
    handle = serve.run(app, name=name, route_prefix=None)
    try:
        async def go():
            await measure(handle, features, max(args.concurrency), 4, 1, "warm")
            return {c: await measure(handle, features, c, args.max_tokens, args.repeats, engine)
                    for c in args.concurrency}
        return asyncio.run(go())
    finally:
        serve.delete(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="transformers,vllm")
    ap.add_argument("--model", default="tiny:large", help="a checkpoint vLLM's CPU backend can run (heads >= 32)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu", action="store_true", help="bf16 on the one GPU of this machine")
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    engines = args.engines.split(",")

    import ray

    from tandem.engines.transformers_engine import TransformersEngine

    tower = TransformersEngine(config_for("transformers", args.model, args.gpu).large, name="large", language=False)
    n = max(args.concurrency) * args.repeats
    features = tower.encode_images([png(seed) for seed in range(n)])
    del tower  # its GPU memory goes back before the engines start
    ray.init(num_cpus=2, num_gpus=int(args.gpu), include_dashboard=False, log_to_driver=False)
    results = {}
    try:
        for engine in engines:
            results[engine] = run_engine(engine, args, features)
    finally:
        ray.shutdown()
    low, high = min(args.concurrency), max(args.concurrency)
    print(f"\nLargeAnswerer alone ({args.model}, {args.max_tokens} output tokens a call, median of {args.repeats})")
    print(f"{'engine':<13} {'calls':>5} {'tok/s':>8} {'p50_ms':>8} {'tokens':>7}")
    summary = {}
    for engine, points in results.items():
        for c, p in points.items():
            print(f"{engine:<13} {c:>5} {p['tok_s']:>8.1f} {p['p50_ms']:>8.1f} {p['mean_tokens']:>7.1f}")
        gain = round(points[high]["tok_s"] / points[low]["tok_s"], 2)
        print(f"{engine:<13} gain {high} vs {low}: {gain}x")
        summary[engine] = {"tok_s": {str(c): p["tok_s"] for c, p in points.items()},
                           "p50_ms": {str(c): p["p50_ms"] for c, p in points.items()}, "gain": gain}
    print(json.dumps({"benchmark": "engine_batching", "model": args.model, "max_tokens": args.max_tokens,
                      "concurrency": args.concurrency, "engines": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
