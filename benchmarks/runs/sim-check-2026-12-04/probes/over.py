"""Is capacity lower at 24 in flight (closed) or under overload (open 1.1x)? canary-normalised, per-process CPU."""
import asyncio, json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import psutil
from benchmarks.client import LocalApps, ROOT
from benchmarks.machine_speed import Canary
from benchmarks.cpu_per_request import app_processes, cpu_seconds
from benchmarks.sim_check import bodies, closed_loop, open_loop

dur = float(sys.argv[1]); rounds = int(sys.argv[2])
items = bodies(400, seed=11)
with LocalApps() as app, Canary(checkpoint=str(ROOT / "tandem" / "trained" / "small")) as canary:
    procs = app_processes()
    asyncio.run(closed_loop(app.url, items, 4, 10))
    rate = None
    for r in range(rounds):
        for kind, load in [("closed", 16), ("closed", 24), ("open", 1.1)]:
            b, t0 = cpu_seconds(procs), time.monotonic()
            if kind == "closed":
                m = asyncio.run(closed_loop(app.url, items, load, dur))
                if load == 16 and rate is None:
                    rate = round(1.1 * m["throughput_rps"], 2)
            else:
                load = rate
                m = asyncio.run(open_loop(app.url, items, rate, dur, seed=3 + r))
            a, t1 = cpu_seconds(procs), time.monotonic()
            n = max(1, m["answered"])
            c = canary.mean_ms(t0, t1)
            row = {"round": r, "kind": kind, "load": load, "tput": m["throughput_rps"], "norm": round(m["throughput_rps"] * c, 1),
                   "p50": m["p50_ms"], "statuses": m["statuses"], "canary": c,
                   "ms": {k: round((a[k] - b[k]) / n * 1000, 1) for k in b},
                   "cores": round(sum(a[k] - b[k] for k in b) / (t1 - t0), 3)}
            row["ms_sum"] = round(sum(row["ms"].values()), 1)
            print(json.dumps(row), flush=True)
