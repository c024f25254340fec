"""What serving adds to a request beyond Serve's own hops, and whether the batch waits still pay.

    python -m benchmarks.served_overhead            # 60 held-out grid items a policy, ~3 min on 2 cores
    python -m benchmarks.served_overhead --quick    # 20 items, c=8 for 48 requests

On the trained pair, one run, four ways to answer the same held-out grid items, at c=1 in
alternating blocks (so drift in the machine's speed falls on all four alike):
- `in-process`: the pipeline and engines in this process (`tandem.local`), no Serve;
- `served`: serve_config.yaml as it ships, over HTTP (proxy -> Router -> VisionEncoder -> model servers);
- `fixed`: the same app with every batching deployment waiting its whole window (`batch_wait_mode:
  always`), as a server that waits for company whether or not any is coming;
- `bare`: the same app on the model-free engine: the cost of the hops themselves. For `mutual`, whose
  hops depend on whether it transfers, two twins: one whose fake models agree (no transfer hop) and
  one whose models disagree (always the transfer hop), weighted by the share of served requests that
  transferred.
Per policy: p50 of each, `added` = served - in-process - bare (what Tandem adds beyond the hops),
and served / in-process. Then a closed loop at c=8 (`mutual`), served and fixed alternating in
rounds: throughput of each. Prints its conditions and a table, ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time

import httpx

from benchmarks.client import ROOT, Asker, LocalApps, item_body
from benchmarks.metrics import percentile

POLICIES = ("large", "mutual", "always")
MODES = ("in-process", "served", "fixed", "bare")
TRANSFERRING = "bare-transfer"  # the twin whose fake models disagree
BLOCK = 10


def fixed_waits(app: dict) -> None:
    """Every batching deployment waits its whole window, as before waits became adaptive."""
    for dep in app["deployments"]:
        if "batch_wait_timeout_s" in dep.get("user_config", {}):
            dep["user_config"]["batch_wait_mode"] = "always"


def in_process_asker(asker):
    def ask(item, policy):
        return asker(item, policy)[1]["path"]
    return ask


def served_asker(http: httpx.Client, url: str):
    def ask(item, policy):
        r = http.post(f"{url}/v1/chat/completions", json=item_body(item, policy))
        r.raise_for_status()
        return r.json()["tandem"]["path"]
    return ask


def c1_blocks(items, policy: str, askers: dict) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Each mode answers every item, block by block, the modes' order rotating per block: each
    answer's time (ms) and path."""
    ms: dict[str, list[float]] = {m: [] for m in askers}
    paths: dict[str, list[str]] = {m: [] for m in askers}
    modes = list(askers)
    for b, start in enumerate(range(0, len(items), BLOCK)):
        for mode in modes[b % len(modes):] + modes[:b % len(modes)]:
            for item in items[start:start + BLOCK]:
                t0 = time.perf_counter()
                paths[mode].append(askers[mode](item, policy))
                ms[mode].append((time.perf_counter() - t0) * 1000)
    return ms, paths


async def closed_c8(url: str, items, requests: int, concurrency: int = 8) -> float:
    """Requests per second of a closed loop of `concurrency` clients asking `mutual`."""
    counter = iter(range(requests))

    async def client(http):
        for i in counter:
            r = await http.post(f"{url}/v1/chat/completions", json=item_body(items[i % len(items)], "mutual"))
            r.raise_for_status()

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:
        start = time.monotonic()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return requests / (time.monotonic() - start)


def throughput_rounds(apps_url: str, items, requests: int, rounds: int) -> dict[str, list[float]]:
    rps: dict[str, list[float]] = {"served": [], "fixed": []}
    for r in range(rounds):
        for mode in (("served", "fixed") if r % 2 == 0 else ("fixed", "served")):
            url = apps_url + ("/fixed" if mode == "fixed" else "")
            rps[mode].append(asyncio.run(closed_c8(url, items, requests)))
    return rps


