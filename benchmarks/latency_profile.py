"""The paper's component analysis on simulated data: where a VLM's latency goes, per model.

    python -m benchmarks.latency_profile --quick                                  # CPU, tiny models
    python -m benchmarks.latency_profile --device cuda --grid gpu \\
        --models random:qwen3-vl-8b,random:qwen3-vl-2b                            # real sizes, random weights

For each model (tiny:small|large, a local checkpoint, or random:qwen3-vl-<2b|4b|8b|32b>, built from the
published Qwen3-VL 2B/4B/8B/32B dimensions, so latency at real size needs nothing downloaded),
measures with warm-up and repeats: vision-encoder time vs visual tokens, prefill time vs input
tokens, decode time per output token vs batch size, and end-to-end time vs output tokens (exact
lengths forced). For the first two models (large, small) it reports the crossover: the small-model
output length above which the large model answering in k tokens is faster. Table, PNG, JSON, and
one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from tandem.checkpoints import REAL_SIZES

ROOT = Path(__file__).resolve().parents[1]

QUICK = dict(resolutions=[64, 128, 256], input_tokens=[32, 128, 512], batch_sizes=[1, 4, 8],
             output_tokens=[1, 8, 32, 128], repeats=3)
FULL = dict(resolutions=[224, 448, 672, 896], input_tokens=[128, 512, 2048, 8192], batch_sizes=[1, 4, 16, 64],
            output_tokens=[1, 4, 16, 64, 256, 1024], repeats=5)
GPU_SHORT = dict(resolutions=[224, 448, 896], input_tokens=[128, 512, 2048, 8192], batch_sizes=[1, 8, 32],
                 output_tokens=[1, 4, 16, 64, 256], repeats=3)  # fits the prepared GPU check's minutes
GRIDS = {"quick": QUICK, "full": FULL, "gpu": GPU_SHORT}


def load_model(ref: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForImageTextToText, Qwen3VLForConditionalGeneration

    from tandem.checkpoints import real_size_config, resolve_model_ref

    if ref.startswith("random:"):  # built in memory: nothing is written for a latency profile
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3VLForConditionalGeneration._from_config(real_size_config(ref.split(":", 1)[1]), dtype=dtype)
    else:
        model = AutoModelForImageTextToText.from_pretrained(resolve_model_ref(ref), dtype=dtype).to(device)
    return model.eval()


def _sync(device: str):
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def _elapsed_ms(fn, sync) -> float:
    """fn()'s wall time in ms, the device synchronised around it."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1000


def timed_ms(fn, device: str, repeats: int, warmup: int = 1) -> float:
    """Median wall time of fn() in ms, after warm-up, with the device synchronised around each run."""
    sync = _sync(device)
    for _ in range(warmup):
        fn()
    return statistics.median(_elapsed_ms(fn, sync) for _ in range(repeats))


def paired_ms(short, long, device: str, repeats: int, warmup: int = 1) -> tuple[float, float]:
    """(median of short(), median of long() − short()) in ms, each repeat timing the two back to back:
    on a machine whose speed moves within seconds, a difference of two medians taken a second apart
    carries that move (a profile's step at 8 rows came out below its step at 1); a pair carries less
    of it (docs/capacity.md)."""
    sync = _sync(device)
    for _ in range(warmup):
        short(), long()
    pairs = [(_elapsed_ms(short, sync), _elapsed_ms(long, sync)) for _ in range(repeats)]
    return statistics.median(a for a, _ in pairs), statistics.median(b - a for a, b in pairs)


