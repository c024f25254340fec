"""Saved runs re-simulated with every load at a speed predicted from one of the canary's units, fitted
on runs 44-93 against the speed each load's own CPU says it ran at (`speeds.py ... sim-cpu` prints
the fits): `UNIT:A:B[:const]` runs all the app's CPU work at exp(A) x (the unit's slowdown)^B, per
2 s window, or (`const`) at the load's mean slowdown throughout. Counts the runs meeting the whole
bar and the figures within, runs 44-93 / 94- / all.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/predicted.py 94 115 py:0:0.73 torch:-0.081:0.88 torch:-0.081:0.88:const
    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-05/probes/predicted.py 44 93 py:0:0.73 torch:-0.081:0.88

(outputs: predicted-94-115.out, predicted-44-93.out; `py:0:0.73` is the check as shipped.)
"""
import contextlib
import io
import json
import math
import sys
from pathlib import Path

import benchmarks.sim_check as sc
from benchmarks.simulate import Profile, Simulation, Workload

RUNS = Path(__file__).resolve().parents[2]

def main(lo, hi, models):
    res = {m: {} for m in models}
    for d in sorted((d for d in RUNS.glob("sim-check-*/run*") if lo <= int(d.name[3:]) <= hi), key=lambda d: int(d.name[3:])):
        pd = json.loads((d / "profile.json").read_text()); saved = json.loads((d / "sim_check.json").read_text())
        profile = Profile.from_dict(pd)
        st = pd["source"].get("steal") or 0.0
        if st:
            profile = profile.scaled({k: 1 - st for k in ("router", "vision", "small", "large")})
        settings = sc.run_settings(saved)
        pts = saved["points"]
        base = min((p for p in pts if p["kind"] == "closed"), key=lambda p: p["load"])
        workload = Workload.from_measured(base["measured"]["workload"])
        line = []
        for mdl in models:
            unit, a, b, *const = mdl.split(":")
            a, b = float(a), float(b)
            figs, ok = 0, True
            for pt in pts:
                m = pt["measured"]
                cores = saved["host_cores"] * (1 - (m.get("steal") or 0.0))
                w = sc.machine_slower(pd, m, unit)
                if const and w:
                    w = [sum(w) / len(w)]
                slow = [math.exp(a) * x ** b for x in w] if w else [math.exp(a)]
                kw = {"concurrency": pt["load"]} if pt["kind"] == "closed" else {"arrivals": m["arrivals_s"]}
                with contextlib.redirect_stdout(io.StringIO()):
                    s = Simulation(profile, workload, {"Router": 1, "VisionEncoder": 1, "SmallReasoner": 1, "LargeAnswerer": 1},
                                   settings, host_cores=cores, seed=0, slower=slow, slower_step_s=sc.CANARY_STEP_S).run(duration_s=60.0, **kw)
                te = s["throughput_rps"] / m["throughput_rps"] - 1; pe = s["p50_ms"] / m["p50_ms"] - 1
                figs += (abs(te) <= .25) + (abs(pe) <= .25); ok &= abs(te) <= .25 and abs(pe) <= .25
            res[mdl][int(d.name[3:])] = figs
            line.append(figs)
        print(d.name, line, flush=True)
    for mdl in models:
        cells = []
        for a, b in ((44, 93), (94, hi), (lo, hi)):
            f = [v for n, v in res[mdl].items() if a <= n <= b]
            cells.append(f"{sum(x == 8 for x in f)}/{len(f)} ({sum(f)}/{8*len(f)})")
        print(f"{mdl:<22}", *(f"{c:>18}" for c in cells))

main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
