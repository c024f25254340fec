"""Replica affinity under load: with two replicas of each model, does a request's second stage on a
model reach the replica holding its prompt head, and does the transfer then reuse that head?

    python -m benchmarks.affinity                    # transformers: affinity on and off, ~3 min on 2 cores
    python -m benchmarks.affinity --engine vllm      # in .venv-vllm: serve_config.vllm-cpu.yaml, affinity on
    python -m benchmarks.affinity --quick

The app as its config ships, with `num_replicas: 2` for SmallReasoner and LargeAnswerer; with
transformers also a twin at `/off` whose model pools use Serve's default router (power of two
choices). A closed loop of 8 clients asks `mutual` about held-out grid items (the trained pair; on
vLLM, serve_config.vllm-cpu.yaml's random-init pair), on and off alternating in rounds. From each
answer's trace: the affinity hit rate (second stages on the first stage's replica: small_reasoning
after small_direct, large_transfer after large_direct), the share of transfers with cached_tokens > 0,
throughput and p50. Prints its conditions and a table, ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time

import httpx

from benchmarks.client import LocalApps, item_body
from benchmarks.metrics import percentile

FOLLOWS = {"small_reasoning": "small_direct", "large_transfer": "large_direct"}


def two_replicas(app: dict) -> None:
    for dep in app["deployments"]:
        if dep["name"] in ("SmallReasoner", "LargeAnswerer"):
            dep["num_replicas"] = 2


def default_router(app: dict) -> None:
    for dep in app["deployments"]:
        dep.pop("request_router_config", None)


async def closed_loop(url: str, items, requests: int, concurrency: int = 8) -> tuple[list[dict], list[float], float]:
    counter, traces, latencies = iter(range(requests)), [], []

    async def client(http):
        for i in counter:
            start = time.monotonic()
            r = await http.post(f"{url}/v1/chat/completions", json=item_body(items[i % len(items)], "mutual"))
            r.raise_for_status()
            latencies.append((time.monotonic() - start) * 1000)
            traces.append(r.json()["tandem"])

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:
        start = time.monotonic()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return traces, latencies, time.monotonic() - start


def summarize(traces: list[dict], latencies: list[float], wall_s: float) -> dict:
    seconds = [(s[second], s[first]) for t in traces for s in [t["stages"]]
               for second, first in FOLLOWS.items() if second in s and first in s]
    transfers = [t["stages"]["large_transfer"] for t in traces if "large_transfer" in t["stages"]]
    return {"requests": len(traces), "rps": round(len(traces) / wall_s, 2), "p50_ms": round(percentile(latencies, 50), 1),
            "second_stages": len(seconds),
            "hit_rate": round(sum(a.get("replica") == b.get("replica") for a, b in seconds) / len(seconds), 4)
            if seconds else None,
            "transfers": len(transfers),
            "cached_share": round(sum(s["cached_tokens"] > 0 for s in transfers) / len(transfers), 4) if transfers else None,
            "replicas": len({s.get("replica") for t in traces for s in t["stages"].values() if s.get("replica")})}


def run(url: str, modes: dict[str, str], items, requests: int, rounds: int) -> dict[str, dict]:
    got: dict[str, list] = {m: [[], [], 0.0] for m in modes}
    asyncio.run(closed_loop(url, items, 16))  # warm-up
    for r in range(rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            traces, latencies, wall = asyncio.run(closed_loop(url + modes[mode], items, requests))
            got[mode][0] += traces
            got[mode][1] += latencies
            got[mode][2] += wall
    return {mode: summarize(*got[mode]) for mode in modes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    ap.add_argument("--requests", type=int, default=200, help="requests per round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (on and off alternating with transformers)")
    ap.add_argument("--quick", action="store_true", help="64 requests a round, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 64, 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tasks.grid import grid_items

    vllm = args.engine == "vllm"
    print(f"affinity: engine {args.engine}, 2 replicas per model pool, closed loop c=8 mutual, "
          f"{args.rounds} x {args.requests} requests{' per setting, on/off alternating' if not vllm else ''}; "
          f"{platform.machine()} {os.cpu_count()} cores shared by client and server")
    items = grid_items(64, seed=0, split="eval")
    apps = LocalApps(engine="vllm", edit=two_replicas, startup_timeout_s=600) if vllm else \
        LocalApps(edit=two_replicas, twins={"off": default_router})
    modes = {"on": ""} if vllm else {"on": "", "off": "/off"}
    with apps:
        rows = run(apps.url, modes, items, args.requests, args.rounds)
    print(f"{'affinity':9} {'requests':>8} {'req/s':>7} {'p50 ms':>7} {'2nd stages':>10} {'hit rate':>9} "
          f"{'transfers':>9} {'cached>0':>9} {'replicas':>8}")
    for mode, s in rows.items():
        print(f"{mode:9} {s['requests']:>8} {s['rps']:>7} {s['p50_ms']:>7} {s['second_stages']:>10} {s['hit_rate']!s:>9} "
              f"{s['transfers']:>9} {s['cached_share']!s:>9} {s['replicas']:>8}")
    on = rows["on"]
    bars = {"hit_rate_ge_95": (on["hit_rate"] or 0) >= 0.95, "cached_ge_95": (on["cached_share"] or 0) >= 0.95}
    print(json.dumps({"benchmark": "affinity", "engine": args.engine, **rows, "bars": bars}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
