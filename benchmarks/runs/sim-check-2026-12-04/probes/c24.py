import asyncio, collections, json, os, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import httpx
from benchmarks.client import LocalApps
from benchmarks.sim_check import bodies
items = bodies(200, seed=11)
async def main(url, c, dur):
    bodies503 = collections.Counter(); st = collections.Counter()
    start = time.monotonic(); ctr = iter(range(10**9))
    async def client(http):
        while time.monotonic() - start < dur:
            r = await http.post(f"{url}/v1/chat/completions", json=items[next(ctr) % len(items)])
            st[r.status_code] += 1
            if r.status_code == 503:
                bodies503[r.text[:150]] += 1
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=c)) as http:
        await asyncio.gather(*(client(http) for _ in range(c)))
    print(c, dict(st)); [print("  ", n, b) for b, n in bodies503.most_common(5)]
with LocalApps() as app:
    asyncio.run(main(app.url, 4, 5))
    asyncio.run(main(app.url, 20, 20))
    asyncio.run(main(app.url, 24, 20))
