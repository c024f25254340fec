"""c16 then open at F x that c16, R rounds, canary-normalised. Config = serve_config.yaml as is."""
import asyncio, json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.client import LocalApps, ROOT
from benchmarks.machine_speed import Canary
from benchmarks.sim_check import bodies, closed_loop, open_loop
tag, rounds, frac, dur = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
items = bodies(400, seed=11)
with LocalApps() as app, Canary(checkpoint=str(ROOT / "tandem" / "trained" / "small")) as canary:
    asyncio.run(closed_loop(app.url, items, 4, 10))
    for r in range(rounds):
        t0 = time.monotonic(); m = asyncio.run(closed_loop(app.url, items, 16, dur)); t1 = time.monotonic()
        c16, k16 = m["throughput_rps"], canary.mean_ms(t0, t1)
        rate = round(frac * c16, 2)
        t0 = time.monotonic(); o = asyncio.run(open_loop(app.url, items, rate, dur, seed=5 + r)); t1 = time.monotonic()
        ko = canary.mean_ms(t0, t1)
        print(json.dumps({"tag": tag, "round": r, "c16": c16, "c16_p50": m["p50_ms"], "k16": k16, "n16": round(c16 * k16, 1),
                          "rate": rate, "open": o["throughput_rps"], "open_p50": o["p50_ms"], "ko": ko,
                          "nopen": round(o["throughput_rps"] * ko, 1), "ratio": round(o["throughput_rps"] * ko / (c16 * k16), 3),
                          "statuses": o["statuses"]}), flush=True)
