"""Repeatability of the real app's figures: loads c1,c4,c16,open0.9 interleaved, R rounds."""
import asyncio, json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.client import LocalApps, ROOT
from benchmarks.machine_speed import Canary
from benchmarks.sim_check import bodies, closed_loop, open_loop

dur = float(sys.argv[1]); rounds = int(sys.argv[2])
items = bodies(400, seed=11)
rows = []
with LocalApps() as app, Canary(checkpoint=str(ROOT / "tandem" / "trained" / "small")) as canary:
    asyncio.run(closed_loop(app.url, items, 4, 10))
    rate = None
    for r in range(rounds):
        for kind, load in [("closed", 1), ("closed", 4), ("closed", 16), ("open", None)]:
            t0 = time.monotonic()
            if kind == "closed":
                m = asyncio.run(closed_loop(app.url, items, load, dur))
                if load == 16 and rate is None:
                    rate = round(0.9 * m["throughput_rps"], 2)
            else:
                load = rate
                m = asyncio.run(open_loop(app.url, items, rate, dur, seed=3))
            t1 = time.monotonic()
            row = {"round": r, "kind": kind, "load": load, "tput": m["throughput_rps"], "p50": m["p50_ms"],
                   "p95": m["p95_ms"], "statuses": m["statuses"], "canary": canary.mean_ms(t0, t1),
                   "transfer": m["workload"]["transfer_rate"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
json.dump(rows, open("/tmp/probe/repeat.json", "w"))
