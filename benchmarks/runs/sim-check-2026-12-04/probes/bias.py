"""Per load, over saved sim_check runs re-simulated by the code on PYTHONPATH: the mean error (bias)
and mean absolute error of the simulated throughput and p50, with the canary's correction and at the
profile's speed (runs without a canary: the same). 0.19 cores assumed for runs 25-34, as count.py.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-04/probes/bias.py benchmarks/runs/sim-check-2026-12-0*/run*
"""
import json
import statistics
import subprocess
import sys

errs: dict[tuple[str, str], list[tuple[float, float]]] = {}
for r in sys.argv[1:]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.sim_check", "--resimulate", r, "--others-cores", "0.19"],
                         capture_output=True, text=True).stdout
    for p in json.loads(out.strip().splitlines()[-1])["points"]:
        load = f"closed {p['load']}" if p["kind"] == "closed" else "open"
        e = (p["simulated_rps"] / p["measured_rps"] - 1, p["simulated_p50_ms"] / p["measured_p50_ms"] - 1)
        errs.setdefault((load, "canary"), []).append(e)
        errs.setdefault((load, "speed0"), []).append(tuple(p["profile_speed_errors"]) if p.get("profile_speed_errors") else e)
print(f"{len(sys.argv) - 1} runs; per load: throughput bias / mean |error|, p50 bias / mean |error|, figures within ±25 %")
for (load, key), es in sorted(errs.items()):
    t, q = [e[0] for e in es], [e[1] for e in es]
    within = sum(abs(x) <= 0.25 for e in es for x in e)
    print(f"{load:<10} {key:<7} rps {statistics.mean(t):+.1%} / {statistics.mean(map(abs, t)):.1%}   "
          f"p50 {statistics.mean(q):+.1%} / {statistics.mean(map(abs, q)):.1%}   {within} of {2 * len(es)}")