def table(runs: dict[str, tuple[dict, dict]]) -> dict[str, dict]:
    rows = {}
    print(f"{'policy':8} " + " ".join(f"{m + ' p50':>15}" for m in MODES) + f" {'added ms':>9} {'served/in':>10}")
    for policy, (ms, paths) in runs.items():
        p50 = {m: percentile(ms[m], 50) for m in MODES}
        if TRANSFERRING in ms:  # mutual: the bare hops of its served path mix
            share = paths["served"].count("transfer") / len(paths["served"])
            p50["bare"] = (1 - share) * p50["bare"] + share * percentile(ms[TRANSFERRING], 50)
        added = p50["served"] - p50["in-process"] - p50["bare"]
        ratio = p50["served"] / p50["in-process"]
        rows[policy] = {**{f"{m}_p50_ms": round(v, 2) for m, v in p50.items()},
                        "added_ms": round(added, 2), "served_over_in_process": round(ratio, 3), "n": len(ms["served"])}
        print(f"{policy:8} " + " ".join(f"{p50[m]:>15.1f}" for m in MODES) + f" {added:>9.1f} {ratio:>10.2f}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=60, help="held-out grid items per policy at c=1")
    ap.add_argument("--c8-requests", type=int, default=160, help="requests per c=8 round")
    ap.add_argument("--rounds", type=int, default=4, help="c=8 rounds, served and fixed alternating")
    ap.add_argument("--quick", action="store_true", help="20 items, 48 requests a round, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.c8_requests, args.rounds = 20, 48, 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from tasks.grid import grid_items

    torch.set_num_threads(1)  # as a replica has it (Ray: one thread for a num_cpus <= 1 actor)
    print(f"served_overhead: trained pair, {args.n} held-out grid items a policy at c=1 in blocks of {BLOCK} "
          f"(modes rotating), then c=8 mutual {args.rounds} x {args.c8_requests} requests alternating; "
          f"{platform.machine()} {os.cpu_count()} cores shared by client, in-process engines and server")
    items = grid_items(args.n, seed=0, split="eval")
    in_process = in_process_asker(Asker(None, None, str(ROOT / "serve_config.yaml")))  # the same args as served
    # The bare twins reason as long as the trained pair usually does (~32 tokens): their decode loops
    # then step as often as the real ones, and only the model's compute is missing.
    bare = {"engine": "fake", "fake": {"reasoning_words": 32}}
    twins = {"fixed": fixed_waits, "bare": lambda app: app["args"].update(bare),
             TRANSFERRING: lambda app: app["args"].update(engine="fake", fake={"reasoning_words": 32, "small_answer": "B"})}
    with LocalApps(twins=twins) as apps, httpx.Client(timeout=120) as http:
        askers = {"in-process": in_process, **{m: served_asker(http, apps.url + ("" if m == "served" else f"/{m}"))
                                               for m in ("served", "fixed", "bare", TRANSFERRING)}}
        runs = {}
        for policy in POLICIES:
            modes = {m: a for m, a in askers.items() if m != TRANSFERRING or policy == "mutual"}
            c1_blocks(items[:4], policy, modes)  # warm-up: connections, caches, first-call costs
            runs[policy] = c1_blocks(items, policy, modes)
        rps = throughput_rounds(apps.url, items, args.c8_requests, args.rounds)
    rows = table(runs)
    c8 = {mode: round(sum(v) / len(v), 2) for mode, v in rps.items()}
    print(f"c=8 mutual req/s: served {c8['served']} (rounds {[round(x, 2) for x in rps['served']]}), "
          f"fixed waits {c8['fixed']} (rounds {[round(x, 2) for x in rps['fixed']]})")
    bars = {"added_le_3ms": all(r["added_ms"] <= 3 for r in rows.values()),
            "mutual_always_le_1_1x": all(rows[p]["served_over_in_process"] <= 1.1 for p in ("mutual", "always")),
            "c8_not_below_fixed": c8["served"] >= c8["fixed"]}
    print(json.dumps({"benchmark": "served_overhead", "n": args.n, "policies": rows, "c8_rps": c8, "bars": bars}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
