"""The processor-sharing simulator against itself: the CPU work at the profile's speed it got done per
simulated second on a saved run's load (argument 2: the point's index, 2 = concurrency 16), by class
as charged and as its cores delivered it, against the app's cores.

    PYTHONPATH=. python benchmarks/runs/sim-check-2026-12-04/probes/conserve.py benchmarks/runs/sim-check-2026-12-04/run64 2
"""
import json, sys, time
from pathlib import Path
import benchmarks.simulate as S
from benchmarks.sim_check import run_settings, machine_slower, CANARY_STEP_S
from benchmarks.simulate import Profile, Workload, Simulation, app_cores

run = Path(sys.argv[1]); which = int(sys.argv[2]) if len(sys.argv) > 2 else 2
pd = json.loads((run / "profile.json").read_text()); saved = json.loads((run / "sim_check.json").read_text())
prof = Profile.from_dict(pd)
st = pd["source"].get("steal") or 0
if st: prof = prof.scaled({k: 1 - st for k in ("router", "vision", "small", "large")})
base = min((p for p in saved["points"] if p["kind"] == "closed"), key=lambda p: p["load"])
wl = Workload.from_measured(base["measured"]["workload"])
settings = run_settings(saved)
pt = saved["points"][which]
cores = saved["host_cores"] * (1 - (pt["measured"].get("steal") or 0))
work = {}
orig = S._Cores.run
def run_(self, w, cls, done):
    if self.sim is sim:
        work[cls] = work.get(cls, 0.0) + w
    return orig(self, w, cls, done)
S._Cores.run = run_
work.clear()
sim = None
kw = {"concurrency": pt["load"]} if pt["kind"] == "closed" else {"arrivals": pt["measured"]["arrivals_s"]}
sim = Simulation(prof, wl, {}, settings, host_cores=cores)
sim._unaccounted = sim._unaccounted_cpu_s(); Simulation._unaccounted_cpu_s = lambda self, v=sim._unaccounted: v
t = time.perf_counter(); r = sim.run(duration_s=60.0, **kw); wall = time.perf_counter() - t
n = len(sim.latencies)
print(f"rps={r['throughput_rps']} measured {pt['measured']['throughput_rps']} p50 {r['p50_ms']} measured {pt['measured']['p50_ms']} requests={n} app_cores={app_cores(cores, prof):.3f} work/s total {sum(work.values())/sim.env.now:.3f} "
      + " ".join(f"{k} {v/n*1000:.1f}ms/req" for k, v in work.items()) + f" wall {wall:.1f}s")
# integral of delivered work
S._Cores.run = orig
acc = {"w": 0.0}
orig_adv = S._Cores._advance
def adv(self):
    dt = self.env.now - self.last
    if dt > 0 and self.sim is sim:
        acc["w"] += dt * sum(self.count(c) * self.rate[c] for c in self.CLASSES)
    return orig_adv(self)
S._Cores._advance = adv
sim = Simulation(prof, wl, {}, settings, host_cores=cores)
r = sim.run(duration_s=60.0, **kw)
print("delivered work/s", acc["w"] / sim.env.now, "cores", sim.cores.cores, "final counts", {c: sim.cores.count(c) for c in sim.cores.CLASSES})
