"""Host memory of loading a checkpoint the way each deployment does: the VisionEncoder's vision-only
load, a model server's decoder-only load, and (for comparison) the whole checkpoint.

    python -m benchmarks.load_memory                        # random:qwen3-vl-2b (real 2B size, ~8.5 GB fp32)
    python -m benchmarks.load_memory --model tiny:large     # seconds

Each load runs in a fresh process (`tandem.engines.transformers_engine.load_parts`, the engines' own
path, on CPU), then reads every kept tensor once (safetensors maps the file: a weight becomes resident
when first touched, as serving or `.to("cuda")` does), and reports its peak resident memory
(ru_maxrss) beside the bytes of the part it keeps (its parameters and buffers). The bars (issue "first real GPU deploy"): a vision-only peak under 2x
the tower's bytes, a decoder-only peak under 1.3x the decoder's. The process's baseline (Python,
torch, transformers imported: measured before loading) is part of the peak and is reported too.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

BARS = {"vision": 2.0, "decoder": 1.3}
PARTS = {"vision": dict(vision=True, language=False), "decoder": dict(vision=False, language=True),
         "whole": dict(vision=True, language=True)}


def _child(model: str, part: str, dtype: str) -> dict:
    """Runs in the child process: load one part, return its bytes and the peak RSS."""
    import resource

    import torch

    from tandem.checkpoints import resolve_model_ref
    from tandem.config import ModelConfig
    from tandem.engines.transformers_engine import load_parts

    path = resolve_model_ref(model)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    loaded = load_parts(path, ModelConfig(model=model, dtype=dtype), **PARTS[part])
    tensors = [*loaded.parameters(), *loaded.buffers()]
    kept = sum(t.numel() * t.element_size() for t in tensors)
    with torch.inference_mode():  # read every weight once, as serving does: pages safetensors mapped
        for t in tensors:         # lazily become resident only when touched
            t.sum()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    del loaded
    return {"part": part, "kept_bytes": kept, "peak_rss_bytes": peak, "baseline_rss_bytes": baseline,
            "torch": torch.__version__}


def measure(model: str, part: str, dtype: str) -> dict:
    code = (f"import json; from benchmarks.load_memory import _child; "
            f"print('RESULT', json.dumps(_child({model!r}, {part!r}, {dtype!r})))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random:qwen3-vl-2b")
    p.add_argument("--dtype", default="float32", help="the dtype the engine loads in (the checkpoint's here)")
    p.add_argument("--parts", default="vision,decoder,whole")
    args = p.parse_args(argv)
    gib = 2 ** 30
    rows = []
    print(f"load memory: {args.model} ({args.dtype}), one fresh process per load, CPU")
    print(f"{'part':<8} {'kept GiB':>9} {'peak RSS GiB':>13} {'baseline GiB':>13} {'peak/kept':>10} {'bar':>6}")
    for part in args.parts.split(","):
        r = measure(args.model, part, args.dtype)
        r["ratio"] = round(r["peak_rss_bytes"] / r["kept_bytes"], 3)
        r["bar"] = BARS.get(part)
        r["meets"] = None if r["bar"] is None else r["ratio"] < r["bar"]
        rows.append(r)
        print(f"{part:<8} {r['kept_bytes'] / gib:>9.2f} {r['peak_rss_bytes'] / gib:>13.2f} "
              f"{r['baseline_rss_bytes'] / gib:>13.2f} {r['ratio']:>10.2f} {r['bar'] or '-':>6}", flush=True)
    print(json.dumps({"benchmark": "load_memory", "model": args.model, "dtype": args.dtype,
                      "parts": {r["part"]: {k: r[k] for k in ("kept_bytes", "peak_rss_bytes", "baseline_rss_bytes",
                                                               "ratio", "bar", "meets")} for r in rows}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
