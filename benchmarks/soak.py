"""Soak: steady load on a Tandem endpoint for a bounded time; reports errors, latency drift and replica
memory growth per window.

    python -m benchmarks.soak --duration-s 600              # starts serve_config.yaml locally
    python -m benchmarks.soak --url http://host:8000 ...    # an endpoint already running

Closed loop: `--concurrency` clients, each sending its next request when the last one returned,
cycling policies and images (a share of repeated images exercises the feature cache). Every other
request streams, and one in eight streams and hangs up after its first delta (status "abandoned",
not an error), so cancelled rows and closed streams are soaked too. When it
starts the app itself it also samples each replica's resident memory (RSS) through psutil. Prints a
table per window, writes results/soak-*/soak.json and soak.png, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time
from pathlib import Path

import httpx

from benchmarks.client import ROOT, LocalApps, chat_body, post_chat, stream_chat, synthetic_png
from benchmarks.metrics import count_statuses, drift, summarize_latencies
POLICIES = ("mutual", "large", "always", "confidence")


def request_body(i: int, rng: random.Random) -> dict:
    seed = rng.randrange(16) if rng.random() < 0.5 else 1000 + i  # half repeat a small set of images
    return chat_body(POLICIES[i % len(POLICIES)], f"Question {i}: how many shapes are there?", synthetic_png(seed))


class ReplicaMemory:
    """Resident memory of each replica of the locally started app, by deployment. Joins the app's
    local Ray cluster as a driver only to ask each deployment for its replica's pid."""

    def __init__(self, app: str = "tandem"):
        import ray
        from ray import serve

        ray.init(address="auto", log_to_driver=False)

        self.handles = {d: serve.get_deployment_handle(d, app_name=app)
                        for d in ("Router", "VisionEncoder", "SmallReasoner", "LargeAnswerer")}

    def sample_mb(self) -> dict[str, float]:
        import psutil

        out = {}
        for name, h in self.handles.items():
            out[name] = psutil.Process(h.stats.remote().result()["pid"]).memory_info().rss / 2**20
        return out


async def run_load(url: str, duration_s: float, concurrency: int, window_s: float, memory, seed: int):
    rng = random.Random(seed)
    windows: list[dict] = []
    records: list[tuple[float, float, int | str]] = []  # (finish time, latency ms, status)
    start = time.monotonic()
    counter = iter(range(10**9))

    async def client(http: httpx.AsyncClient):
        while time.monotonic() - start < duration_s:
            i = next(counter)
            body = request_body(i, rng)
            if i % 2:
                o = await stream_chat(http, url, body, start, abandon=i % 8 == 1)
            else:
                o = await post_chat(http, url, body, start)
            records.append((o.finished_s, o.latency_ms, o.status))

    async def sampler():
        next_edge = window_s
        while next_edge <= duration_s + 1e-9:
            await asyncio.sleep(max(0.0, next_edge - (time.monotonic() - start)))
            rows = [r for r in records if next_edge - window_s <= r[0] < next_edge]
            mem = await asyncio.to_thread(memory.sample_mb) if memory else {}
            window = {"end_s": round(next_edge, 1), "statuses": count_statuses(s for _, _, s in rows),
                      **summarize_latencies([lat for _, lat, s in rows if s == 200]), "rss_mb": mem}
            windows.append(window)
            print_window(window)
            next_edge += window_s

    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(sampler(), *(client(http) for _ in range(concurrency)))
    return windows, records


def print_window(w: dict) -> None:
    mem = " ".join(f"{k[:5]}={v:.0f}" for k, v in w["rss_mb"].items())
    print(f"{w['end_s']:>7.0f} {w['n']:>6} {w['p50_ms']:>8.1f} {w['p95_ms']:>8.1f} {w['p99_ms']:>8.1f}  "
          f"{json.dumps(w['statuses']):<28} {mem}", flush=True)


def summarize(windows: list[dict], records, duration_s: float) -> dict:
    first, last = windows[0], windows[-1]
    statuses = count_statuses(s for _, _, s in records)
    growth = {k: round(last["rss_mb"][k] - first["rss_mb"][k], 1) for k in last["rss_mb"] if k in first["rss_mb"]}
    half = [w["rss_mb"] for w in windows[len(windows) // 2:] if w["rss_mb"]]
    # The second half, after warm-up and allocator growth: (max - min) / min per replica.
    flatness = {k: round((max(h[k] for h in half) - min(h[k] for h in half)) / min(h[k] for h in half), 4)
                for k in (half[0] if half else {})}
    return {"benchmark": "soak", "duration_s": duration_s, "requests": len(records),
            "throughput_rps": round(len(records) / duration_s, 2), "statuses": statuses,
            "errors": sum(v for k, v in statuses.items() if k not in ("200", "abandoned")),
            "abandoned": statuses.get("abandoned", 0),
            "p50_first_ms": round(first["p50_ms"], 1), "p50_last_ms": round(last["p50_ms"], 1),
            "p50_drift": round(drift(first["p50_ms"], last["p50_ms"]), 3),
            "p95_drift": round(drift(first["p95_ms"], last["p95_ms"]), 3),
            "rss_first_mb": {k: round(v, 1) for k, v in first["rss_mb"].items()},
            "rss_growth_mb": growth, "rss_second_half_range": flatness}


def plot(windows: list[dict], path: Path) -> None:
    from benchmarks.plotting import subplots

    t = [w["end_s"] for w in windows]
    fig, (a, b) = subplots(2, 1, figsize=(8, 6), sharex=True)
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        a.plot(t, [w[key] for w in windows], marker="o", label=key)
    a.set_ylabel("latency (ms)")
    a.legend()
    for name in windows[0]["rss_mb"]:
        b.plot(t, [w["rss_mb"].get(name) for w in windows], marker="o", label=name)
    b.set_ylabel("replica RSS (MB)")
    b.set_xlabel("time (s)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running endpoint; default: start serve_config.yaml locally")
    p.add_argument("--duration-s", type=float, default=600)
    p.add_argument("--window-s", type=float, default=60)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "results"))
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    if args.url:
        return report(args, args.url, None)
    with LocalApps():
        return report(args, "http://127.0.0.1:8020", ReplicaMemory())


def report(args, url: str, memory) -> int:
    print(f"soak: {url}, {args.duration_s:.0f} s, concurrency {args.concurrency}, window {args.window_s:.0f} s, "
          f"policies {','.join(POLICIES)}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"{'t_s':>7} {'n':>6} {'p50_ms':>8} {'p95_ms':>8} {'p99_ms':>8}  {'statuses':<28} rss_mb")
    windows, records = asyncio.run(run_load(url, args.duration_s, args.concurrency, args.window_s, memory, args.seed))
    summary = summarize(windows, records, args.duration_s)
    out = Path(args.out) / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps({"summary": summary, "windows": windows}, indent=1))
    plot(windows, out / "soak.png")
    print(f"results: {out}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