class Profiler:
    def __init__(self, model, device: str, repeats: int):
        self.model, self.device, self.repeats = model, device, repeats
        cfg = model.config
        self.cfg, self.vocab = cfg, cfg.text_config.vocab_size
        self.patch = cfg.vision_config.patch_size * cfg.vision_config.spatial_merge_size

    def _pixels(self, resolution: int):
        """Patch tensors of a square image of `resolution` pixels a side, as the processor lays them out."""
        vc = self.cfg.vision_config
        side = resolution // vc.patch_size
        n = side * side
        dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
        pixels = torch.randn(n, dim, device=self.device, dtype=self.model.dtype)
        return pixels, torch.tensor([[1, side, side]], device=self.device)

    def _ids(self, batch: int, n: int):
        # Ordinary token ids, clear of the special range Qwen keeps at the top of the vocabulary.
        return torch.randint(100, min(self.vocab, 150000) - 1, (batch, n), device=self.device)

    @torch.inference_mode()
    def vision_ms(self, resolution: int) -> tuple[int, float]:
        pixels, grid = self._pixels(resolution)
        tokens = int(grid.prod()) // self.cfg.vision_config.spatial_merge_size ** 2
        return tokens, timed_ms(lambda: self.model.model.get_image_features(pixels, grid), self.device, self.repeats)

    @torch.inference_mode()
    def prefill_ms(self, n: int) -> float:
        ids = self._ids(1, n)
        return timed_ms(lambda: self.model(input_ids=ids, use_cache=True, logits_to_keep=1), self.device, self.repeats)

    @torch.inference_mode()
    def generate_ms(self, batch: int, prompt: int, new: int, image_resolution: int | None = None) -> float:
        ids, extra = self._ids(batch, prompt), {}
        if image_resolution:
            pixels, grid = self._pixels(image_resolution)
            n_img = int(grid.prod()) // self.cfg.vision_config.spatial_merge_size ** 2
            image = torch.tensor([self.cfg.vision_start_token_id] + [self.cfg.image_token_id] * n_img
                                 + [self.cfg.vision_end_token_id], device=self.device)
            ids = torch.cat([image[None], ids], dim=1)
            extra = dict(pixel_values=pixels, image_grid_thw=grid,
                         mm_token_type_ids=(ids == self.cfg.image_token_id).long())
        mask = torch.ones_like(ids)
        run = lambda: self.model.generate(input_ids=ids, attention_mask=mask, min_new_tokens=new,  # noqa: E731
                                          max_new_tokens=new, do_sample=False, pad_token_id=0, **extra)
        return timed_ms(run, self.device, self.repeats)


