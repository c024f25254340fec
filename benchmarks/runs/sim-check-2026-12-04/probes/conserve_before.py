"""The simulator as it was before session 33 (git 23aebb4:benchmarks/simulate.py, each activity's
slowdown fixed when it started) against itself: the CPU work at the profile's speed it got done per
simulated second on a saved run's load, against the cores the app had. Unslowed work: the model
loops' (`model_ms`), and each overhead or side activity's seconds divided by the slowdown it was
given as it started.

    git show 23aebb4:benchmarks/simulate.py > /tmp/simulate_before.py
    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-04/probes/conserve_before.py /tmp/simulate_before.py \
        benchmarks/runs/sim-check-2026-12-04/run64 2
"""
import importlib.util
import json
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("simulate_before", sys.argv[1])
S = importlib.util.module_from_spec(spec)
sys.modules["simulate_before"] = S
spec.loader.exec_module(S)
from benchmarks.sim_check import run_settings  # noqa: E402

run, which = Path(sys.argv[2]), int(sys.argv[3])
pd = json.loads((run / "profile.json").read_text())
saved = json.loads((run / "sim_check.json").read_text())
prof = S.Profile.from_dict(pd)
if pd["source"].get("steal"):
    prof = prof.scaled({k: 1 - pd["source"]["steal"] for k in ("router", "vision", "small", "large")})
base = min((p for p in saved["points"] if p["kind"] == "closed"), key=lambda p: p["load"])
wl = S.Workload.from_measured(base["measured"]["workload"])
pt = saved["points"][which]
cores = saved["host_cores"] * (1 - (pt["measured"].get("steal") or 0))
kw = {"concurrency": pt["load"]} if pt["kind"] == "closed" else {"arrivals": pt["measured"]["arrivals_s"]}

sim = S.Simulation(prof, wl, {}, run_settings(saved), host_cores=cores)
last = [1.0]
work = {"overhead": 0.0, "other": 0.0}
slowdown, overhead_slowdown, cpu_while = sim._slowdown, sim._overhead_slowdown, sim._cpu_while


def _slowdown(*a, **k):
    last[0] = slowdown(*a, **k)
    return last[0]


def _overhead_slowdown(*a, **k):
    last[0] = overhead_slowdown(*a, **k)
    return last[0]


def _cpu_while(delay_s, seconds, then, threaded=True):
    work["overhead" if threaded else "other"] += seconds / last[0]
    return cpu_while(delay_s, seconds, then, threaded)


sim._slowdown, sim._overhead_slowdown, sim._cpu_while = _slowdown, _overhead_slowdown, _cpu_while
r = sim.run(duration_s=60.0, **kw)
total = sim.model_ms / 1000 + work["overhead"] + work["other"]
print(f"{run.name} {pt['kind']} {pt['load']}: simulated {r['throughput_rps']} req/s (measured "
      f"{pt['measured']['throughput_rps']}); work at the profile's speed {total / sim.env.now:.3f} cores' worth a second "
      f"on {sim.host_cores:.3f} app cores = {total / sim.env.now / sim.host_cores:.2f}x "
      f"(model {sim.model_ms / 1000 / sim.env.now:.3f}, overheads {work['overhead'] / sim.env.now:.3f}, "
      f"beside {work['other'] / sim.env.now:.3f})")
