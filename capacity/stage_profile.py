"""Stage profiles: each deployment's service time by batch size, the input of the cluster simulator.

    python -m capacity.stage_profile --quick --out results/profile-cpu.json   # serve_config.yaml's pair, CPU
    python -m capacity.stage_profile --config P.yaml --device cuda --out profile-gpu.json  # e.g. real sizes

Times the engines the deployments run (`make_engine`: the VisionEncoder's towers, the model servers'
decoders driven by their `DecodeLoop`), on a grid-task image and the pipeline's own prompts:
- `vision.<role>`: one encode call of n images (a VisionEncoder batch), ms by n;
- `generators.<role>.step`: one decode step with n rows running, ms — from n rows decoding 1 and
  1 + S tokens, (t(1+S) - t(1)) / S, the median over repeats that time the two back to back;
- `generators.<role>.prefill`: n rows joining at once (their prompts prefilled, merged, first token),
  ms by n, with the prompt length — t(1) less one step.
Rows run to their token limit (stop tokens are switched off while measuring, as latency_profile forces
lengths), so the counts are exact. Each point is the median of `repeats` runs after a warm-up.

With `--url` (a running Tandem, e.g. the local app) it also measures what only the served app shows:
`router.ms`, the cost a request pays outside the pipeline's stages (proxy, parsing, response: client
latency minus the trace's total, median at concurrency 1), `calls`, each stage call's cost beyond its
model's work (a generate stage's latency less the model server's queue and decode time; an encode
stage's less the batch wait and the towers' time), `served.step_overhead_ms`, what a decode step costs
the served loop beyond the engine's step (the generate stages' decode time, one request at a time,
less the curves' prediction, per step), and `workload`: `tandem:mutual` on held-out grid
items — the transfer share and each stage's prompt tokens and decode steps, as the trace reports them —
and, when the app runs on this machine, `cpu_ms_per_request`: every one of its processes' CPU time
per request over those requests (capacity/cpu_per_request.py), and `cpu_ms_per_request_busy`: the
same with 8 requests in flight, with the cores the machine's other processes (Ray's own daemons)
kept busy meanwhile (`others_cores`: on shared cores, not there for the app). Without `--url`, `router.ms` is `--router-ms` and the workload is left to the simulator's flags.

The same JSON comes from a GPU (`--device cuda` with a config naming real-size models, e.g.
`random:qwen3-vl-8b`), so a GPU run gives a GPU profile. Where no GPU is at hand, `--estimate L40S`
(or `--estimate cluster`: cluster/'s L4 and L40S nodes per pool) writes one by roofline arithmetic
instead — an estimate, marked as one in its `source`: the published
Qwen3-VL 2B/8B dimensions (parameters counted on the meta device), the GPU's datasheet bandwidth and
bf16 throughput at the efficiencies below, a fixed per-step launch overhead for eager transformers,
and the `mutual` workload at the paper's routing split (MMBench-dev: 3,736 of 4,329 without transfer).
Ends with one JSON line (a summary).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = dict(vision=[1, 2, 4, 8], batches=[1, 2, 4, 8], steps=16, repeats=5)
FULL = dict(vision=[1, 2, 4, 8, 16], batches=[1, 2, 4, 8, 16], steps=32, repeats=7)


def profile_engines(config, grid: dict, image: bytes, question: str, bar=None) -> dict:
    """Vision and generator curves for both roles of `config`, measured in this process."""
    from benchmarks.latency_profile import paired_ms, timed_ms
    from tandem import prompts
    from tandem.engines import ROLES, make_engine
    from tandem.schemas import GenerationRequest, SamplingParams

    out: dict = {"vision": {}, "generators": {}}
    for role in ROLES:
        device = config.model(role).device
        tower = make_engine(config, role, language=False)
        feats = tower.encode_images([image])
        points = []
        for n in grid["vision"]:
            points.append({"images": n, "ms": round(timed_ms(lambda: tower.encode_images([image] * n), device,
                                                             grid["repeats"]), 3)})
            bar and bar.update()
        out["vision"][role] = points
        tower = None  # freed before the language model loads

        engine = make_engine(config, role, vision=False)
        engine.stop_token_ids = set()  # every row decodes to its limit: exact step counts
        prompt = prompts.direct_prompt(question, 1, config.model(role).reasoning_format)
        prefill, step = [], []
        for b in grid["batches"]:
            engine.configure(max_batch_size=b, batch_wait_s=1.0, adaptive_wait=False)  # the b rows join in one prefill

            def run(tokens: int):
                req = GenerationRequest(prompt, feats, SamplingParams(max_tokens=tokens))
                return engine.generate([req] * b)

            prompt_tokens = run(1)[0].prompt_tokens
            # The steps' cost: each repeat's long run less its short one, timed back to back.
            t1, steps_ms = paired_ms(lambda: run(1), lambda: run(1 + grid["steps"]), device, grid["repeats"])
            per_step = max(0.0, steps_ms / grid["steps"])
            step.append({"batch": b, "ms": round(per_step, 3)})
            prefill.append({"batch": b, "prompt_tokens": prompt_tokens, "ms": round(max(0.0, t1 - per_step), 3)})
            bar and bar.update()
        out["generators"][role] = {"prefill": prefill, "step": step}
        engine = None
    return out


# Datasheet figures (dense bf16) and what a served eager-transformers decode reaches of them: a guess
# stated as one, replaced by a measured GPU profile whenever a GPU is lent (benchmarks/gpu_check.sh).
GPUS = {"L4": {"hbm_gb_s": 300, "bf16_tflops": 121}, "L40S": {"hbm_gb_s": 864, "bf16_tflops": 362},
        "A100": {"hbm_gb_s": 2039, "bf16_tflops": 312}, "H100": {"hbm_gb_s": 3350, "bf16_tflops": 989},
        "H200": {"hbm_gb_s": 4800, "bf16_tflops": 989}}
# Where cluster/ puts each pool: vision towers and the 2B on L4 nodes, the 8B on L40S nodes.
CLUSTER_GPUS = {"vision": "L4", "small": "L4", "large": "L40S"}
ESTIMATE = dict(bandwidth_efficiency=0.7, compute_efficiency=0.4, step_overhead_ms=8.0, call_overhead_ms=5.0,
                image_tokens=256, question_tokens=64, context_tokens=768, reasoning_steps=512, answer_steps=3,
                excerpt_tokens=256, transfer_rate=round(1 - 3736 / 4329, 4))


def _param_counts(name: str) -> tuple[int, int]:
    """(decoder, vision tower) parameters of a real-size Qwen3-VL, counted without allocating them."""
    from tandem.deploy_checks import model_shape

    shape = model_shape(name)
    return shape["decoder_params"], shape["vision_params"]


def estimate_profile(gpu: str, small: str = "qwen3-vl-2b", large: str = "qwen3-vl-8b", **over) -> dict:
    """A GPU stage profile by roofline arithmetic (see the module docstring): not a measurement.
    `gpu`: one of GPUS for every pool, or "cluster" for cluster/'s placement (CLUSTER_GPUS)."""
    from capacity.profile import PROFILE_KIND
    from tandem.checkpoints import REAL_SIZES

    a = {**ESTIMATE, **over}
    placement = CLUSTER_GPUS if gpu == "cluster" else dict.fromkeys(CLUSTER_GPUS, gpu)

    def rates(pool: str) -> tuple[float, float]:
        g = GPUS[placement[pool]]  # bytes / s and FLOP / s, at the efficiencies assumed
        return g["hbm_gb_s"] * 1e9 * a["bandwidth_efficiency"], g["bf16_tflops"] * 1e12 * a["compute_efficiency"]
    out: dict = {"vision": {}, "generators": {}}
    prompt = a["image_tokens"] + a["question_tokens"]
    for role, name in (("small", small), ("large", large)):
        text_params, vision_params = _param_counts(name)
        t = REAL_SIZES[name]["text"]
        kv_bytes = 2 * t["num_key_value_heads"] * 128 * 2 * t["num_hidden_layers"]  # K and V, bf16, per token
        patches = 4 * a["image_tokens"]  # a 2x2 merge: four 16-px patches per visual token
        bw, flops = rates("vision")
        out["vision"][role] = [{"images": n, "ms": round(a["call_overhead_ms"] + 1000 * max(
            2 * vision_params * patches * n / flops, 2 * vision_params / bw), 3)} for n in (1, 2, 4, 8, 16, 32)]
        bw, flops = rates(role)
        step = [{"batch": b, "ms": round(a["step_overhead_ms"] + 1000 * max(
            (2 * text_params + b * a["context_tokens"] * kv_bytes) / bw, 2 * text_params * b / flops), 3)}
            for b in (1, 2, 4, 8, 16, 32, 64)]
        prefill = [{"batch": b, "prompt_tokens": prompt, "ms": round(a["call_overhead_ms"] + 1000 * max(
            2 * text_params * b * prompt / flops, 2 * text_params / bw), 3)} for b in (1, 2, 4, 8, 16)]
        out["generators"][role] = {"prefill": prefill, "step": step}
    stages = {"small_direct": {"prompt_tokens": prompt, "decode_steps": a["answer_steps"]},
              "large_direct": {"prompt_tokens": prompt, "decode_steps": a["answer_steps"]},
              "small_reasoning": {"prompt_tokens": prompt, "decode_steps": a["reasoning_steps"]},
              "large_transfer": {"prompt_tokens": prompt + a["excerpt_tokens"], "decode_steps": a["answer_steps"]}}
    return {"kind": PROFILE_KIND, "version": 1, "router": {"ms": 2.0},
            "source": {"estimate": "roofline (not measured)", "device": f"cuda ({gpu}, estimated)",
                       "gpus": {pool: {"type": t, **GPUS[t]} for pool, t in placement.items()},
                       "models": {"small": name_of(small), "large": name_of(large)}, "assumptions": a,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S")},
            **out, "workload": {"policy": "mutual", "images": 1, "transfer_rate": a["transfer_rate"], "stages": stages,
                                "source": "assumed: the paper's MMBench-dev routing split; token counts in assumptions"}}


def name_of(real: str) -> str:
    return {"qwen3-vl-2b": "Qwen/Qwen3-VL-2B-Thinking", "qwen3-vl-8b": "Qwen/Qwen3-VL-8B-Instruct"}.get(real, real)


def stage_calls_ms(trace: dict) -> dict[str, float]:
    """Each stage call's ms from an answer's trace (`latency_ms` less the request's total and the
    Router's own selector): what the simulation times by the same names."""
    return {name: ms for name, ms in trace.get("latency_ms", {}).items() if name not in ("total", "selector")}


class Traces:
    """The path and stage sizes of every answered `tandem:mutual` request, from their traces: the
    workload they sent (which items transfer is fixed by the items; under overload the app also
    answers some without the small model, `degraded`)."""

    def __init__(self):
        self.paths: list[str] = []
        self.stages: dict[str, list[tuple[int, int]]] = {}
        self.degraded = 0  # answered by the large model alone: the small model's pool shed them
        self.stage_ms: dict[str, list[float]] = {}  # each stage call's time as the Router saw it

    def add(self, trace: dict) -> None:
        self.paths.append(trace["path"])
        self.degraded += bool(trace.get("degraded"))
        for name, ms in stage_calls_ms(trace).items():
            self.stage_ms.setdefault(name, []).append(ms)
        for name, s in trace.get("stages", {}).items():
            self.stages.setdefault(name, []).append((s["prompt_tokens"], s["decode_steps"]))

    def workload(self) -> dict:
        """The transfer share, and each stage's mean prompt tokens and decode steps."""
        paths = self.paths
        return {"policy": "mutual", "requests": len(paths), "images": 1,
                "transfer_rate": round(paths.count("transfer") / len(paths), 4) if paths else 0.0,
                "stages": {name: {"prompt_tokens": round(statistics.mean(p for p, _ in v), 1),
                                  "decode_steps": round(statistics.mean(s for _, s in v), 2), "n": len(v)}
                           for name, v in sorted(self.stages.items())},
                "degraded": self.degraded}

    def stage_means(self) -> dict[str, float]:
        """Each stage call's mean ms from its send to its end (what the simulation reports as `stage_ms`)."""
        return {name: round(statistics.mean(v), 1) for name, v in sorted(self.stage_ms.items())}


def measure_app(url: str, n: int, seed: int = 0) -> tuple[float, dict, dict, dict, list[tuple[str, int, int, float]]]:
    """(router ms, workload, median call overheads, CPU ms per request by process, every generate
    stage's (role, prompt tokens, decode steps, decode ms)) from `tandem:mutual` on n held-out grid
    items, one at a time."""
    import httpx

    from benchmarks.client import item_body
    from capacity.cpu_per_request import app_processes, cpu_seconds, ms_per_request
    from tasks.grid import grid_items

    overhead, traces, calls, decodes = [], Traces(), {"encode": [], "generate": []}, []
    processes = app_processes()  # the app's processes on this machine (only this client for a remote URL)
    cpu_before = cpu_seconds(processes)
    with httpx.Client(timeout=120) as http:
        for item in grid_items(n, seed=seed + 7):
            start = time.perf_counter()
            r = http.post(f"{url}/v1/chat/completions", json=item_body(item))
            client_ms = (time.perf_counter() - start) * 1000
            r.raise_for_status()
            trace = r.json()["tandem"]
            lat = trace["latency_ms"]
            overhead.append(client_ms - lat["total"])
            traces.add(trace)
            for name, s in trace.get("stages", {}).items():
                # the call's time beyond the model server's own (queue, batch wait, prefill, decode)
                calls["generate"].append(lat[name] - s["queue_ms"] - s["decode_ms"])
                decodes.append((name.split("_")[0], s["prompt_tokens"], s["decode_steps"], s["decode_ms"]))
            calls["encode"] += [lat[k] for k in ("encode_small", "encode_large") if k in lat]
    cpu = ms_per_request(cpu_before, cpu_seconds(processes), n)
    workload = traces.workload()
    medians = {k: statistics.median(v) for k, v in calls.items() if v}
    return round(statistics.median(overhead), 3), workload, medians, cpu, decodes


def served_step_overhead(decodes: list[tuple[str, int, int, float]], generators: dict) -> dict[str, float]:
    """Per role, what a served decode step costs beyond the engine's own step, ms: the served rows'
    decode time (prefill and steps, one request at a time) less what the simulator predicts for the
    same prompts and steps from the engine curves, per step. The served loop shares its process with
    the replica's event loop, which handles every token's stream message under the same GIL
    (the small model's reasoning decoded at 2.3 ms a step served, 1.2 ms alone)."""
    from capacity.profile import generator_curves

    out = {}
    for role, g in generators.items():
        prefill, step = generator_curves(g)
        step1 = step(1)
        rows = [(p, k, ms) for r, p, k, ms in decodes if r == role]
        steps = sum(k for _, k, _ in rows)
        if steps:
            extra = sum(ms - prefill(p) - k * step1 for p, k, ms in rows)
            out[role] = round(max(0.0, extra / steps), 3)
    return out


def measure_cpu_busy(url: str, n: int, concurrency: int, seed: int = 0) -> tuple[dict[str, float], float]:
    """Every app process's CPU ms per request with `concurrency` requests in flight (other held-out
    items, so the feature cache stays cold): batching and the processes' per-iteration loops spread
    part of what one request alone costs over the requests in flight. And the cores the machine's
    other processes kept busy meanwhile (Ray's own: on shared cores, not there for the app)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from benchmarks.client import item_body
    from capacity.cpu_per_request import app_processes, cpu_seconds, machine_busy_s, ms_per_request, others_cores
    from tasks.grid import grid_items

    bodies = [item_body(item) for item in grid_items(n, seed=seed + 8)]
    processes = app_processes()

    def client(part: list[dict]) -> None:
        with httpx.Client(timeout=120) as http:
            for body in part:
                http.post(f"{url}/v1/chat/completions", json=body).raise_for_status()

    cpu_before, machine_before, start = cpu_seconds(processes), machine_busy_s(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client, [bodies[i::concurrency] for i in range(concurrency)]))
    cpu_after, machine_after = cpu_seconds(processes), machine_busy_s()
    others = others_cores(machine_before, machine_after, cpu_before, cpu_after, time.perf_counter() - start)
    return ms_per_request(cpu_before, cpu_after, n), others


BUSY_CONCURRENCY = 8


def build_profile(config, grid: dict, *, url: str | None = None, router_ms: float = 1.0, app_requests: int = 40,
                  busy_requests: int | None = None,
                  vision_wait_s: float = 0.005, bar=None) -> dict:
    from tasks.grid import grid_items
    from capacity.profile import PROFILE_KIND

    item = grid_items(1, seed=0)[0]
    started = time.time()
    measured = profile_engines(config, grid, item.image, item.prompt(), bar)
    workload, calls, cpu, busy, served, others = {}, {}, {}, {}, {}, 0.0
    if url:
        router_ms, workload, medians, cpu, decodes = measure_app(url, app_requests)
        served = served_step_overhead(decodes, measured["generators"])
        # The busy figure sets the simulated capacity: over 60 requests (8 clients of 7-8 each) the
        # start and the stragglers, with fewer in flight, weigh a fifth, and a few seconds of a
        # neighbour's load moved it 0.63-0.97x of the alone figure between runs.
        busy, others = measure_cpu_busy(url, busy_requests or app_requests, BUSY_CONCURRENCY)
        calls = {"generate": round(max(0.0, medians.get("generate", 0.0)), 3)}
        if "encode" in medians:
            # One request's two encode calls batch together (each model's tower on its image) after
            # the batch wait: what remains of an encode stage's latency is the call's overhead.
            both = sum(next(q["ms"] for q in measured["vision"][r] if q["images"] == 1) for r in ("small", "large"))
            calls["encode"] = round(max(0.0, medians["encode"] - vision_wait_s * 1000 - both), 3)
    import torch
    source = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "device": config.large.device, "dtype": config.large.dtype,
              "torch_threads": torch.get_num_threads(),
              "models": {"small": config.small.model, "large": config.large.model},
              "grid": grid, "app": url, "wall_s": round(time.time() - started, 1)}
    return {"kind": PROFILE_KIND, "version": 1, "source": source, "router": {"ms": router_ms},
            **measured, **({"workload": workload, "calls": calls} if workload else {}),
            **({"served": {"step_overhead_ms": served}} if served else {}),
            **({"cpu_ms_per_request": cpu} if len(cpu) > 1 else {}),
            **({"cpu_ms_per_request_busy": {"concurrency": BUSY_CONCURRENCY, "ms": busy, "others_cores": others}}
               if len(busy) > 1 else {})}


def print_profile(p: dict) -> None:
    print(f"router: {p['router']['ms']:.2f} ms per request" + "".join(
        f"; {k} call overhead {v:.2f} ms" for k, v in p.get("calls", {}).items()))
    for role, pts in p["vision"].items():
        print(f"vision {role:<5}: " + "  ".join(f"{q['images']}img={q['ms']:.1f}ms" for q in pts))
    served = p.get("served", {}).get("step_overhead_ms", {})
    for role, g in p["generators"].items():
        print(f"prefill {role:<5}: " + "  ".join(f"b{q['batch']}x{q['prompt_tokens']}tok={q['ms']:.1f}ms"
                                                for q in g["prefill"]))
        print(f"step {role:<5}   : " + "  ".join(f"b{q['batch']}={q['ms']:.2f}ms" for q in g["step"])
              + (f"  (served: +{served[role]:.2f} ms a step)" if role in served else ""))
    if p.get("cpu_ms_per_request"):
        cpu = p["cpu_ms_per_request"]
        print(f"CPU per request (all the app's processes): {sum(cpu.values()):.1f} ms = " + ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])))
    if p.get("cpu_ms_per_request_busy"):
        busy = p["cpu_ms_per_request_busy"]
        print(f"CPU per request with {busy['concurrency']} in flight: {sum(busy['ms'].values()):.1f} ms = " + ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(busy["ms"].items(), key=lambda kv: -kv[1]))
              + (f"; the machine's other processes meanwhile: {busy['others_cores']:.2f} cores" if "others_cores" in busy else ""))
    if p.get("workload"):
        w = p["workload"]
        print(f"workload: mutual, transfer {w['transfer_rate']:.1%} of {w.get('requests', 'assumed')}; " + "; ".join(
            f"{k} {v['prompt_tokens']:.0f} prompt tok, {v['decode_steps']:.1f} steps" for k, v in w["stages"].items()))


def main(argv=None) -> int:
    from tandem.cli import read_tandem_args
    from tandem.config import load_tandem_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "serve_config.yaml"), help="serve config or Tandem args (the models)")
    p.add_argument("--device", help="override both models' device (cuda, cpu)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about a minute on CPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads, as a replica gets them (Ray gives a num_cpus <= 1 actor one); 0: torch's default")
    p.add_argument("--url", help="a running Tandem: also measure router.ms and the mutual workload")
    p.add_argument("--router-ms", type=float, default=1.0, help="router.ms when no --url is given")
    p.add_argument("--estimate", choices=sorted(GPUS) + ["cluster"],
                   help="no measurement: a roofline estimate for this GPU, or cluster/'s GPUs per pool (L4, L40S)")
    p.add_argument("--out", required=True, help="where the profile JSON goes")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.estimate:
        profile = estimate_profile(args.estimate)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(profile, indent=1))
        print_profile(profile)
        print(f"profile (estimated, not measured): {args.out}")
        print(json.dumps({"benchmark": "stage_profile", "out": args.out, "estimate": args.estimate}))
        return 0
    import torch
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    data = read_tandem_args(args.config)
    if args.device:
        for role in ("small", "large"):
            data.setdefault(role, {})["device"] = args.device
    config = load_tandem_config(data)
    grid = QUICK if args.quick else FULL
    with tqdm(total=2 * (len(grid["vision"]) + len(grid["batches"])), desc="stage profile") as bar:
        profile = build_profile(config, grid, url=args.url, router_ms=args.router_ms, bar=bar)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(profile, indent=1))
    print_profile(profile)
    print(f"profile: {args.out}")
    print(json.dumps({"benchmark": "stage_profile", "out": args.out, "router_ms": profile["router"]["ms"],
                      "models": profile["source"]["models"], "device": profile["source"]["device"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
