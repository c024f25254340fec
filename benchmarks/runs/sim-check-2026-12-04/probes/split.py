"""Per-process CPU per answered request: closed c=16 then open loop at 0.9x, same app."""
import asyncio, json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import psutil
from benchmarks.client import LocalApps
from benchmarks.cpu_per_request import app_processes, cpu_seconds
from benchmarks.sim_check import bodies, closed_loop, open_loop

dur = float(sys.argv[1]) if len(sys.argv) > 1 else 60
items = bodies(400, seed=11)
with LocalApps() as app:
    procs = app_processes()
    # all other processes too (raylet, gcs, ...)
    def snap():
        d = cpu_seconds(procs)
        other = 0.0
        pids = {p.pid for p in procs.values()}
        for p in psutil.process_iter():
            if p.pid in pids: continue
            try: other += sum(p.cpu_times()[:2])
            except Exception: pass
        d["others"] = other
        return d
    asyncio.run(closed_loop(app.url, items, 4, 10))
    def run(name, coro):
        b, t = snap(), time.monotonic()
        m = asyncio.run(coro)
        a, w = snap(), time.monotonic() - t
        n = max(1, m["answered"])
        per = {k: round((a[k] - b[k]) / n * 1000, 1) for k in b}
        cores = {k: round((a[k] - b[k]) / w, 3) for k in b}
        print(name, "tput", m["throughput_rps"], "p50", m["p50_ms"], "answered", m["answered"], "statuses", m["statuses"], flush=True)
        print("  ms/answered", per, "sum", round(sum(per.values()), 1), flush=True)
        print("  cores", cores, "sum", round(sum(cores.values()), 3), flush=True)
        return m
    m = run("closed16", closed_loop(app.url, items, 16, dur))
    for frac in [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0.9").split(",")]:
        rate = round(frac * m["throughput_rps"], 2)
        run(f"open{frac}@{rate}", open_loop(app.url, items, rate, dur, seed=3))