def profile(ref: str, device: str, dtype, grid: dict, bar) -> dict:
    model = load_model(ref, device, dtype)
    p = Profiler(model, device, grid["repeats"])
    params = sum(t.numel() for t in model.parameters())
    out = {"model": ref, "params_m": round(params / 1e6, 1), "vision": [], "prefill": [], "decode": [], "e2e": []}
    for r in grid["resolutions"]:
        tokens, ms = p.vision_ms(r)
        out["vision"].append({"resolution": r, "visual_tokens": tokens, "ms": ms})
        bar.update()
    for n in grid["input_tokens"]:
        out["prefill"].append({"input_tokens": n, "ms": p.prefill_ms(n)})
        bar.update()
    steps = 16
    for b in grid["batch_sizes"]:
        total, one = p.generate_ms(b, 64, steps + 1), p.generate_ms(b, 64, 1)
        out["decode"].append({"batch": b, "ms_per_token": (total - one) / steps})
        bar.update()
    image = grid["resolutions"][len(grid["resolutions"]) // 2]
    for n in grid["output_tokens"]:
        out["e2e"].append({"output_tokens": n, "image_resolution": image, "ms": p.generate_ms(1, 32, n, image)})
        bar.update()
    del model, p
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def crossover(large: dict, small: dict, k: int) -> dict:
    """Small-model output length above which the large model answering in k tokens is faster,
    from a least-squares line through the small model's end-to-end points."""
    xs = [e["output_tokens"] for e in small["e2e"]]
    ys = [e["ms"] for e in small["e2e"]]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    intercept = mean_y - slope * mean_x
    lx = [e["output_tokens"] for e in large["e2e"]]
    ly = [e["ms"] for e in large["e2e"]]
    large_k = min((abs(x - k), y) for x, y in zip(lx, ly))[1] if k not in lx else ly[lx.index(k)]
    tokens = max(0.0, (large_k - intercept) / slope) if slope > 0 else float("inf")
    return {"large": large["model"], "small": small["model"], "large_answer_tokens": k,
            "large_ms": round(large_k, 2), "small_ms_per_token": round(slope, 3),
            "small_fixed_ms": round(intercept, 2), "crossover_small_tokens": round(tokens, 1)}


def print_tables(results: list[dict]) -> None:
    for r in results:
        print(f"\n== {r['model']} ({r['params_m']} M parameters)")
        print("  vision:  " + "  ".join(f"{v['visual_tokens']}tok={v['ms']:.1f}ms" for v in r["vision"]))
        print("  prefill: " + "  ".join(f"{v['input_tokens']}tok={v['ms']:.1f}ms" for v in r["prefill"]))
        print("  decode:  " + "  ".join(f"b{v['batch']}={v['ms_per_token']:.2f}ms/tok" for v in r["decode"]))
        print("  e2e:     " + "  ".join(f"{v['output_tokens']}out={v['ms']:.1f}ms" for v in r["e2e"]))


def plot(results: list[dict], path: Path) -> None:
    import matplotlib.ticker

    from benchmarks.plotting import subplots

    fig, axes = subplots(2, 2, figsize=(11, 8))
    panels = [("vision", "visual_tokens", "ms", "vision encoder: ms vs visual tokens"),
              ("prefill", "input_tokens", "ms", "prefill: ms vs input tokens"),
              ("decode", "batch", "ms_per_token", "decode: ms per token vs batch size"),
              ("e2e", "output_tokens", "ms", "end to end: ms vs output tokens")]
    for ax, (key, x, y, title) in zip(axes.flat, panels):
        for r in results:
            ax.plot([p[x] for p in r[key]], [p[y] for p in r[key]], marker="o", label=r["model"])
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny:large,tiny:small",
                    help="comma list, large first: tiny:<size>, a path, or random:" + "|".join(REAL_SIZES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    ap.add_argument("--quick", action="store_true", help="small grid: CPU, tiny models, about a minute")
    ap.add_argument("--grid", choices=sorted(GRIDS), default=None, help="measurement grid (default: full)")
    ap.add_argument("--answer-tokens", type=int, default=8, help="k: the large model's short answer length")
    ap.add_argument("--out", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    from tqdm import tqdm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    grid = GRIDS[args.grid or ("quick" if args.quick else "full")]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "none"
    print(f"latency_profile: models {models}; device {args.device} ({gpu}); dtype {dtype}; "
          f"{platform.machine()} {os.cpu_count()} cores; torch {torch.__version__}; grid {grid}")
    steps = len(models) * sum(len(grid[k]) for k in ("resolutions", "input_tokens", "batch_sizes", "output_tokens"))
    with tqdm(total=steps, desc="profiling", disable=None) as bar:
        results = [profile(m, args.device, dtype, grid, bar) for m in models]
    print_tables(results)
    cross = crossover(results[0], results[1], args.answer_tokens) if len(results) > 1 else None
    if cross:
        print(f"\ncrossover: {cross['large']} answering in {cross['large_answer_tokens']} tokens takes "
              f"{cross['large_ms']} ms; {cross['small']} costs {cross['small_fixed_ms']} ms + "
              f"{cross['small_ms_per_token']} ms/token, so it is slower beyond {cross['crossover_small_tokens']} "
              "output tokens")
    out = Path(args.out) / f"latency-profile-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps({"results": results, "crossover": cross}, indent=1))
    plot(results, out / "profile.png")
    print(f"results: {out}")
    print(json.dumps({"benchmark": "latency_profile", "device": args.device, "dtype": str(dtype),
                      "models": models, "crossover": cross,
                      "decode_ms_per_token_b1": {r["model"]: round(r["decode"][0]["ms_per_token"], 3)
                                                 for r in results}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
