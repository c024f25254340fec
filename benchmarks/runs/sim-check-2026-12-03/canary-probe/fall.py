"""Probe (session 30; kept as run, bar the output paths): alternate closed c=16 and open loops at a fraction of it; per-process CPU, 503s, a timeline
of in-flight and completions, and a machine-speed canary, to tell the open loop's fall apart."""
import asyncio, json, os, subprocess, sys, time
from pathlib import Path
import httpx
from benchmarks.client import LocalApps, poisson_sends
from benchmarks.cpu_per_request import app_processes, cpu_seconds, machine_busy_s
from benchmarks.sim_check import bodies, closed_loop, _post

N = int(sys.argv[1]) if len(sys.argv) > 1 else 4
FRACS = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0.9").split(",")]
HERE = Path(__file__).resolve().parent
OUT = Path("results") / "fall.jsonl"  # and results/canary.jsonl; run from the repository root
OUT.parent.mkdir(exist_ok=True)

async def open_tl(url, items, rate, duration_s, seed=3):
    start = time.monotonic(); state = {"inflight": 0}; tl = []; recs = []
    async def one(body):
        state["inflight"] += 1
        try:
            r = await _post(http, url, body)
        finally:
            state["inflight"] -= 1
        recs.append((r[0], r[2] - start, r[1]))
    async def sampler():
        while True:
            tl.append((round(time.monotonic() - start, 2), state["inflight"]))
            await asyncio.sleep(0.25)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1000)) as http:
        s = asyncio.ensure_future(sampler()); tasks = []
        async for _ in poisson_sends(rate, seed, duration_s):
            tasks.append(asyncio.ensure_future(one(items[len(tasks) % len(items)])))
        await asyncio.gather(*tasks); s.cancel()
    return recs, tl

def measure(procs, coro):
    b, mb, t = cpu_seconds(procs), machine_busy_s(), time.monotonic()
    r = asyncio.run(coro)
    a, ma, w = cpu_seconds(procs), machine_busy_s(), time.monotonic() - t
    cpu = {k: round(a[k] - b[k], 2) for k in b}
    return r, cpu, round(ma - mb, 2), w, t

with LocalApps() as app:
    items = bodies(400, seed=11)
    procs = app_processes()
    canary = subprocess.Popen([sys.executable, str(HERE / "canary.py"), str(OUT.parent / "canary.jsonl")])
    out = open(OUT, "w")
    try:
        asyncio.run(closed_loop(app.url, items, 16, 15))
        for i in range(N):
            m, cpu, mbusy, w, t0 = measure(procs, closed_loop(app.url, items, 16, 30))
            ans = m["answered"]
            rec = {"i": i, "kind": "closed", "t0": t0, "wall": w, "rps": m["throughput_rps"], "p50": m["p50_ms"],
                   "answered": ans, "cpu": cpu, "machine": mbusy, "statuses": m["statuses"],
                   "cpu_per_ans": {k: round(v / ans * 1000, 1) for k, v in cpu.items()}}
            print(json.dumps(rec), flush=True); out.write(json.dumps(rec) + "\n")
            frac = FRACS[i % len(FRACS)]
            rate = round(frac * m["throughput_rps"], 2)
            (recs, tl), cpu, mbusy, w, t0 = measure(procs, open_tl(app.url, items, rate, 40))
            ok = [r for r in recs if r[0] == 200]
            st = {}
            for r in recs: st[str(r[0])] = st.get(str(r[0]), 0) + 1
            lat = sorted(r[2] for r in ok)
            rec = {"i": i, "kind": "open", "frac": frac, "rate": rate, "t0": t0, "wall": w, "answered": len(ok), "statuses": st,
                   "rps": round(sum(1 for r in ok if 4 <= r[1] < 40) / 36, 2), "p50": lat[len(lat)//2] if lat else None,
                   "cpu": cpu, "machine": mbusy, "cpu_per_ans": {k: round(v / len(ok) * 1000, 1) for k, v in cpu.items()},
                   "timeline": tl, "done": [(round(r[1], 2), r[0]) for r in recs]}
            print(json.dumps({k: v for k, v in rec.items() if k not in ("timeline", "done")}), flush=True)
            out.write(json.dumps(rec) + "\n"); out.flush()
    finally:
        canary.kill()
