import asyncio, collections, json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import httpx
from benchmarks.client import LocalApps, poisson_sends
from benchmarks.sim_check import bodies, closed_loop
items = bodies(400, seed=11)
def kind(t):
    if "this server is answering" in t: return "router-admission"
    if "Request dropped due to backpressure" in t: return "proxy-queue:" + t[t.find("("):][:60]
    if "at capacity" in t: return "downstream"
    return t[:80]
async def open_(url, rate, dur, seed):
    st = collections.Counter(); tasks = []; start = time.monotonic(); done = [0]
    async def one(http, b):
        r = await http.post(f"{url}/v1/chat/completions", json=b)
        if r.status_code == 503: st[kind(r.text)] += 1
        else: st[r.status_code] += 1
        if r.status_code == 200 and time.monotonic() - start < dur: done[0] += 1
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1000)) as http:
        async for _ in poisson_sends(rate, seed, dur):
            tasks.append(asyncio.ensure_future(one(http, items[len(tasks) % len(items)])))
        await asyncio.gather(*tasks)
    print(f"open {rate}: sent {len(tasks)} done-in-window/s {done[0]/dur:.2f}", dict(st), flush=True)
with LocalApps() as app:
    asyncio.run(closed_loop(app.url, items, 4, 10))
    for r in range(2):
        m = asyncio.run(closed_loop(app.url, items, 16, 30))
        print("c16", m["throughput_rps"], flush=True)
        for f in (0.9, 1.1):
            asyncio.run(open_(app.url, round(f * m["throughput_rps"], 2), 40, 3 + r))
