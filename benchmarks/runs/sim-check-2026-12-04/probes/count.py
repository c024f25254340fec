"""Figures within ±25 % over saved sim_check runs, re-simulated by the code on PYTHONPATH: with the
canary's correction as sim_check applies it, and at the profile's speed (runs without a canary: the
same). Runs 25-34 did not measure what Ray's own processes kept busy: 0.19 cores assumed, as before.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-04/probes/count.py benchmarks/runs/sim-check-2026-12-0*/run*
"""
import json
import subprocess
import sys

tot = {"canary": [0, 0, 0], "speed0": [0, 0, 0]}  # figures within, whole-bar runs, runs
rows = {"canary": [], "speed0": []}
for r in sorted(sys.argv[1:], key=lambda p: int(p.rstrip("/").rsplit("run", 1)[1])):
    out = subprocess.run([sys.executable, "-m", "benchmarks.sim_check", "--resimulate", r, "--others-cores", "0.19"],
                         capture_output=True, text=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    for key in tot:
        n = 0
        for p in d["points"]:
            errs = (p["simulated_rps"] / p["measured_rps"] - 1, p["simulated_p50_ms"] / p["measured_p50_ms"] - 1)
            if key == "speed0" and p.get("profile_speed_errors"):
                errs = p["profile_speed_errors"]
            n += sum(abs(x) <= 0.25 for x in errs)
        tot[key][0] += n
        tot[key][1] += n == 8
        tot[key][2] += 1
        rows[key].append(f"{r.rstrip('/').rsplit('/', 1)[1]}:{n}")
for key, (f, w, n) in tot.items():
    print(key, " ".join(rows[key]))
    print(f"{key}: {f} of {8 * n} figures, the whole bar in {w} of {n} runs")
