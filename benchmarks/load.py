"""The served system under load: closed-loop concurrency and open-loop Poisson sweeps.

    python -m benchmarks.load --quick                       # starts serve_config.yaml (+ a bare twin)
    python -m benchmarks.load --url http://host:8000 --concurrency 1,4,16,64 --rates 2,8,32
    python -m benchmarks.load --models tiny --no-bare --stream --policy large --max-tokens 64 --concurrency 1 --rates ""
    python -m benchmarks.load --engines transformers,vllm --stream --concurrency 1,4,16,32 --rates ""   # in .venv-vllm

Closed loop: C clients each send their next request when the last returns. Open loop: arrivals at
a Poisson rate, each request on its own, whether or not earlier ones finished (what shows queueing
and rejections). Each point is bounded in requests and seconds and reports throughput (req/s and
output tok/s), p50/p95/p99, errors and 503 rejections, and the mean per-stage latency from the
`tandem` trace; with --stream, time to the first delta (TTFT), to the first answer delta, and the
gaps between deltas (inter-token latency), p50/p95. The same run measures the bare cost of the Serve composition: the same four
deployments and hops with a model-free engine (`/bare`), so Tandem's own cost can be stated as a
ratio to it. With --engines, the app is started once per engine on the same checkpoints (those of
serve_config.vllm-cpu.yaml, which both engines run; each engine's deployments as its config ships
them) and the figures are reported per engine. Table, PNG, JSON, and one JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.client import ROOT, LocalApps, Outcome, chat_body, poisson_sends, post_chat, stream_chat, synthetic_png
from benchmarks.metrics import count_statuses, summarize_latencies

IMAGES = [synthetic_png(seed) for seed in range(8)]


@dataclass(frozen=True)
class Shape:
    """What every request of a run looks like (from the command line)."""

    policy: str = "mutual"
    max_tokens: int = 8
    stream: bool = False
    stream_reasoning: bool = False


def body_for(i: int, shape: Shape) -> dict:
    body = chat_body(shape.policy, f"Load question {i}: what is shown?", IMAGES[i % len(IMAGES)], shape.max_tokens)
    if shape.stream_reasoning:
        body["tandem"] = {"stream_reasoning": True}
    return body


def send(http, url: str, shape: Shape, i: int, t0: float):
    return (stream_chat if shape.stream else post_chat)(http, url, body_for(i, shape), t0)


async def closed_loop(url: str, shape: Shape, concurrency: int, requests: int, max_s: float) -> tuple[list, float]:
    counter, outcomes, start = iter(range(requests)), [], time.monotonic()

    async def client(http):
        for i in counter:
            if time.monotonic() - start > max_s:
                return
            outcomes.append(await send(http, url, shape, i, start))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return outcomes, time.monotonic() - start


async def open_loop(url: str, shape: Shape, rate: float, requests: int, max_s: float, seed: int) -> tuple[list, float]:
    tasks, start = [], time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1000)) as http:
        async for _ in poisson_sends(rate, seed, max_s):
            tasks.append(asyncio.ensure_future(send(http, url, shape, len(tasks), start)))
            if len(tasks) == requests:
                break
        outcomes = await asyncio.gather(*tasks)
    return list(outcomes), time.monotonic() - start


def point(kind: str, load: float, outcomes: list[Outcome], wall_s: float, streamed: bool = False) -> dict:
    ok = [o for o in outcomes if o.status == 200]
    stages: dict[str, list[float]] = defaultdict(list)
    for o in ok:
        for stage, ms in o.trace.get("latency_ms", {}).items():
            stages[stage].append(ms)
    deltas = {}
    if streamed:
        def pct(values, name):
            got = summarize_latencies([v for v in values if v is not None])
            return {f"{name}_p50_ms": round(got.get("p50_ms", float("nan")), 1),
                    f"{name}_p95_ms": round(got.get("p95_ms", float("nan")), 1)}
        deltas = {**pct([o.ttft_ms for o in ok], "ttft"), **pct([o.ttfc_ms for o in ok], "ttfc"),
                    **pct([gap for o in ok for gap in o.itl_ms], "itl")}
    return {"kind": kind, "load": load, "requests": len(outcomes), "wall_s": round(wall_s, 2), **deltas,
            "throughput_rps": round(len(ok) / wall_s, 3) if wall_s else 0.0,
            "output_tok_s": round(sum(o.completion_tokens for o in ok) / wall_s, 1) if wall_s else 0.0,
            **{k: round(v, 1) for k, v in summarize_latencies([o.latency_ms for o in ok]).items() if k != "n"},
            "statuses": count_statuses(o.status for o in outcomes),
            "rejected": sum(1 for o in outcomes if o.status == 503),
            "errors": sum(1 for o in outcomes if o.status not in (200, 503)),
            "stage_mean_ms": {k: round(sum(v) / len(v), 1) for k, v in sorted(stages.items())}}


def format_point(p: dict) -> str:
    stages = " ".join(f"{k}={v:.0f}" for k, v in p["stage_mean_ms"].items() if k != "total")
    streamed = (f" ttft {p['ttft_p50_ms']:.0f}/{p['ttft_p95_ms']:.0f} itl {p['itl_p50_ms']:.1f}/{p['itl_p95_ms']:.1f}"
                if "ttft_p50_ms" in p else "")
    return (f"{p['kind']:<7} {p['load']:>6} {p['requests']:>5} {p['throughput_rps']:>7.2f} {p['output_tok_s']:>8.1f} "
            f"{p['p50_ms']:>8.1f} {p['p95_ms']:>8.1f} {p['p99_ms']:>8.1f} {p['rejected']:>4} {p['errors']:>4} "
            f"{streamed}  {stages}")


def plot(points: list[dict], path: Path) -> None:
    from benchmarks.plotting import subplots

    fig, ax = subplots(figsize=(8, 5))
    for kind, marker in (("closed", "o"), ("open", "s")):
        pts = [p for p in points if p["kind"] == kind]
        for q in ("p50_ms", "p95_ms"):
            ax.plot([p["throughput_rps"] for p in pts], [p[q] for p in pts], marker=marker, label=f"{kind} {q}")
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def run(args, url: str, bare_url: str | None) -> dict:
    shape = Shape(args.policy, args.max_tokens, args.stream, args.stream_reasoning)
    print(f"{'kind':<7} {'load':>6} {'n':>5} {'req/s':>7} {'tok/s':>8} {'p50_ms':>8} {'p95_ms':>8} {'p99_ms':>8} "
          f"{'rej':>4} {'err':>4}  mean stage ms")
    from tqdm import tqdm

    asyncio.run(closed_loop(url, shape, 2, 4, 60))  # warm-up: connections, caches
    points = []
    sweep = [("closed", c) for c in args.concurrency] + [("open", r) for r in args.rates]
    with tqdm(total=len(sweep), desc="load points", disable=None, leave=False) as bar:
        for kind, value in sweep:
            if kind == "closed":
                outcomes, wall = asyncio.run(closed_loop(url, shape, value, max(args.requests, value), args.max_s))
            else:
                n = max(args.requests, int(value * args.open_s))
                outcomes, wall = asyncio.run(open_loop(url, shape, value, n, args.open_s, args.seed))
            points.append(point(kind, value, outcomes, wall, shape.stream))
            bar.write(format_point(points[-1]))
            bar.update()
    bare = None
    if bare_url:
        asyncio.run(closed_loop(bare_url, shape, 1, 4, 60))
        outcomes, wall = asyncio.run(closed_loop(bare_url, shape, 1, args.requests, args.max_s))
        bare = point("bare", 1, outcomes, wall, shape.stream)
        print(format_point(bare), flush=True)
    return {"points": points, "bare": bare}


def summary(args, result: dict) -> dict:
    closed = {p["load"]: p for p in result["points"] if p["kind"] == "closed"}
    tandem_c1 = closed.get(1)
    out = {"benchmark": "load", "policy": args.policy,
           "closed_rps": {str(k): p["throughput_rps"] for k, p in closed.items()},
           "closed_p50_ms": {str(k): p["p50_ms"] for k, p in closed.items()},
           **({"stream": True, "closed_ttft_p50_ms": {str(k): p["ttft_p50_ms"] for k, p in closed.items()},
               "closed_ttft_p95_ms": {str(k): p["ttft_p95_ms"] for k, p in closed.items()},
               "closed_itl_p50_ms": {str(k): p["itl_p50_ms"] for k, p in closed.items()},
               "closed_itl_p95_ms": {str(k): p["itl_p95_ms"] for k, p in closed.items()}} if args.stream else {}),
           "open": [{"rate": p["load"], "rps": p["throughput_rps"], "p95_ms": p["p95_ms"], "rejected": p["rejected"],
                     "errors": p["errors"]} for p in result["points"] if p["kind"] == "open"]}
    if result["bare"] and tandem_c1:
        out["bare_p50_ms"] = result["bare"]["p50_ms"]
        out["tandem_p50_ms_c1"] = tandem_c1["p50_ms"]
        out["overhead_ratio"] = round(tandem_c1["p50_ms"] / result["bare"]["p50_ms"], 2)
    return out


def compare_engines(args) -> int:
    """The same sweep against the app on each engine in turn; one JSON line with a summary each."""
    results = {}
    for engine in args.engines.split(","):
        print(f"--- engine {engine}")
        with LocalApps(bare=False, engine=engine) as apps:
            results[engine] = run(args, apps.url, None)
    out = Path(args.out) / f"load-engines-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(results, indent=1))
    for engine, result in results.items():
        plot(result["points"], out / f"load-{engine}.png")
    print(f"results: {out}")
    print(json.dumps({"benchmark": "load", "engines": {e: summary(args, r) for e, r in results.items()}}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running endpoint (default: start serve_config.yaml and a bare twin)")
    ap.add_argument("--bare-url", help="with --url: a model-free twin to measure the composition cost against")
    ap.add_argument("--policy", default="mutual")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="closed-loop sweep")
    ap.add_argument("--rates", default="1,2,4,8,16", help="open-loop sweep, requests per second")
    ap.add_argument("--requests", type=int, default=200, help="requests per point (at least)")
    ap.add_argument("--max-s", type=float, default=120, help="longest a closed-loop point runs")
    ap.add_argument("--open-s", type=float, default=30, help="how long an open-loop point sends")
    ap.add_argument("--quick", action="store_true", help="CPU, tiny models, a short sweep: under two minutes")
    ap.add_argument("--stream", action="store_true", help="stream every request: adds TTFT and inter-token latency")
    ap.add_argument("--stream-reasoning", action="store_true", help="with --stream: ask for reasoning deltas too")
    ap.add_argument("--max-tokens", type=int, default=8, help="max_tokens of every request")
    ap.add_argument("--models", choices=["trained", "tiny"], default="trained",
                    help="when starting the app: the trained pair, or the random-init tiny pair (never stops early)")
    ap.add_argument("--no-bare", action="store_true", help="when starting the app: skip the model-free twin")
    ap.add_argument("--engines", help="compare engines, e.g. transformers,vllm (starts the app once per engine, "
                                      "no bare twin; needs .venv-vllm for vllm)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.concurrency, args.rates, args.requests, args.max_s, args.open_s = "1,4,16", "2,32", 16, 15, 6
    args.concurrency = [int(x) for x in str(args.concurrency).split(",")]
    args.rates = [float(x) for x in str(args.rates).split(",") if x]
    print(f"load: policy {args.policy}; closed {args.concurrency}; open {args.rates} req/s for {args.open_s} s; "
          f"{args.requests} requests a point; client on {platform.machine()}, {os.cpu_count()} cores (shared with "
          "the server when it starts the app itself)")
    if args.engines:
        return compare_engines(args)
    if args.url:
        result = run(args, args.url, args.bare_url)
    else:
        with LocalApps(bare=not args.no_bare, models=args.models) as apps:
            result = run(args, apps.url, None if args.no_bare else apps.url + "/bare")
    out = Path(args.out) / f"load-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(result, indent=1))
    plot(result["points"], out / "load.png")
    print(f"results: {out}")
    print(json.dumps(summary(args, result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
